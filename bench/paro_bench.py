#!/usr/bin/env python3
"""PaRO-DP step times, side by side with FSDP2 (`fully_shard` on gloo), in one run.

Runs under torchrun or inside the emulated cluster (`bench/cluster.py 2x4
--script bench/paro_bench.py -- ...`): every rank builds the same
communication-heavy model (wide linear layers, a small batch), and for each
entry of --strategies (a PaRO strategy, `NAME:torch` for the same strategy on
torch.distributed's own collectives, `fsdp2`, or `fsdp2-noreshard` with
reshard_after_forward=False) trains --steps optimizer steps
of --accum micro-steps after one warm-up step; entries are interleaved round
by round (--rounds) so drifting load hits all alike. A step's time is the
slowest rank's. Rank 0 prints a markdown table, the guideline's predicted
ranking (hocc/paro/comm.py on --predict-topology, default HOCC_TOPOLOGY)
against the measured one (pairs in the same order), and writes --json / --plot.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from itertools import combinations
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

import hocc
from hocc.paro.comm import comm_per_step
from hocc.paro.wrapper import ParoDP
from hocc.topology import parse_spec


def build_model(dim: int, layers: int) -> nn.Module:
    torch.manual_seed(0)
    mods: list[nn.Module] = []
    for _ in range(layers):
        mods += [nn.Linear(dim, dim), nn.ReLU()]
    return nn.Sequential(*mods)


def adamw(ps: list[nn.Parameter]) -> torch.optim.Optimizer:
    return torch.optim.AdamW(ps, lr=1e-4)


class Runner:
    """One entry: build it, then run optimizer steps."""

    def __init__(self, entry: str, a: argparse.Namespace, groups: Any) -> None:
        self.entry = entry
        model = build_model(a.dim, a.layers)
        opt = adamw
        if entry.startswith("fsdp2"):
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.fsdp import fully_shard

            mesh = init_device_mesh("cpu", (dist.get_world_size(),))
            reshard = entry != "fsdp2-noreshard"  # False: one all-gather per micro-step, as ParoDP's GGG
            for m in model:
                if isinstance(m, nn.Linear):
                    fully_shard(m, mesh=mesh, reshard_after_forward=reshard)
            fully_shard(model, mesh=mesh, reshard_after_forward=reshard)
            self.model, self.optim = model, opt(list(model.parameters()))
            self.dp = None
        else:
            name, _, comm = entry.partition(":")
            self.dp = ParoDP(model, name, opt, groups=groups, comm=comm or "hocc")
            self.model = self.dp
        self.accum = a.accum
        gen = torch.Generator().manual_seed(dist.get_rank())
        self.batches = [torch.randn(a.batch, a.dim, generator=gen) for _ in range(a.accum)]

    def step(self) -> None:
        for x in self.batches:
            loss = self.model(x).square().mean()
            if self.dp is not None:
                self.dp.backward(loss)
            else:
                loss.backward()
        if self.dp is not None:
            self.dp.step()
        else:
            self.optim.step()
            self.optim.zero_grad()


def timed_steps(r: Runner, steps: int) -> list[float]:
    out = []
    for _ in range(steps):
        dist.barrier()
        t0 = time.perf_counter()
        r.step()
        dt = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
        dist.all_reduce(dt, op=dist.ReduceOp.MAX)
        out.append(float(dt))
    return out


def concordant(pred: dict[str, float], meas: dict[str, float]) -> tuple[int, int]:
    names = sorted(pred)
    pairs = list(combinations(names, 2))
    same = sum(1 for x, y in pairs if (pred[x] - pred[y]) * (meas[x] - meas[y]) > 0)
    return same, len(pairs)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--strategies", default="NNN,NNG,NIG,NGG,ING,IIG,IGG,III,GGG,GGG:torch,fsdp2,fsdp2-noreshard")
    p.add_argument("--dim", type=int, default=1024)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--accum", type=int, default=4)
    p.add_argument("--steps", type=int, default=2, help="measured optimizer steps per entry per round")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--predict-topology", help="topology for the prediction (default HOCC_TOPOLOGY); a "
                                              "calibrated file from hocc calibrate prices the emulation better")
    p.add_argument("--json", help="write the results here (rank 0)")
    p.add_argument("--plot", help="bar chart PNG (rank 0)")
    p.add_argument("--label", default="", help="a note for the table's header, e.g. the thread setting")
    a = p.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    entries = [e.strip() for e in a.strategies.split(",") if e.strip()]
    times: dict[str, list[float]] = {e: [] for e in entries}
    groups = None
    numel = 0
    for rnd in range(a.rounds):
        for e in entries:
            r = Runner(e, a, groups)
            if r.dp is not None:
                groups, numel = r.dp.groups, r.dp.numel
            r.step()  # warm-up: plans, sub-groups, buffers
            times[e] += timed_steps(r, a.steps)
            if rank == 0:
                print(f"# round {rnd} {e}: " + " ".join(f"{t:.3f}" for t in times[e][-a.steps:]) + " s",
                      flush=True)
            del r
    if rank == 0:
        report(a, times, numel, world)
    hocc.reset_engines()
    dist.destroy_process_group()
    return 0


def report(a: argparse.Namespace, times: dict[str, list[float]], numel: int, world: int) -> None:
    spec = a.predict_topology or os.environ.get("HOCC_TOPOLOGY", "")
    topo = parse_spec(spec) if spec else None
    med = {e: statistics.median(ts) for e, ts in times.items()}
    paro = [e for e in times if not e.startswith("fsdp2") and ":" not in e]
    pred = {e: comm_per_step(e, numel, topo, a.accum, 4, "gloo").total() for e in paro} if topo else {}
    fsdp = med.get("fsdp2")
    best = min(paro, key=lambda e: med[e]) if paro else None
    lines = [f"world {world}, model {numel} parameters (fp32, {a.layers} x Linear({a.dim}, {a.dim})), batch "
             f"{a.batch} per micro-step, accum {a.accum}, AdamW; {a.rounds} rounds x {a.steps} steps per entry, "
             f"median of the slowest rank's step time. OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'default')}"
             f" {a.label}".rstrip(), "",
             "| entry | step s (median) | min | max | vs fsdp2 | predicted comm s | predicted rank | measured rank |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    prank = {e: i + 1 for i, e in enumerate(sorted(pred, key=pred.__getitem__))}
    mrank = {e: i + 1 for i, e in enumerate(sorted(paro, key=med.__getitem__))}
    for e in sorted(times, key=med.__getitem__):
        ts = times[e]
        rel = f"{fsdp / med[e]:.2f}x" if fsdp else "-"
        pr = f"{pred[e]:.3f}" if e in pred else "-"
        lines.append(f"| {e} | {med[e]:.3f} | {min(ts):.3f} | {max(ts):.3f} | {rel} | {pr} | "
                     f"{prank.get(e, '-')} | {mrank.get(e, '-')} |")
    summary: dict[str, Any] = {"median_s": med, "times_s": times, "predicted_comm_s": pred, "numel": numel,
                               "args": vars(a), "omp_num_threads": os.environ.get("OMP_NUM_THREADS")}
    if pred:
        same, total = concordant(pred, {e: med[e] for e in pred})
        lines += ["", f"Predicted vs measured order: {same} of {total} pairs of PaRO strategies agree."]
        summary["pairs_agree"] = [same, total]
    if best and fsdp:
        lines.append(f"Best PaRO strategy {best}: {fsdp / med[best]:.2f}x the speed of FSDP2 on gloo "
                     f"({med[best]:.3f} s vs {fsdp:.3f} s per optimizer step).")
        summary["best"] = best
        summary["speedup_vs_fsdp2"] = fsdp / med[best]
    print("\n".join(lines), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(summary, f, indent=1)
    if a.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        order = sorted(times, key=med.__getitem__)
        fig, ax = plt.subplots(figsize=(9, 4))
        ax.bar(order, [med[e] for e in order], color=["C1" if e.startswith("fsdp2") else "C0" for e in order])
        if pred:
            ax.plot([e for e in order if e in pred], [pred[e] for e in order if e in pred], "k_", ms=18,
                    mew=2, label="predicted communication")
            ax.legend()
        ax.set_ylabel("seconds per optimizer step")
        ax.set_title(f"PaRO-DP vs FSDP2, {world} ranks, accum {a.accum} {a.label}".strip())
        plt.setp(ax.get_xticklabels(), rotation=30)
        fig.tight_layout()
        fig.savefig(a.plot, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
