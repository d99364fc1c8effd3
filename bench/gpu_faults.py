"""The fault and interop sections of bench/gpu_check.py, on one GPU (a CPU
dry run where one makes sense):

- capture: a hocc call inside torch.cuda.graph raises hocc's HoccError before
  anything is enqueued (the engine's call count and the tensor unchanged), and
  the stream stays usable: a graph captured with a torch op replays right,
  and the next hocc call is right. GPU only.
- cupy: CuPy arrays (NumPy on the CPU) through the drop-in calls on a world of
  one, zero-copy (results in the caller's array), on CuPy's current stream;
  a non-contiguous array is refused.
- async_work: an async call's Work on CUDA, as ProcessGroupNCCL's: not
  completed while its stream is busy, wait() orders the caller's current
  stream after it without blocking the host, a then() continuation and a
  torch future's callback run after the call; calls made from two streams
  in turn each get their own result (on the CPU: async calls end in call
  order, and the continuation and callback see the results).
- absent: 8 in-process ranks on the device, one never joins: the others raise
  within timeout + 10 s naming it, and the next run is right; and, in a
  process of its own (absent_pg, started by gpu_check.py), rank 0 of a 2-rank
  ProcessGroupNCCL (gloo on the CPU) whose rank 1 never comes, timeout 5 s:
  what torch does, recorded either way; ok only if it raised within 35 s.
Each check returns a dict with "ok" and "summary"; note() leaves a partial
result behind for gpu_check.py, so a section that crashes or hangs still
says how far it got."""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

import hocc
from hocc.engine.group_engines import find_engine
from hocc.executor.inproc import InProcWorld
from hocc.plan.planner import PlannerConfig, make_plan
from hocc.topology import parse_spec

SLACK_S = 10.0  # the in-process bound: every surviving rank raises within timeout + 10 s
PG_TIMEOUT_S = 5.0  # absent_pg: the process group's timeout
PG_SLACK_S = 30.0  # ... and how much later than it torch must have raised

PROGRESS: Path | None = None  # where note() leaves the running section's partial result


def note(**partial: Any) -> None:
    """Record how far the running section got (merged into what was noted before)."""
    if PROGRESS is None:
        return
    old = json.loads(PROGRESS.read_text()) if PROGRESS.exists() else {}
    tmp = PROGRESS.with_suffix(".tmp")
    tmp.write_text(json.dumps({**old, **partial}, default=str))
    tmp.replace(PROGRESS)


def is_cuda(device: str) -> bool:
    return device != "cpu"


@contextlib.contextmanager
def world_of_one(device: str) -> Iterator[dist.ProcessGroup]:
    """The default group, one rank in this process: NCCL on the GPU, gloo on the CPU."""
    if is_cuda(device):
        torch.cuda.set_device(torch.device(device))
    backend = "nccl" if is_cuda(device) else "gloo"
    dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timedelta(seconds=60))
    try:
        yield dist.group.WORLD
    finally:
        hocc.reset_engines()
        dist.destroy_process_group()


_CYCLES_PER_S: list[float] = []


def spin(seconds: float) -> None:
    """Keep the current stream busy for about `seconds`, without waiting here (torch.cuda._sleep counts
    clock cycles; the first call measures how many a second has, synchronising the device)."""
    if not _CYCLES_PER_S:
        torch.cuda.synchronize()
        start = time.perf_counter()
        torch.cuda._sleep(50_000_000)
        torch.cuda.synchronize()
        _CYCLES_PER_S.append(50_000_000 / (time.perf_counter() - start))
    torch.cuda._sleep(int(seconds * _CYCLES_PER_S[0]))


# -- absent --------------------------------------------------------------------------------------
def check_inproc_absent(device: str, timeout_s: float = 2.0) -> dict:
    world, n = 8, 1031
    w = InProcWorld(world, device, timeout_s=timeout_s)
    plan = make_plan("all_reduce", n, 4, parse_spec("2x4"), "ho_ring", PlannerConfig(chunks=2, min_chunk_bytes=1))
    cases = []
    for absent in (0, 5):
        note(stage=f"in-process world, rank {absent} absent")
        xs = [torch.full((n,), float(r + 1), device=device) for r in range(world)]
        start = time.perf_counter()
        message = ""
        try:
            w.run(plan, xs, xs, "sum", absent_rank=absent)
        except RuntimeError as e:
            message = str(e)
        secs = time.perf_counter() - start
        named = re.search(r"rank (\d+) never answered", message)
        names_it = named is not None and int(named.group(1)) == absent
        ys = [torch.full((n,), float(r + 1), device=device) for r in range(world)]
        w.run(plan, ys, ys, "sum")
        after = all(bool((y == world * (world + 1) / 2).all()) for y in ys)
        ok = bool(message) and secs < timeout_s + SLACK_S and names_it and after
        cases.append({"absent": absent, "raised": bool(message), "seconds": secs, "message": message[:400],
                      "names_it": names_it, "next_run_right": after, "ok": ok})
        print(f"absent: in-process {device}, rank {absent} absent -> "
              f"{f'raised after {secs:.1f} s' if message else 'did not raise'} "
              f"({'names it' if names_it else 'DOES NOT name it'}); next run {'right' if after else 'WRONG'}",
              flush=True)
    return {"timeout_s": timeout_s, "cases": cases, "ok": all(c["ok"] for c in cases)}


def absent_pg(device: str, store_dir: str) -> dict:
    """Run in a process of its own (gpu_check.py --child absent_pg): rank 0 of a 2-rank group whose
    rank 1 never comes, calling torch's all_reduce, or hocc's (HOCC_ABSENT_CALL=hocc) on the same kind
    of group. Notes each phase first, so a kill still says where it hung."""
    backend = "nccl" if is_cuda(device) else "gloo"
    by_hocc = os.environ.get("HOCC_ABSENT_CALL") == "hocc"
    if by_hocc:
        backend = f"hocc.all_reduce on {backend}"
    env = {k: v for k, v in os.environ.items() if k.startswith(("TORCH_NCCL", "NCCL_"))}
    note(backend=backend, env=env, timeout_s=PG_TIMEOUT_S, phase="init_process_group", started=time.time())
    if is_cuda(device):
        torch.cuda.set_device(torch.device(device))
        torch.cuda.synchronize()  # the CUDA context exists before the clock starts
    store = dist.FileStore(str(Path(store_dir) / "store"), 2)
    start = time.perf_counter()
    phase = "init_process_group"
    try:
        dist.init_process_group("nccl" if is_cuda(device) else "gloo", store=store, rank=0, world_size=2,
                                timeout=timedelta(seconds=PG_TIMEOUT_S))
        phase = "all_reduce"
        note(phase=phase, init_s=time.perf_counter() - start)
        x = torch.ones(4, device=device)
        if by_hocc:
            hocc.all_reduce(x)
        else:
            dist.all_reduce(x)
        if is_cuda(device):
            phase = "synchronize"
            note(phase=phase, enqueued_s=time.perf_counter() - start)
            torch.cuda.synchronize()
        secs = time.perf_counter() - start
        note(phase="returned", seconds=secs)
        return {"outcome": "returned", "phase": phase, "seconds": secs, "ok": False,
                "summary": f"{backend}: returned without error after {secs:.1f} s, though rank 1 never came"}
    except Exception as e:  # noqa: BLE001 - what torch raises is the finding
        secs = time.perf_counter() - start
        ok = secs <= PG_TIMEOUT_S + PG_SLACK_S
        return {"outcome": "raised", "phase": phase, "seconds": secs, "error": f"{type(e).__name__}: {e}"[:1500],
                "ok": ok, "summary": f"{backend}: {phase} raised {type(e).__name__} after {secs:.1f} s"}


# -- cupy ----------------------------------------------------------------------------------------
def check_arrays(device: str) -> dict:
    """CuPy arrays on the GPU (NumPy on the CPU) through the drop-in calls, on the library's stream."""
    if device == "cpu":
        import numpy as xp
    else:
        try:
            import cupy as xp
        except ImportError as e:
            return {"ok": False, "summary": f"cupy is not installed here ({e})"}
    n, results = 1031, {}
    with world_of_one(device), _array_stream(xp, device) as stream:
        a = xp.arange(n, dtype=xp.float32)
        out = xp.zeros(n, dtype=xp.float32)
        hocc.all_gather_into_tensor(out, a)  # a world of one: out becomes a, in the caller's array
        b = a.copy()
        hocc.all_reduce(b, op=hocc.ReduceOp.AVG)
        rs = xp.zeros(n, dtype=xp.float32)
        work = hocc.reduce_scatter_tensor(rs, a * 2, async_op=True, algo="ho_ring")
        assert work is not None
        work.wait()
        _sync(stream)
        results["all_gather_in_caller_array"] = bool((out == a).all())
        results["all_reduce_avg"] = bool((b == a).all())
        results["reduce_scatter_async"] = bool((rs == a * 2).all())
        if device != "cpu":  # ordered on CuPy's stream: busy it, call, and torch's own stream stays idle
            torch.cuda.synchronize()
            c = xp.ones(n, dtype=xp.float32)
            with torch.cuda.stream(torch.cuda.ExternalStream(stream.ptr)):
                spin(0.3)
            c *= 3  # on CuPy's stream, after the spin
            got = xp.zeros(n, dtype=xp.float32)
            hocc.all_gather_into_tensor(got, c)
            results["torch_default_stream_idle"] = bool(torch.cuda.default_stream().query())
            results["cupy_stream_busy"] = not stream.done
            stream.synchronize()
            results["ordered_after_callers_work"] = bool((got == 3).all())
        try:
            hocc.all_reduce(xp.zeros(2 * n, dtype=xp.float32)[::2])
            results["non_contiguous_refused"] = False
        except hocc.HoccError as e:
            results["non_contiguous_refused"] = "non-contiguous" in str(e)
    wrong = [k for k, v in results.items() if not v]
    print(f"cupy ({xp.__name__}): {results}", flush=True)
    return {"library": xp.__name__, **results, "ok": not wrong,
            "summary": f"{xp.__name__}: {len(results) - len(wrong)} of {len(results)} checks right"
                       + (f"; wrong: {', '.join(wrong)}" if wrong else "")}


@contextlib.contextmanager
def _array_stream(xp: Any, device: str) -> Iterator[Any]:
    """A non-default CuPy stream made current (None for NumPy)."""
    if device == "cpu":
        yield None
        return
    stream = xp.cuda.Stream(non_blocking=True)
    with stream:
        yield stream


def _sync(stream: Any) -> None:
    if stream is not None:
        stream.synchronize()


# -- async_work ----------------------------------------------------------------------------------
def check_async_work(device: str) -> dict:
    return _async_work_cuda(device) if is_cuda(device) else _async_work_cpu()


def _async_work_cuda(device: str) -> dict:
    """An async call's Work on CUDA, as ProcessGroupNCCL's: not completed while its stream is busy,
    and wait() orders the *caller's current* stream after it without blocking the host."""
    with world_of_one(device):
        x = torch.ones(1 << 20, device=device)
        busy, other = torch.cuda.Stream(), torch.cuda.Stream()
        with torch.cuda.stream(busy):
            spin(1.0)  # the call's kernels queue behind a second of work
            work = hocc.all_reduce(x, algo="native", async_op=True)
        start = time.perf_counter()
        work.wait(timeout=30)  # the engine queued it; returns without waiting for the GPU
        host_wait_s = time.perf_counter() - start
        pending_while_busy = not work.is_completed()
        with torch.cuda.stream(other):
            work.wait()
            after = torch.cuda.Event()
            after.record(other)
        ordered = not after.query()  # `other` now waits for the call, so it is not done either
        torch.cuda.synchronize()
        # what runs after a call runs after its kernels, though the worker thread runs it: a then()
        # continuation (the list form's copy-out) and a torch future's callback (DDP's comm hooks)
        src, outs = torch.zeros(1 << 20, device=device), [torch.zeros(1 << 20, device=device)]
        with torch.cuda.stream(busy):
            spin(1.0)
            src.fill_(7.0)  # written behind the second of work: a copy-out run early copies zeros
            gathered = hocc.all_gather(outs, src, async_op=True)
            doubled = hocc.all_reduce(src, algo="ho_ring", async_op=True).get_future().then(
                lambda f: f.value()[0] * 2)
        gathered.wait(timeout=30)
        twice = doubled.wait()
        torch.cuda.synchronize()
        continuation = bool(torch.all(outs[0] == 7))
        callback = bool(torch.all(twice == 14))
        host_free = host_wait_s < 0.5
        streams_apart = _calls_from_two_streams(device)
        results = {"pending_while_busy": pending_while_busy, "wait_orders_other_stream": ordered,
                   "wait_does_not_block_host": host_free, "completed_after": work.is_completed(),
                   "result_right": bool(torch.all(x == 1)), "continuation_ordered": continuation,
                   "callback_ordered": callback, "two_streams_results_right": streams_apart}
    return _async_result(results, f"wait() took {host_wait_s * 1e3:.1f} ms of host time")


def _calls_from_two_streams(device: str) -> bool:
    """Calls made from two streams in turn, nothing synchronised between them, with plans that use a
    work buffer (ring, ho_ring): each call's result must be its own. A work buffer kept between calls
    and reused from another stream, with nothing ordering the streams, would mix them up."""
    streams = (torch.cuda.Stream(), torch.cuda.Stream())
    xs = [torch.full((1 << 18,), float(i), device=device) for i in range(40)]
    torch.cuda.synchronize()
    for i, x in enumerate(xs):
        with torch.cuda.stream(streams[i % 2]):
            if i % 8 == 0:
                spin(0.05)  # one stream now and then behind the other
            hocc.all_reduce(x, algo=("ring", "ho_ring")[(i // 2) % 2])
    torch.cuda.synchronize()
    wrong = [i for i, x in enumerate(xs) if not bool(torch.all(x == i))]
    print(f"async work: 40 calls from two streams in turn: {40 - len(wrong)} right"
          + (f"; wrong: calls {wrong[:10]}" if wrong else ""), flush=True)
    return not wrong


def _async_work_cpu() -> dict:
    """The CPU dry run: async calls complete in call order, wait() returns with the result in place,
    and a then() continuation (the list form) and a future's callback see the results."""
    with world_of_one("cpu"):
        xs = [torch.full((1031,), float(i)) for i in range(8)]
        works = [hocc.all_reduce(x, algo=("native", "ho_ring")[i % 2], async_op=True) for i, x in enumerate(xs)]
        last = works[-1]
        last.wait(timeout=30)
        in_order = all(w.is_completed() for w in works)  # one worker runs calls in order
        right = all(bool(torch.all(x == i)) for i, x in enumerate(xs))
        outs = [torch.zeros(1031)]
        gathered = hocc.all_gather(outs, torch.full((1031,), 7.0), async_op=True)
        doubled = hocc.all_reduce(torch.full((1031,), 7.0), async_op=True).get_future().then(
            lambda f: f.value()[0] * 2)
        gathered.wait(timeout=30)
        twice = doubled.wait()
        results = {"completed_in_call_order": in_order, "results_right": right,
                   "continuation_ordered": bool(torch.all(outs[0] == 7)),
                   "callback_ordered": bool(torch.all(twice == 14))}
    return _async_result(results, "CPU dry run")


def _async_result(results: dict, extra: str) -> dict:
    wrong = [k for k, v in results.items() if not v]
    print(f"async work: {results}; {extra}", flush=True)
    return {**results, "ok": not wrong, "summary": f"{len(results) - len(wrong)} of {len(results)} checks right"
            + (f"; wrong: {', '.join(wrong)}" if wrong else "") + f"; {extra}"}


# -- capture -------------------------------------------------------------------------------------
def check_capture(device: str) -> dict:
    results: dict = {}
    messages: dict = {}
    with world_of_one(device) as group:
        x = torch.ones(1 << 10, device=device)
        hocc.all_reduce(x)  # the engine exists before the capture
        torch.cuda.synchronize()
        engine = find_engine(group, x.device)
        calls = {
            "all_reduce": lambda y: hocc.all_reduce(y),
            "all_gather_into_tensor": lambda y: hocc.all_gather_into_tensor(torch.empty_like(y), y),
            "reduce_scatter_tensor": lambda y: hocc.reduce_scatter_tensor(torch.empty_like(y), y),
        }
        for name, call in calls.items():
            seq = engine.calls_made if engine is not None else None
            graph = torch.cuda.CUDAGraph()
            message = ""
            try:
                with torch.cuda.graph(graph):
                    y = x * 2
                    call(y)
            except hocc.HoccError as e:
                message = str(e)
            except RuntimeError as e:  # the capture itself broke: what the check is there to prevent
                message = f"UNCLEAR: {type(e).__name__}: {e}"
            refused = "captured into a CUDA graph" in message and "outside torch.cuda.graph" in message
            nothing_enqueued = engine is not None and engine.calls_made == seq
            results[f"{name}_refused"] = refused and nothing_enqueued
            messages[name] = message[:400]
        results["not_capturing_after"] = not torch.cuda.is_current_stream_capturing()
        # the stream is usable afterwards: capture and replay a torch op, then a hocc call
        graph2 = torch.cuda.CUDAGraph()
        z = torch.zeros(4, device=device)
        with torch.cuda.graph(graph2):
            z.add_(1)
        graph2.replay()
        graph2.replay()
        torch.cuda.synchronize()
        results["graph_replays_after"] = bool((z == 2).all())
        hocc.all_reduce(x, algo="ho_ring")
        torch.cuda.synchronize()
        results["hocc_call_right_after"] = bool((x == 1).all())
    wrong = [k for k, v in results.items() if not v]
    print(f"capture: {results}; message: {messages.get('all_reduce', '')[:300]}", flush=True)
    return {**results, "messages": messages, "ok": not wrong,
            "summary": f"{len(results) - len(wrong)} of {len(results)} checks right"
                       + (f"; wrong: {', '.join(wrong)}" if wrong else "")}
