"""The cost checks of bench/gpu_check.py, each run in a process of its own:
device_copy (the device layer's copy against cudaMemcpy, its reductions'
bandwidth and results) and memory (what hocc holds after 200 mixed calls,
against the same calls through torch.distributed alone). Each takes the
device and returns a dict with "ok" and a one-line "summary"."""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from gpu_faults import (
    is_cuda,
    note,
    spin,
    world_of_one,
)
from gpu_results import sample, torch_all_gather, torch_reduce_scatter

import hocc
from hocc import executor
from hocc.engine.group_engines import find_engine
from hocc.executor.cpp_form import dtype_name

MIB = 1 << 20
HELD_BOUND = 8 * MIB  # memory: what hocc may hold after the calls (a small kept work buffer, not a call's size)

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
    c = executor.load()
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
                torch_all_gather(y, x)
            else:
                torch_reduce_scatter(y, x)
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


