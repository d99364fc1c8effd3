"""The result checks of bench/gpu_check.py, each run in a process of its own:
nccl_world1 (hocc's drop-in calls against torch.distributed's on an NCCL
world of one, then the c10d comm on NCCL directly), inproc (8 in-process ranks
on the device against a float64 reference), and the in-process part of
absent. Each takes the device and returns a dict with "ok" and a one-line
"summary". The cost checks are in gpu_costs.py, the fault checks in
gpu_faults.py."""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist
from gpu_faults import (
    check_inproc_absent,
    is_cuda,
    note,
    world_of_one,
)

import hocc
from hocc import executor
from hocc.bench.collectives import reference
from hocc.executor.cpp_form import dtype_name
from hocc.executor.inproc import InProcWorld
from hocc.plan.planner import PlannerConfig, make_plan
from hocc.topology import parse_spec

MIB = 1 << 20



# -- nccl_world1 ---------------------------------------------------------------------------------
ALGOS = ("native", "ring", "ho_ring", "auto")
W1_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.int32)
OPS = ("sum", "avg", "min", "max", "product")
REDUCE_OP = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.AVG, "min": dist.ReduceOp.MIN,
             "max": dist.ReduceOp.MAX, "product": dist.ReduceOp.PRODUCT}
COMM_OPS = ("sum", "min", "max", "product")  # the c10d comm's own (AVG is the executor's division)
# torch 2.13 renamed them (*_single); older torch has only the old names
torch_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
torch_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


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
        torch_all_gather(r, x)
    else:
        r = torch.empty_like(x)
        torch_reduce_scatter(r, x, op=REDUCE_OP[op])
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
    c = executor.load()
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
                        want = [t.to(ins[0].dtype) for t in reference(coll, ins)]
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


# -- absent (the in-process part; the 2-rank group's runs in processes of its own) ---------------
def check_absent(device: str) -> dict:
    res = check_inproc_absent(device)
    secs = "/".join(f"{c['seconds']:.1f}" for c in res["cases"])
    good = all(c["names_it"] and c["next_run_right"] for c in res["cases"])
    raised = "raised" if all(c["raised"] for c in res["cases"]) else "DID NOT raise"
    res["summary"] = (f"in-process: ranks 0 and 5 absent {raised} after {secs} s (timeout {res['timeout_s']:.0f} s), "
                      f"{'naming them, next run right' if good else 'NOT naming them or next run wrong'}")
    return res


