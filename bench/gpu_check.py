"""What one lent GPU can check of hocc's CUDA path (run by bench/gpu_check.sh
after it built hocc._C). CUDA tensors take the CPU path: the same C++
executor, every step a collective of torch's ProcessGroupNCCL, copies and
reductions by torch's kernels (csrc/device/torch_device.cc). Sections:

- nccl_world1: an NCCL world of one: hocc's drop-in calls (all_reduce,
  all_gather_into_tensor, reduce_scatter_tensor) x algos x dtypes x ops x
  sizes, sync and async_op, against torch.distributed's own call (every group
  of a world of one has one member, so these run the executor and the device
  layer on CUDA, no NCCL step); then the c10d comm on NCCL directly
  (hocc._C.c10d_comm's collectives: NCCL's kernels on one member), empty
  tensors included, and one comm called again and again. A world > 1 over
  NCCL cannot run on one GPU: NCCL refuses two ranks on one device.
- inproc: 8 in-process ranks on the GPU (InProcWorld), topologies 2x4 and
  3+5, native / ring / ho_ring K=1 / ho_ring K=4 with ring reduce-scatter and
  all-gather, against a float64 reference.
- device_copy: the device layer's copy (hocc._C.reduce, op "copy") against a
  device-to-device cudaMemcpy, ok at >= 90% of its bandwidth; its sum
  reductions' bandwidth; its copy/sum/min/max/product right.
- capture, cupy, async_work, absent: bench/gpu_faults.py.
- memory: what hocc holds on the GPU after 200 mixed calls (1 KiB..64 MiB)
  against the same calls through torch.distributed alone; ok under 8 MiB (a
  small work buffer kept between calls; not anything the size of a call).

Every section runs in a process of its own under a time limit (shrunk to
what is left of --deadline), so a hang or a crash costs only its section and
its verdict says how far it got; it prints one `VERDICT <section>:
ok|FAIL|SKIP (...)` line, and the JSON summary is rewritten after each. The
absent section's 2-rank torch group (which may hang until killed) starts at
the beginning, beside the other sections, where the GPU's compute mode
allows more than one process. `--device cpu` is the dry run: gloo in
place of NCCL, InProcWorld on the CPU, NumPy in place of CuPy, CPU timings
without a bound; capture is skipped. `--only a,b` runs some sections.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gpu_faults
import torch
import torch.distributed as dist
from gpu_faults import (
    PG_SLACK_S,
    PG_TIMEOUT_S,
    absent_pg,
    check_arrays,
    check_async_work,
    check_capture,
    check_inproc_absent,
    is_cuda,
    note,
    spin,
    world_of_one,
)

import hocc
from hocc import executor as native
from hocc.engine.registry import find_engine
from hocc.executor.inproc import InProcWorld
from hocc.executor.plans import dtype_name
from hocc.plan.planner import PlannerConfig, make_plan
from hocc.topology import parse_spec

MIB = 1 << 20
HELD_BOUND = 8 * MIB  # memory: what hocc may hold after the calls (a small kept work buffer, not a call's size)
# name: (seconds allowed on the GPU, on the CPU dry run (0: not run there), what it checks)
SECTIONS: dict[str, tuple[int, int, str]] = {
    "nccl_world1": (90, 300, "drop-in calls and the c10d comm on an NCCL world of one"),
    "inproc": (90, 300, "8 in-process ranks on the device against a float64 reference"),
    "device_copy": (45, 120, "the device layer's copy against cudaMemcpy, its reductions"),
    "capture": (30, 0, "a hocc call in torch.cuda.graph is refused, the stream stays usable"),
    "cupy": (30, 60, "CuPy arrays through the drop-in calls on CuPy's stream"),
    "async_work": (30, 60, "async Work ordering on CUDA streams"),
    "absent": (30, 60, "a rank that never comes: in-process, and a 2-rank torch group"),
    "memory": (60, 180, "what hocc holds on the GPU after 200 calls, against torch alone"),
}
ABSENT_PG_LIMIT_S = PG_TIMEOUT_S + PG_SLACK_S + 5  # a 2-rank group's rank 0 is killed after this


# -- nccl_world1 ---------------------------------------------------------------------------------
ALGOS = ("native", "ring", "ho_ring", "auto")
W1_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.int32)
OPS = ("sum", "avg", "min", "max", "product")
REDUCE_OP = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.AVG, "min": dist.ReduceOp.MIN,
             "max": dist.ReduceOp.MAX, "product": dist.ReduceOp.PRODUCT}
COMM_OPS = ("sum", "min", "max", "product")  # the c10d comm's own (AVG is the executor's division)
# torch 2.13 renamed them (*_single); older torch has only the old names
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def sample(n: int, dtype: torch.dtype, device: str, gen: torch.Generator) -> torch.Tensor:
    if dtype.is_floating_point:
        return torch.randn(n, generator=gen, device=device).to(dtype)
    return torch.randint(-1000, 1000, (n,), generator=gen, device=device, dtype=dtype)


def torch_result(coll: str, x: torch.Tensor, op: str) -> torch.Tensor:
    """torch.distributed's own call on the default group (a world of one)."""
    if coll == "all_reduce":
        r = x.clone()
        dist.all_reduce(r, op=REDUCE_OP[op])
    elif coll == "all_gather":
        r = torch.empty_like(x)
        _all_gather(r, x)
    else:
        r = torch.empty_like(x)
        _reduce_scatter(r, x, op=REDUCE_OP[op])
    return r


def hocc_result(coll: str, x: torch.Tensor, op: str, algo: str, async_op: bool) -> torch.Tensor:
    """hocc's drop-in call (outputs start as a sentinel, so what is not written shows)."""
    if coll == "all_reduce":
        y = x.clone()
        w = hocc.all_reduce(y, op=REDUCE_OP[op], algo=algo, async_op=async_op)
    elif coll == "all_gather":
        y = torch.full_like(x, 77)
        w = hocc.all_gather_into_tensor(y, x, algo=algo, async_op=async_op)
    else:
        y = torch.full_like(x, 77)
        w = hocc.reduce_scatter_tensor(y, x, op=REDUCE_OP[op], algo=algo, async_op=async_op)
    if async_op:
        assert w is not None, "async_op=True returned no Work"
        w.wait()
    else:
        assert w is None, "a blocking call returned a Work"
    return y


def _diff(got: torch.Tensor, want: torch.Tensor) -> str:
    if got.shape != want.shape:
        return f"shape {tuple(got.shape)} vs {tuple(want.shape)}"
    bad = (got.double() - want.double()).abs()
    return f"{int((bad > 0).sum())} elements differ, max {float(bad.max()):.3g}" if bad.numel() else "?"


def check_world1(device: str) -> dict:
    sizes = (0, 1, 7, 1031, MIB + 3)
    gpu = is_cuda(device)
    gen = torch.Generator(device=device).manual_seed(0)
    backend = "nccl" if gpu else "gloo"
    print(f"nccl_world1: {backend} world of one on {device}. Not covered here: a world > 1 over NCCL (NCCL refuses "
          "two ranks on one GPU), so NCCL sub-group collectives and ring steps (send/recv) between ranks do "
          "not run in this check", flush=True)
    cases = wrong = refused = 0
    failures: list[str] = []
    groups: list[dict] = []
    with world_of_one(device) as group:
        for coll in ("all_reduce", "all_gather", "reduce_scatter"):
            for algo in ALGOS:
                for dtype in W1_DTYPES:
                    start, before, n_cases = time.perf_counter(), wrong, cases
                    note(stage=f"drop-in {coll} {algo} {dtype_name(dtype)}", cases=cases, wrong=wrong)
                    for op in (OPS if coll != "all_gather" else ("-",)):
                        if op == "avg" and not dtype.is_floating_point:
                            continue
                        for n in sizes:
                            x = sample(n, dtype, device, gen)
                            try:
                                want = torch_result(coll, x, op)
                            except Exception:  # noqa: BLE001 - torch refusing is recorded, not a failure
                                refused += 1
                                want = x  # a world of one: every collective returns the input
                            for async_op in (False, True):
                                cases += 1
                                what = f"{coll} {algo} {dtype_name(dtype)} {op} n={n}{' async' if async_op else ''}"
                                try:
                                    got = hocc_result(coll, x, op, algo, async_op)
                                    if not torch.equal(got, want):
                                        wrong += 1
                                        failures.append(f"{what}: {_diff(got, want)}")
                                except Exception as e:  # noqa: BLE001 - every case reports
                                    wrong += 1
                                    failures.append(f"{what}: {type(e).__name__}: {str(e)[:300]}")
                    secs = time.perf_counter() - start
                    groups.append({"collective": coll, "algo": algo, "dtype": dtype_name(dtype),
                                   "cases": cases - n_cases, "wrong": wrong - before, "seconds": secs})
                    print(f"nccl_world1 drop-in {coll:<14} {algo:<7} {dtype_name(dtype):<8}: {cases - n_cases:3d} "
                          f"cases, {wrong - before} wrong, {secs:.2f} s", flush=True)
        drop = f"drop-in: {cases - wrong} of {cases} right"
        if refused:
            drop += f" (torch refused {refused} reference calls: compared with the input)"
        note(stage="c10d comm", cases=cases, wrong=wrong, failures=failures[:20], summary=drop)
        comm = _check_comm(device, group, gen, drop)
    ok = wrong == 0 and comm["ok"]
    return {"backend": backend, "cases": cases, "wrong": wrong, "torch_refused": refused, "failures": failures[:50],
            "groups": groups, "comm": comm, "not_covered": "a world > 1 over NCCL (NCCL refuses two ranks on one GPU)",
            "ok": ok, "summary": f"{drop}; c10d comm on {backend}: {comm['summary']}", "exit_at_once": True}


# Comms made by _check_comm, never dropped (the process ends with os._exit): a comm whose scratch a
# binding call used names the binding's device, gone after the call, and dropping it frees through that.
_KEPT: list[Any] = []


def _check_comm(device: str, group: dist.ProcessGroup, gen: torch.Generator, so_far: str) -> dict:
    """hocc._C's c10d comm over the world-of-one backend (NCCL's kernels on one member), called directly."""
    c = native.load()
    backend = group._get_backend(torch.device(device))
    dev = str(torch.device(device)) if is_cuda(device) else "cpu"

    def fresh() -> Any:
        _KEPT.append(c.c10d_comm(backend, 0, 1, dev))
        return _KEPT[-1]

    cases, failures = 0, []
    ar = fresh()
    for dtype in W1_DTYPES:
        dn = dtype_name(dtype)
        for n in (0, 1, 7, 1031, MIB + 3):
            x = sample(n, dtype, device, gen)
            for what in (*(f"all_reduce {op}" for op in COMM_OPS), "all_reduce from src", "reduce_scatter",
                         "all_gather"):
                cases += 1
                buf = torch.full_like(x, 77) if what == "all_reduce from src" else x.clone()
                label = f"{what} {dn} n={n}" + (" (a null pointer: an empty tensor's)" if buf.data_ptr() == 0 else "")
                note(stage=f"c10d comm {label}")
                try:
                    if what == "reduce_scatter":
                        fresh().reduce_scatter(buf.data_ptr(), n, dn, "sum", device=dev)
                    elif what == "all_gather":
                        fresh().all_gather(buf.data_ptr(), n, dn, device=dev)
                    elif what == "all_reduce from src":
                        ar.all_reduce(buf.data_ptr(), n, dn, "sum", src=x.data_ptr(), device=dev)
                    else:
                        ar.all_reduce(buf.data_ptr(), n, dn, what.split()[1], device=dev)
                    if not torch.equal(buf, x):
                        failures.append(f"{label}: {_diff(buf, x)}")
                except Exception as e:  # noqa: BLE001 - every case reports
                    failures.append(f"{label}: {type(e).__name__}: {str(e)[:300]}")
    for f in failures[:10]:
        print(f"nccl_world1 c10d comm WRONG: {f}", flush=True)
    print(f"nccl_world1 c10d comm, a comm per in-place call: {cases - len(failures)} of {cases} right", flush=True)
    summary = f"{cases - len(failures)} of {cases} right" + (f" (first wrong: {failures[0]})" if failures else "")
    note(summary=f"{so_far}; c10d comm, a comm per in-place call: {summary}")
    reused = _comm_reused(fresh(), device, dev, gen)
    ok = not failures and reused["ok"]
    return {"cases": cases, "failures": failures[:50], "reused": reused, "ok": ok,
            "summary": f"{summary}; one comm reused: {reused['summary']}"}


def _comm_reused(comm: Any, device: str, dev: str, gen: torch.Generator) -> dict:
    """One comm's in-place all_gather and reduce_scatter called again and again (each uses the comm's
    scratch), with a tensor allocated between calls that may take memory the scratch had: the results
    and that tensor must stay right. Each call is noted first: a crash names the call."""
    n, checks, guards = 4096, [], []
    for i in range(3):
        for what in ("all_gather", "reduce_scatter"):
            x = sample(n + i, torch.float32, device, gen)
            buf = x.clone()
            note(stage=f"one c10d comm reused (its scratch kept from the binding's last call): {what}, "
                       f"call {len(checks) + 1}")
            if what == "all_gather":
                comm.all_gather(buf.data_ptr(), n + i, "float32", device=dev)
            else:
                comm.reduce_scatter(buf.data_ptr(), n + i, "float32", "sum", device=dev)
            guards.append(torch.full((n + i,), -5.0, device=device))
            checks.append(bool(torch.equal(buf, x)) and all(bool((g == -5).all()) for g in guards))
    right = sum(checks)
    return {"calls": len(checks), "right": right, "ok": right == len(checks),
            "summary": f"{right} of {len(checks)} calls right, other tensors untouched"}


# -- inproc --------------------------------------------------------------------------------------
IN_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
TOL = {torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 8e-2}
VARIANTS = (("native", None, ()), ("ring", None, ()), ("ho_ring", 1, ()),
            ("ho_ring", 4, ("reduce_scatter", "all_gather")))


def reference(coll: str, ins: list[torch.Tensor], world: int, n: int) -> list[torch.Tensor]:
    total = torch.stack([x.double() for x in ins]).sum(0).to(ins[0].dtype)
    if coll == "all_reduce":
        return [total] * world
    if coll == "reduce_scatter":
        return [total[r * n:(r + 1) * n] for r in range(world)]
    return [torch.cat(ins)] * world


def check_inproc(device: str) -> dict:
    sizes = (0, 1, 1031, MIB) if is_cuda(device) else (0, 1, 1031, 65536 + 3)
    world = 8
    w = InProcWorld(world, device, timeout_s=60)
    gen = torch.Generator(device=device).manual_seed(0)
    results, bad, worst = [], 0, ""
    for spec in ("2x4", "3+5"):
        topo = parse_spec(spec)
        for coll in ("all_reduce", "reduce_scatter", "all_gather"):
            for algo, chunks, ring_ops in VARIANTS:
                line_start, line_bad, ratio = time.perf_counter(), bad, 0.0
                for n in sizes:
                    for dtype in IN_DTYPES:
                        es = torch.empty(0, dtype=dtype).element_size()
                        cfg = PlannerConfig(chunks=chunks, ring_ops=ring_ops, min_chunk_bytes=1)
                        plan = make_plan(coll, n, es, topo, algo, cfg)
                        what = f"{spec} {coll} {algo} K={plan.chunks} n={n} {dtype_name(dtype)}"
                        note(stage=f"inproc {what}", cases=len(results), wrong=bad)
                        in_n = n * world if coll == "reduce_scatter" else n
                        out_n = n * world if coll == "all_gather" else n
                        ins = [torch.randn(in_n, generator=gen, device=device).to(dtype) for _ in range(world)]
                        outs = [torch.full((out_n,), 77.0, dtype=dtype, device=device) for _ in range(world)]
                        start = time.perf_counter()
                        error = ""
                        try:
                            w.run(plan, ins, outs, "sum")
                        except RuntimeError as e:
                            error = f"{type(e).__name__}: {str(e)[:300]}"
                        if is_cuda(device):
                            torch.cuda.synchronize()
                        secs = time.perf_counter() - start
                        want = reference(coll, ins, world, n)
                        err = max((float((o.double() - x.double()).abs().max()) if o.numel() else 0.0
                                   for o, x in zip(outs, want, strict=True)), default=0.0)
                        bound = TOL[dtype] * (world if coll != "all_gather" else 1) * 4
                        ok = not error and err <= bound
                        bad += not ok
                        ratio = max(ratio, err / bound)
                        if not ok and not worst:
                            worst = f"{what}: {error or f'max abs err {err:.3g} > {bound:.3g}'}"
                        results.append({"topology": spec, "collective": coll, "algo": algo, "plan": plan.algo,
                                        "chunks": plan.chunks, "n": n, "dtype": dtype_name(dtype),
                                        "max_abs_err": err, "error": error, "ok": ok, "seconds": secs})
                print(f"inproc {device} {spec:<4} {coll:<14} {algo:<7} K={chunks or 1} ring_ops={list(ring_ops)}: "
                      f"{len(sizes) * len(IN_DTYPES)} cases, {bad - line_bad} wrong, worst err {ratio:.0%} of the "
                      f"bound, {time.perf_counter() - line_start:.2f} s", flush=True)
    summary = f"{len(results) - bad} of {len(results)} right (2x4 and 3+5, sizes {list(sizes)})"
    return {"cases": len(results), "wrong": bad, "results": results, "ok": bad == 0,
            "summary": summary + (f"; first wrong: {worst}" if worst else "")}


# -- device_copy ---------------------------------------------------------------------------------
def _timed(fn: Callable[[], None], iters: int, gpu: bool) -> tuple[float, float]:
    """(device seconds per call, host seconds per call) for `iters` calls of fn. On the GPU the calls
    queue behind a busy stream, so that the events time the device's work and not the host's."""
    for _ in range(2):
        fn()
    if not gpu:
        start = time.perf_counter()
        for _ in range(iters):
            fn()
        secs = (time.perf_counter() - start) / iters
        return secs, secs
    torch.cuda.synchronize()
    spin(0.02 + iters * 200e-6)  # the calls queue behind it
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    host = (time.perf_counter() - start) / iters
    end.record()
    end.synchronize()
    return begin.elapsed_time(end) / 1e3 / iters, host


def check_device_copy(device: str) -> dict:
    c = native.load()
    gpu = is_cuda(device)
    dev = str(torch.device(device)) if gpu else "cpu"
    sizes, iters = ((64 * MIB, 1 << 30), 20) if gpu else ((64 * MIB,), 5)
    cupy = None
    if gpu:
        try:
            import cupy
        except ImportError:
            cupy = None
    memcpy_name = "cudaMemcpyAsync (cupy)" if cupy is not None else ("torch copy_ (cupy absent)" if gpu else
                                                                      "torch copy_")
    copies, reductions, wrong = [], [], []
    for nbytes in sizes:
        note(stage=f"device_copy copy {nbytes >> 20} MiB")
        src = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, device=device)
        dst = torch.zeros_like(src)
        d, s = dst.data_ptr(), src.data_ptr()

        def hocc_copy(d: int = d, s: int = s, nbytes: int = nbytes) -> None:
            c.reduce(d, s, nbytes, "uint8", "copy", device=dev)

        def torch_copy(dst: torch.Tensor = dst, src: torch.Tensor = src) -> None:
            dst.copy_(src)

        def memcpy(d: int = d, s: int = s, nbytes: int = nbytes) -> None:
            rt = cupy.cuda.runtime
            rt.memcpyAsync(d, s, nbytes, rt.memcpyDeviceToDevice, torch.cuda.current_stream().cuda_stream)

        hocc_dev, hocc_host = _timed(hocc_copy, iters, gpu)
        if gpu:
            torch.cuda.synchronize()
        if not torch.equal(dst, src):
            wrong.append(f"copy of {nbytes >> 20} MiB")
        ref_dev, ref_host = _timed(memcpy if cupy is not None else torch_copy, iters, gpu)
        tc_dev = _timed(torch_copy, iters, gpu)[0] if cupy is not None else ref_dev
        row = {"bytes": nbytes, "hocc_GBps": nbytes / hocc_dev / 1e9, "memcpy_GBps": nbytes / ref_dev / 1e9,
               "torch_copy_GBps": nbytes / tc_dev / 1e9, "hocc_host_us_per_call": hocc_host * 1e6,
               "memcpy_host_us_per_call": ref_host * 1e6}
        row["fraction"] = row["hocc_GBps"] / row["memcpy_GBps"]
        copies.append(row)
        also = f", torch copy_ {row['torch_copy_GBps']:.1f} GB/s" if cupy is not None else ""
        print(f"device_copy {nbytes >> 20:>5} MiB: hocc {row['hocc_GBps']:8.1f} GB/s, {memcpy_name} "
              f"{row['memcpy_GBps']:8.1f} GB/s{also} -> "
              f"{row['fraction']:.0%} (bytes copied per second; host {hocc_host * 1e6:.0f} us per hocc call, "
              f"{ref_host * 1e6:.0f} us per memcpy)", flush=True)
        del src, dst
    for dtype in (torch.float32, torch.bfloat16):
        for nbytes in sizes:
            note(stage=f"device_copy sum {dtype_name(dtype)} {nbytes >> 20} MiB")
            n = nbytes // torch.empty(0, dtype=dtype).element_size()
            a = torch.ones(n, dtype=dtype, device=device)
            b = torch.ones(n, dtype=dtype, device=device)

            def hocc_sum(a: torch.Tensor = a, b: torch.Tensor = b, n: int = n, dn: str = dtype_name(dtype)) -> None:
                c.reduce(a.data_ptr(), b.data_ptr(), n, dn, "sum", device=dev)

            def torch_sum(a: torch.Tensor = a, b: torch.Tensor = b) -> None:
                a.add_(b)

            red, _ = _timed(hocc_sum, iters, gpu)
            ref, _ = _timed(torch_sum, iters, gpu)
            row = {"dtype": dtype_name(dtype), "bytes": nbytes, "hocc_GBps": nbytes / red / 1e9,
                   "hocc_traffic_GBps": 3 * nbytes / red / 1e9, "torch_add_GBps": nbytes / ref / 1e9}
            reductions.append(row)
            print(f"device_copy sum {dtype_name(dtype):<8} {nbytes >> 20:>5} MiB: hocc {row['hocc_GBps']:8.1f} GB/s "
                  f"of dst ({row['hocc_traffic_GBps']:.1f} GB/s of memory traffic: two reads, one write), torch "
                  f"add_ {row['torch_add_GBps']:8.1f} GB/s", flush=True)
            del a, b
    wrong += _reduce_ops_right(c, device, dev)
    low = [r for r in copies if r["fraction"] < 0.9]
    ok = not wrong and (not gpu or not low)
    frac = ", ".join(f"{r['bytes'] >> 20} MiB {r['fraction']:.0%}" for r in copies)
    summary = (f"copy at {frac} of {memcpy_name}" + ("" if gpu else " (CPU timings: no bound)")
               + f"; sum {max(r['hocc_GBps'] for r in reductions):.0f} GB/s at best"
               + (f"; wrong: {', '.join(wrong)}" if wrong else "; copy, sum, min, max, product right"))
    return {"memcpy": memcpy_name, "copies": copies, "reductions": reductions, "wrong": wrong, "ok": ok,
            "summary": summary}


def _reduce_ops_right(c: Any, device: str, dev: str) -> list[str]:
    """The device layer's reductions against torch's ops on the same values."""
    wrong = []
    gen = torch.Generator(device=device).manual_seed(1)
    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.int32):
        a, b = sample(1031, dtype, device, gen), sample(1031, dtype, device, gen)
        want = {"sum": a + b, "min": torch.minimum(a, b), "max": torch.maximum(a, b), "product": a * b, "copy": b}
        for op, w in want.items():
            d = a.clone()
            c.reduce(d.data_ptr(), b.data_ptr(), 1031, dtype_name(dtype), op, device=dev)
            if is_cuda(device):
                torch.cuda.synchronize()
            if not torch.equal(d, w):
                wrong.append(f"{op} {dtype_name(dtype)}")
    return wrong


# -- memory --------------------------------------------------------------------------------------
def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def check_memory(device: str) -> dict:
    gpu = is_cuda(device)
    top = 26 if gpu else 24  # 64 MiB on the GPU, 16 MiB on the CPU dry run
    rng = random.Random(0)
    calls = [(("all_reduce", "all_gather", "reduce_scatter")[i % 3], ("auto", "ho_ring")[(i // 3) % 2],
              max(1, int(2 ** rng.uniform(10, top)) // 4)) for i in range(200)]
    largest = max(n for _, _, n in calls) * 4

    def phase(use_hocc: bool) -> dict:
        note(stage=f"memory: {'hocc' if use_hocc else 'torch.distributed'}")
        if gpu:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        a0 = torch.cuda.memory_allocated() if gpu else 0
        r0 = torch.cuda.memory_reserved() if gpu else _rss()
        wrong = 0
        start = time.perf_counter()
        for i, (coll, algo, n) in enumerate(calls):
            x = torch.full((n,), float(i % 7 + 1), device=device)
            y = x.clone() if coll == "all_reduce" else torch.empty_like(x)
            if use_hocc:
                if coll == "all_reduce":
                    hocc.all_reduce(y, algo=algo)
                elif coll == "all_gather":
                    hocc.all_gather_into_tensor(y, x, algo=algo)
                else:
                    hocc.reduce_scatter_tensor(y, x, algo=algo)
            elif coll == "all_reduce":
                dist.all_reduce(y)
            elif coll == "all_gather":
                _all_gather(y, x)
            else:
                _reduce_scatter(y, x)
            wrong += not torch.equal(y, x)  # a world of one: every result is the input
            del x, y
        if gpu:
            torch.cuda.synchronize()
        out = {"seconds": time.perf_counter() - start, "wrong": wrong}
        if gpu:
            out.update(allocated_before=a0, allocated_after=torch.cuda.memory_allocated(), reserved_before=r0,
                       reserved_after=torch.cuda.memory_reserved(), peak=torch.cuda.max_memory_allocated())
        else:
            out.update(rss_before=r0, rss_after=_rss())
        return out

    with world_of_one(device) as group:
        alone = phase(False)
        with_hocc = phase(True)
        own = _held_by_hocc(group, device)
    res: dict = {"calls": len(calls), "largest_call_bytes": largest, "torch": alone, "hocc": with_hocc,
                 "hocc_says": own}
    wrong = alone["wrong"] + with_hocc["wrong"]
    mib = float(MIB)
    if gpu:
        def grew(p: dict, key: str) -> int:
            return p[f"{key}_after"] - p[f"{key}_before"]

        held = grew(with_hocc, "allocated") - grew(alone, "allocated")
        reserved = grew(with_hocc, "reserved") - grew(alone, "reserved")
        peak = (with_hocc["peak"] - with_hocc["allocated_before"]) - (alone["peak"] - alone["allocated_before"])
        res.update(held_bytes=held, reserved_bytes=reserved, peak_bytes=peak)
        ok = wrong == 0 and held <= HELD_BOUND
        summary = (f"hocc holds {held / mib:+.2f} MiB after the calls ({held / largest:+.1%} of the largest call, "
                   f"{largest / mib:.0f} MiB), reserves {reserved / mib:+.1f} MiB, peaks {peak / mib:+.1f} MiB "
                   f"({peak / largest:+.0%}) more than torch.distributed alone")
    else:
        mine, theirs = (p["rss_after"] - p["rss_before"] for p in (with_hocc, alone))
        res.update(rss_bytes=mine - theirs)
        ok = wrong == 0
        summary = (f"CPU dry run: RSS grew {mine / mib:+.1f} MiB in hocc's calls, {theirs / mib:+.1f} MiB in torch's "
                   "(no bound: the allocator stats are CUDA's)")
    if own:
        summary += f"; hocc's own count: {', '.join(f'{k} {v / mib:.2f} MiB' for k, v in own.items())}"
    summary += f"; {2 * len(calls) - wrong} of {2 * len(calls)} results right"
    print(f"memory: {summary}; torch {alone}; hocc {with_hocc}", flush=True)
    return {**res, "ok": ok, "summary": summary}


def _held_by_hocc(group: dist.ProcessGroup, device: str) -> dict:
    """What the engine's executor and communicators say they keep between calls (builds that count it)."""
    engine = find_engine(group, torch.device(device))
    out = {}
    for part in ("executor", "transport"):
        held = getattr(getattr(engine, part, None), "held_bytes", None)
        if isinstance(held, int):
            out[f"{part} held_bytes"] = held
    return out


# -- absent (the in-process part; the 2-rank group's runs in processes of its own) ---------------
def check_absent(device: str) -> dict:
    res = check_inproc_absent(device)
    secs = "/".join(f"{c['seconds']:.1f}" for c in res["cases"])
    good = all(c["names_it"] and c["next_run_right"] for c in res["cases"])
    raised = "raised" if all(c["raised"] for c in res["cases"]) else "DID NOT raise"
    res["summary"] = (f"in-process: ranks 0 and 5 absent {raised} after {secs} s (timeout {res['timeout_s']:.0f} s), "
                      f"{'naming them, next run right' if good else 'NOT naming them or next run wrong'}")
    return res


CHECKS: dict[str, Callable[[str], dict]] = {
    "nccl_world1": check_world1, "inproc": check_inproc, "device_copy": check_device_copy,
    "capture": check_capture, "cupy": check_arrays, "async_work": check_async_work, "absent": check_absent,
    "memory": check_memory,
}


def run_child(name: str, device: str, result: Path, store_dir: str) -> int:
    """One section in this process, its result (and how far it got) in `result`."""
    gpu_faults.PROGRESS = result
    note(section=name, stage="starting")
    out = absent_pg(device, store_dir) if name == "absent_pg" else CHECKS[name](device)
    note(**out, done=True)
    sys.stdout.flush()
    if out.get("exit_at_once"):
        os._exit(0)  # nccl_world1 keeps comms that must not be dropped (see _check_comm)
    return 0


# -- the sections, each in a process of its own ----------------------------------------------------
def _how_it_ended(rc: int) -> str:
    if rc < 0:
        try:
            return f"killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    return f"exit status {rc}"


class Child:
    """A section's process, started now; finish() waits for it within its limit."""

    def __init__(self, name: str, device: str, tmp: Path, limit: float, env: dict[str, str] | None = None,
                 tag: str = "", log: Path | None = None) -> None:
        self.name, self.limit = name, limit
        self.result = tmp / f"{name}{tag}.json"
        cmd = [sys.executable, __file__, "--child", name, "--device", device, "--result", str(self.result),
               "--store-dir", str(tmp / f"store{tag}")]
        (tmp / f"store{tag}").mkdir(exist_ok=True)
        self.start = time.time()
        out = open(log, "w") if log is not None else None  # noqa: SIM115 - the child's, closed by finish()
        self.proc = subprocess.Popen(cmd, start_new_session=True, env={**os.environ, **(env or {})}, stdout=out,
                                     stderr=subprocess.STDOUT if out is not None else None)
        self.log = log
        if out is not None:
            out.close()  # the child has its own copy

    def finish(self, deadline: float | None = None) -> dict:
        """The section's result: what it returned, or how far it got before it hung or died."""
        end = self.start + self.limit if deadline is None else min(deadline, self.start + self.limit)
        hung = False
        try:
            rc = self.proc.wait(timeout=max(0.0, end - time.time()))
        except subprocess.TimeoutExpired:
            hung = True
            os.killpg(self.proc.pid, signal.SIGKILL)  # the section's process group: this child and its own
            rc = self.proc.wait()
        res = json.loads(self.result.read_text()) if self.result.exists() else {}
        secs = time.time() - self.start
        res.update(seconds=secs, returncode=rc)
        stage = res.get("stage", "starting")
        if hung:
            res.update(ok=False, hung=True, summary=f"hung: killed after {secs:.0f} s, at {stage}"
                       + (f"; so far: {res['summary']}" if "summary" in res else ""))
        elif not res.get("done"):
            so_far = f"; so far: {res['summary']}" if "summary" in res else ""
            ended = _how_it_ended(rc)
            res.update(ok=False, summary=f"the process ended ({ended}) after {secs:.0f} s, at {stage}{so_far}")
        elif rc != 0:
            res.update(ok=False, summary=f"{res.get('summary', '')}; then the process ended ({_how_it_ended(rc)})")
        if self.log is not None:
            res["log"] = str(self.log)
        return res


def _nvidia_smi(fields: str) -> str:
    """GPU 0's `fields` as nvidia-smi reports them ('' without it)."""
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return (out.strip().splitlines() or [""])[0]


def _gpu_shared() -> bool:
    """Whether more than one process may use the GPU at once (compute mode Default)."""
    return _nvidia_smi("compute_mode") == "Default"


def _absent_pg_children(device: str, tmp: Path, logs: Path) -> list[tuple[str, Child]]:
    """Rank 0 of a 2-rank torch group whose rank 1 never comes: with torch's defaults, and (NCCL) with
    nonblocking communicator init, which makes torch poll NCCL's init against the group's timeout.
    What they print (torch's and NCCL's warnings) goes to logs/absent_pg*.log."""
    out = [("defaults", Child("absent_pg", device, tmp, ABSENT_PG_LIMIT_S, log=logs / "absent_pg.log"))]
    if is_cuda(device):
        out.append(("TORCH_NCCL_USE_COMM_NONBLOCKING=1", Child(
            "absent_pg", device, tmp, ABSENT_PG_LIMIT_S, {"TORCH_NCCL_USE_COMM_NONBLOCKING": "1"}, "_nonblocking",
            logs / "absent_pg_nonblocking.log")))
    return out


def _absent_pg_summary(res: dict) -> str:
    if res.get("done"):
        return res["summary"]
    secs = res["seconds"]  # from the process's start, imports included
    phase = res.get("phase", "its start (importing torch)")
    if res.get("hung"):
        return f"{res.get('backend', '?')}: hung in {phase} until killed after {secs:.0f} s"
    ended = _how_it_ended(res["returncode"])
    return f"{res.get('backend', '?')}: the process ended ({ended}) in {phase} after {secs:.0f} s"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda:0", help="cuda:0 (default) or cpu for a dry run")
    ap.add_argument("--json", default="gpu_check.json", help="the summary, rewritten after each section")
    ap.add_argument("--only", default="", help=f"comma-separated sections to run (default all: {','.join(SECTIONS)})")
    ap.add_argument("--deadline", type=float, default=0.0, help="epoch seconds by which every section must end")
    ap.add_argument("--build-json", default="", help="the build step's result (gpu_check.sh), kept in the summary")
    ap.add_argument("--child", default="", help=argparse.SUPPRESS)
    ap.add_argument("--result", default="", help=argparse.SUPPRESS)
    ap.add_argument("--store-dir", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return run_child(args.child, args.device, Path(args.result), args.store_dir)

    gpu = is_cuda(args.device)
    only = [x for x in args.only.split(",") if x]
    unknown = [x for x in only if x not in SECTIONS and x != "build"]
    if unknown:
        ap.error(f"unknown sections {unknown}; choose from build,{','.join(SECTIONS)}")
    selected = [s for s in SECTIONS if not only or s in only]  # the build is gpu_check.sh's
    deadline = args.deadline or time.time() + sum(v[0 if gpu else 1] for v in SECTIONS.values())
    report: dict = {"device": args.device, "started": time.strftime("%Y-%m-%d %H:%M:%S"), "torch": torch.__version__,
                    "sections": {}}
    if args.build_json and Path(args.build_json).exists():
        report["build"] = json.loads(Path(args.build_json).read_text())
    if gpu:  # from nvidia-smi: this process makes no CUDA context (the GPU may allow only one process)
        report["gpu"] = _nvidia_smi("name,compute_mode,driver_version,memory.total")
    verdicts: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="hocc-gpu-check-") as tmpdir:
        tmp = Path(tmpdir)
        shared = not gpu or _gpu_shared()
        logs = Path(args.json).resolve().parent
        absent_bg = _absent_pg_children(args.device, tmp, logs) if "absent" in selected and shared else []
        if absent_bg:
            print(f"absent: the 2-rank group's rank 0 runs beside the other sections (up to {ABSENT_PG_LIMIT_S:.0f} s)",
                  flush=True)
        for name in selected:
            gpu_limit, cpu_limit, what = SECTIONS[name]
            limit = min(gpu_limit if gpu else cpu_limit, deadline - time.time() - 3)
            if not gpu and not cpu_limit:
                res = {"ok": None, "summary": f"{what}: CUDA only, not run on the CPU"}
            elif limit < 10:
                res = {"ok": False, "summary": f"not run: {max(0.0, deadline - time.time()):.0f} s of the budget left"}
            else:
                print(f"-- {name}: {what} (limit {limit:.0f} s)", flush=True)
                res = Child(name, args.device, tmp, limit).finish()
                if name == "absent":
                    res = _with_absent_pg(res, absent_bg or _absent_pg_children(args.device, tmp, logs), deadline)
            word = "SKIP" if res["ok"] is None else "ok" if res["ok"] else "FAIL"
            secs = f"; {res['seconds']:.0f} s" if "seconds" in res else ""
            print(f"VERDICT {name}: {word} ({res['summary']}{secs})", flush=True)
            verdicts[name] = word
            report["sections"][name] = res
            report["verdicts"] = verdicts
            Path(args.json).write_text(json.dumps(report, indent=1, default=str))
        for _, child in absent_bg:  # only left running where the absent section was not reached
            if child.proc.poll() is None:
                os.killpg(child.proc.pid, signal.SIGKILL)
                child.proc.wait()
    failed = [k for k, v in verdicts.items() if v == "FAIL"]
    print(f"gpu_check: {len(verdicts)} sections: {sum(v == 'ok' for v in verdicts.values())} ok, "
          f"{len(failed)} FAIL{' (' + ', '.join(failed) + ')' if failed else ''}, "
          f"{sum(v == 'SKIP' for v in verdicts.values())} SKIP; summary in {args.json}", flush=True)
    return 1 if failed else 0


def _with_absent_pg(res: dict, children: list[tuple[str, Child]], deadline: float) -> dict:
    """The absent section's result with the 2-rank group's: ok only if torch raised within its bound."""
    pgs = {}
    for label, child in children:
        pg = child.finish(deadline)
        pg["summary"] = _absent_pg_summary(pg)
        pgs[label] = pg
        print(f"absent: rank 0 of 2, rank 1 never comes, timeout {PG_TIMEOUT_S:.0f} s, {label}: {pg['summary']}",
              flush=True)
    default = pgs["defaults"]
    raised = default.get("outcome") == "raised" and default.get("ok")
    parts = [res.get("summary", ""), f"2-rank group, rank 1 absent: {default['summary']}"
             + ("" if raised else f" (ok needs a raise within {PG_TIMEOUT_S + PG_SLACK_S:.0f} s)")]
    parts += [f"with {label}: {pg['summary']}" for label, pg in pgs.items() if label != "defaults"]
    return {**res, "absent_pg": pgs, "ok": bool(res.get("ok")) and bool(raised), "summary": "; ".join(parts)}


if __name__ == "__main__":
    sys.exit(main())
