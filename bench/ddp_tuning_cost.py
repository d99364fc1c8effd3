"""What auto's tuning costs a DDP training run: the same run of STEPS steps on
the "hocc" backend three times, on local CPU ranks (gloo inside): tuning
from scratch (writing a tuning file), again loading that file (no trials),
and with HOCC_TUNE=0 (the model's picks). Reports each run's wall time, its
steady step time (the median of the second half), and tuning's share.

    .venv/bin/python bench/ddp_tuning_cost.py --nprocs 4 --steps 300
    OMP_NUM_THREADS=1 HOCC_TOPOLOGY=2x2 .venv/bin/python bench/ddp_tuning_cost.py --nprocs 4 --rounds 3

Each registered algorithm also runs fixed (HOCC_ALGO), and auto's runs are reported against the best of
them (issue 33: within 3%, with the tuning file and without).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from hocc.bench.launch import free_port, start_local_ranks
from hocc.bench.runner import slowest
from hocc.plan.registry import names


def _rank(rank: int, world: int, port: int, steps: int, width: int, out: str, env: dict[str, str]) -> None:
    os.environ.update(env, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import hocc  # noqa: F401 - registers the backend

    dist.init_process_group("hocc", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 8))
    ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=1)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    x, y = torch.randn(32, 64), torch.randn(32, 8)
    loss_sum = torch.zeros(1)
    times = []
    dist.barrier()
    start = time.perf_counter()
    for _ in range(steps):
        t = time.perf_counter()
        opt.zero_grad()
        loss = nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        opt.step()
        loss_sum.copy_(loss.detach())
        dist.all_reduce(loss_sum)  # the loss as a training loop logs it: a 4-byte all-reduce per step
        times.append(time.perf_counter() - t)
    total = time.perf_counter() - start
    total_s, step_s = slowest([total, statistics.median(times[steps // 2:])])
    if rank == 0:
        Path(out).write_text(json.dumps({"total_s": total_s, "step_s": step_s}))
    dist.destroy_process_group()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nprocs", type=int, default=4)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--width", type=int, default=1024, help="hidden width (1024: about 4.3 MiB of gradients)")
    p.add_argument("--rounds", type=int, default=1, help="rounds of every run, interleaved; medians reported")
    p.add_argument("--json", help="write the runs' totals and step times here")
    a = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="hocc-ddp-tuning-"))
    fixed = {f"HOCC_ALGO={n}": {"HOCC_ALGO": n} for n in names()}  # auto is held to the best of these
    res: dict[str, list[dict[str, float]]] = {}
    for rnd in range(a.rounds):
        tuning = str(tmp / f"tuning{rnd}.json")  # each round tunes from scratch, then loads what it wrote
        auto = [("tuning from scratch", {"HOCC_TUNE": "1", "HOCC_TUNING_FILE": tuning}),
                ("tuning file loaded", {"HOCC_TUNE": "1", "HOCC_TUNING_FILE": tuning})]
        others = [("HOCC_TUNE=0", {"HOCC_TUNE": "0"}), *fixed.items()]
        others = others[rnd % len(others):] + others[:rnd % len(others)]  # the order rotates each round
        for name, env in auto + others:
            out = str(tmp / "out.json")
            start_local_ranks(_rank, (a.nprocs, free_port(), a.steps, a.width, out, env), a.nprocs)
            res.setdefault(name, []).append(json.loads(Path(out).read_text()))
    med = {name: {k: statistics.median(r[k] for r in rs) for k in ("total_s", "step_s")} for name, rs in res.items()}
    base = med["tuning file loaded"]["total_s"]
    print(f"# DDP on the hocc backend, {a.nprocs} local CPU ranks, {a.steps} steps, width {a.width}, "
          f"{a.rounds} round(s) (medians), HOCC_TOPOLOGY={os.environ.get('HOCC_TOPOLOGY', 'unset')}, "
          f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}")
    print(f"# {'run':<24} {'total s':>8} {'step ms':>8} {'vs file':>8}")
    for name, r in med.items():
        print(f"  {name:<24} {r['total_s']:>8.2f} {r['step_s'] * 1e3:>8.2f} {r['total_s'] / base:>8.3f}")
    share = (med["tuning from scratch"]["total_s"] - base) / med["tuning from scratch"]["total_s"]
    print(f"# tuning's share of the run from scratch: {share * 100:.1f}%")
    best = min(fixed, key=lambda n: med[n]["total_s"])
    for name in ("tuning from scratch", "tuning file loaded", "HOCC_TUNE=0"):
        print(f"# {name} / the best fixed algorithm ({best}): {med[name]['total_s'] / med[best]['total_s']:.3f}")
    if a.json:
        Path(a.json).write_text(json.dumps({"runs": res, "medians": med, "best_fixed": best}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
