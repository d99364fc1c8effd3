"""What one lent GPU can check (TESTBED.md): the NCCL path with a world of one,
the C++ executor with 8 in-process ranks on the one GPU (results against
torch), the reduction kernels' bandwidth against a device-to-device copy, and
the fault paths of issue 13 (bench/gpu_faults.py): a rank that never joins
the in-process world, the NCCL watchdog (init that a rank never joins, a run
past its deadline, then re-init), CUDA-graph capture refused clearly, and
CuPy arrays through the drop-in calls on CuPy's stream.
Run by bench/gpu_check.sh; `--device cpu` runs the same checks where they
can run on the CPU (a dry run of this script where there is no GPU: the
in-process and array checks, with NumPy in place of CuPy). Writes a JSON
summary after every section, so a section that hangs still leaves the rest.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from gpu_faults import check_arrays, check_async_work, check_capture, check_inproc_absent, check_nccl_watchdog

from hocc import executor as native
from hocc.executor.inproc import InProcWorld
from hocc.plan.planner import PlannerConfig, make_plan
from hocc.topology import parse_spec

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
TOL = {torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 8e-2}


def reference(coll: str, ins: list[torch.Tensor], world: int, n: int) -> list[torch.Tensor]:
    total = torch.stack([x.double() for x in ins]).sum(0).to(ins[0].dtype)
    if coll == "all_reduce":
        return [total] * world
    if coll == "reduce_scatter":
        return [total[r * n:(r + 1) * n] for r in range(world)]
    return [torch.cat(ins)] * world


def check_inproc(device: str, sizes: tuple[int, ...]) -> dict:
    world, topo = 8, parse_spec("2x4")
    w = InProcWorld(world, device, timeout_s=120)
    gen = torch.Generator().manual_seed(0)
    results, bad = [], 0
    variants = (("native", None, ()), ("ring", None, ()), ("ho_ring", 1, ()),
                ("ho_ring", 4, ("reduce_scatter", "all_gather")))
    for coll in ("all_reduce", "reduce_scatter", "all_gather"):
        for algo, chunks, ring_ops in variants:
            for n in sizes:
                plan = make_plan(coll, n, 4, topo, algo, PlannerConfig(chunks=chunks, ring_ops=ring_ops,
                                                                        min_chunk_bytes=1))
                for dtype in DTYPES:
                    in_n = n * world if coll == "reduce_scatter" else n
                    out_n = n * world if coll == "all_gather" else n
                    ins = [torch.randn(in_n, generator=gen).to(dtype).to(device) for _ in range(world)]
                    outs = [torch.empty(out_n, dtype=dtype, device=device) for _ in range(world)]
                    start = time.perf_counter()
                    w.run(plan, ins, outs, "sum")
                    if device != "cpu":
                        torch.cuda.synchronize()
                    secs = time.perf_counter() - start
                    want = reference(coll, ins, world, n)
                    err = max(float((o.double() - x.double()).abs().max()) if o.numel() else 0.0
                              for o, x in zip(outs, want, strict=True))
                    ok = err <= TOL[dtype] * (world if coll != "all_gather" else 1) * 4
                    bad += not ok
                    results.append({"collective": coll, "algo": algo, "chunks": plan.chunks, "n": n,
                                    "dtype": str(dtype)[6:], "max_abs_err": err, "ok": ok, "seconds": secs})
                    print(f"inproc {device} {coll:<14} {algo:<7} K={plan.chunks} n={n:<8} {str(dtype)[6:]:<8} "
                          f"err={err:.2e} {'ok' if ok else 'WRONG'} {secs * 1e3:.1f} ms", flush=True)
    return {"cases": len(results), "wrong": bad, "results": results}


def check_nccl_world_of_one(c) -> dict:
    t = c.NcclTransport(c.NcclTransport.unique_id(), 0, 1, 0)
    x = torch.randn(1 << 20, device="cuda")
    want = x.clone()
    stream = torch.cuda.current_stream()
    t.all_reduce(x.data_ptr(), x.numel(), "float32", "sum", stream.cuda_stream)
    torch.cuda.synchronize()
    ok = torch.equal(x, want)
    # the executor end to end on one-rank plans (pack, steps of one member, unpack; AVG divides by 1)
    ex = c.Executor(t)
    from hocc.executor.plans import to_native
    for algo in ("ho_ring", "native"):
        plan = make_plan("all_reduce", x.numel(), 4, parse_spec("1"), algo)
        work = torch.empty(plan.layout.size, device="cuda")
        y = x.clone()
        ex.run(to_native(plan), y.data_ptr(), y.data_ptr(), work.data_ptr(), "float32", "avg", stream.cuda_stream)
        torch.cuda.synchronize()
        ok = ok and torch.equal(y, want)
    print(f"nccl world of one: NCCL {c.nccl_version()}, all_reduce {'ok' if ok else 'WRONG'}", flush=True)
    return {"nccl": c.nccl_version(), "ok": bool(ok)}


def kernel_bandwidth(c) -> list[dict]:
    out = []
    for dtype in ("float32", "float16", "bfloat16"):
        for nbytes in (16 << 20, 256 << 20, 1 << 30):
            red, cpy = c.bench_reduce_cuda(nbytes, dtype, 20, 0)
            out.append({"dtype": dtype, "bytes": nbytes, "reduce_GBps": red, "copy_GBps": cpy,
                        "fraction_of_copy": red / cpy})
            print(f"kernel {dtype:<8} {nbytes >> 20:>5} MiB: reduce {red:8.1f} GB/s, copy {cpy:8.1f} GB/s "
                  f"-> {red / cpy:.0%} of copy", flush=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--device", default="cuda:0", help="cuda:0 (default) or cpu for a dry run")
    ap.add_argument("--json", default="gpu_check.json")
    ap.add_argument("--only", default="", help="comma-separated sections to run (default: all)")
    args = ap.parse_args()
    c = native.load()
    report: dict = {"device": args.device, "cuda_built": bool(c.cuda_built())}
    gpu = args.device != "cpu"
    if gpu:
        native.require_cuda()
        report["gpu"] = torch.cuda.get_device_name(0)
    sizes = (1, 1031, 1 << 20) if gpu else (1, 1031)
    # (name, check, runs on the CPU too); the NCCL watchdog last: an init abort is the riskiest call
    sections = [
        ("kernels", lambda: kernel_bandwidth(c), False),
        ("nccl_world_of_one", lambda: check_nccl_world_of_one(c), False),
        ("inproc", lambda: check_inproc(args.device, sizes), True),
        ("inproc_absent", lambda: check_inproc_absent(args.device), True),
        ("arrays", lambda: check_arrays(args.device), True),
        ("async_work", lambda: check_async_work(args.device), False),
        ("capture", lambda: check_capture(c), False),
        ("nccl_watchdog", lambda: check_nccl_watchdog(c), False),
    ]
    only = {x for x in args.only.split(",") if x}
    failed: list[str] = []
    for name, check, on_cpu in sections:
        if (only and name not in only) or (not gpu and not on_cpu):
            continue
        start = time.perf_counter()
        try:
            report[name] = check()
        except Exception as e:  # noqa: BLE001 - one broken section must not hide the others
            report[name] = {"ok": False, "error": f"{type(e).__name__}: {e}"}
            print(f"{name}: FAILED: {type(e).__name__}: {e}", flush=True)
        print(f"-- {name}: {time.perf_counter() - start:.1f} s", flush=True)
        entry = report[name]
        if isinstance(entry, dict) and (entry.get("ok") is False or entry.get("wrong")):
            failed.append(name)
        Path(args.json).write_text(json.dumps(report, indent=1))
    cases = report.get("inproc", {}).get("cases", 0)
    print(f"gpu_check: {cases} in-process cases; failed sections: {', '.join(failed) or 'none'}; "
          f"summary in {args.json}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
