#!/usr/bin/env python3
"""PaRO-DP step times on a GPT-like model, side by side with FSDP2 and HSDP, in one run.

Runs under torchrun or inside the emulated cluster:

    flock /tmp/hocc-bench.lock python bench/cluster.py 2x4 --rate 200mbit --script bench/paro_bench.py -- \\
        --json paro.json --plot paro.png

Every rank builds the same TinyGPT (examples/tiny_gpt.py: --layers blocks)
and trains it with the usual loop (loss.backward() under no_sync for all but
the last of --accum micro-steps, optimizer.step(), zero_grad(); AdamW), for
each entry of --entries:

    NAME          paro_shard on each block, then the root, under strategy NAME, over hocc's calls
    NAME:torch    the same over torch.distributed's own gloo collectives
    NAME:serial   the same with overlap=False: every gather and reduction waited for where it is issued
    fsdp2         torch's fully_shard on each block and the root, 1-D mesh on gloo
    hsdp          fully_shard on a 2-D mesh (replicate across hosts, shard inside), on gloo
    fsdp2@hocc    fsdp2 on process groups of the "hocc" backend
    hsdp@hocc     hsdp on process groups of the "hocc" backend
    local         the same loop with no communication at all (each rank its own model): the compute

Entries are interleaved round by round (--rounds) so drifting load hits all
alike; a step's time is the slowest rank's; the table gives medians. For
each entry one more step is measured for memory: the peak resident memory
of the process above its baseline before any model was built (sampled every
2 ms; run with MALLOC_MMAP_THRESHOLD_ fixed so freed tensors leave the
process), and for PaRO entries the peak of the model states by the Probe
(hocc/paro/probe.py) next to the guideline's prediction. The share of
communication hidden behind compute is (serial - overlapped) / (serial -
local) for a strategy that also has its NAME:serial entry.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from contextlib import nullcontext
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
from tiny_gpt import batch, build_model

import hocc
from hocc.bench.runner import slowest
from hocc.paro import paro_shard
from hocc.paro.memory import StateBytes
from hocc.paro.probe import Probe


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class RssPeak:
    """The largest resident size seen while inside, sampled on a thread."""

    def __init__(self, every_s: float = 0.002) -> None:
        self.every, self.peak, self._stop = every_s, 0, threading.Event()

    def __enter__(self) -> RssPeak:
        self.peak = rss()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, rss())
            time.sleep(self.every)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join()
        self.peak = max(self.peak, rss())


class Groups:
    """The process groups FSDP2 and HSDP run on, made once, in the same order on every rank."""

    def __init__(self, group_size: int) -> None:
        from torch.distributed.device_mesh import DeviceMesh

        world = dist.get_world_size()
        self.meshes: dict[str, Any] = {}
        hosts = [list(range(h, h + group_size)) for h in range(0, world, group_size)]
        rails = [list(range(p, world, group_size)) for p in range(group_size)]
        layout = torch.arange(world).view(len(hosts), group_size)
        for backend in ("gloo", "hocc"):
            whole = dist.new_group(list(range(world)), backend=backend)
            host = rail = None
            for h in hosts:
                g = dist.new_group(h, backend=backend)
                host = g if dist.get_rank() in h else host
            for r in rails:
                g = dist.new_group(r, backend=backend)
                rail = g if dist.get_rank() in r else rail
            self.meshes[f"fsdp2@{backend}"] = DeviceMesh.from_group(whole, "cpu")
            self.meshes[f"hsdp@{backend}"] = DeviceMesh.from_group([rail, host], "cpu", mesh=layout,
                                                                   mesh_dim_names=("replicate", "shard"))


class Runner:
    """One entry: its model and optimizer, and one optimizer step."""

    def __init__(self, entry: str, a: argparse.Namespace, groups: Groups) -> None:
        self.entry = entry
        model = build_model(a.vocab, a.dim, a.layers, a.heads, a.seq)
        self.paro = None
        if entry == "local":
            pass
        elif entry.split("@")[0] in ("fsdp2", "hsdp"):
            from torch.distributed.fsdp import fully_shard

            mesh = groups.meshes[entry if "@" in entry else entry + "@gloo"]
            for b in model.blocks:
                fully_shard(b, mesh=mesh)
            fully_shard(model, mesh=mesh)
        else:
            name, _, how = entry.partition(":")
            for b in model.blocks:
                paro_shard(b, name, comm="torch" if how == "torch" else "hocc", overlap=how != "serial")
            paro_shard(model, name, comm="torch" if how == "torch" else "hocc", overlap=how != "serial")
            self.paro = name
        self.model = model
        self.optim = torch.optim.AdamW(model.parameters(), lr=1e-4)
        self.accum, self.vocab = a.accum, a.vocab
        gen = torch.Generator().manual_seed(dist.get_rank())
        self.batches = [batch(gen, a.batch, a.seq, a.vocab) for _ in range(a.accum)]
        self.loss = nn.CrossEntropyLoss()

    def step(self) -> None:
        for m, tok in enumerate(self.batches):
            last = m == len(self.batches) - 1
            if self.entry != "local":  # accumulate without the step's reduction, as DDP's no_sync
                self.model.set_requires_gradient_sync(last)  # type: ignore[operator]
            logits = self.model(tok[:, :-1])
            loss = self.loss(logits.reshape(-1, self.vocab), tok[:, 1:].reshape(-1)) / self.accum
            loss.backward()
        self.optim.step()
        self.optim.zero_grad()



def timed_steps(r: Runner, steps: int) -> list[float]:
    out = []
    for _ in range(steps):
        dist.barrier()
        t0 = time.perf_counter()
        r.step()
        out.append(slowest(time.perf_counter() - t0))
    return out


def measure_memory(r: Runner, base: int) -> dict[str, Any]:
    """One more step, watched: RSS above the baseline, and for PaRO the states' peak and the prediction."""
    dist.barrier()
    probe = Probe(r.model, r.optim) if r.paro is not None else None
    with RssPeak() as peak, (probe if probe is not None else nullcontext()):
        r.step()
    out: dict[str, Any] = {"rss_peak_bytes": int(slowest(float(peak.peak - base)))}
    if probe is not None:
        out["states_peak"] = probe.peak.as_dict() | {"total": probe.peak.total}
    if probe is not None and not r.entry.endswith(":serial"):  # the guideline's model prefetches
        pred = probe.predicted(StateBytes(4, 4, 12, 4), r.accum)
        out["states_predicted"] = pred.as_dict() | {"total": pred.total}
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--entries", default="NNG,NIG,IIG,III,GGG,IIG:serial,GGG:serial,fsdp2,hsdp,fsdp2@hocc,"
                                        "hsdp@hocc,local")
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--dim", type=int, default=192)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--batch", type=int, default=4, help="sequences per micro-step per rank")
    p.add_argument("--accum", type=int, default=4)
    p.add_argument("--steps", type=int, default=2, help="timed optimizer steps per entry per round")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--group-size", type=int, default=0, help="ranks per host (default: from HOCC_TOPOLOGY)")
    p.add_argument("--json", help="write the results here (rank 0)")
    p.add_argument("--plot", help="bar chart PNG (rank 0)")
    a = p.parse_args()
    base = rss()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    spec = os.environ.get("HOCC_TOPOLOGY", "")
    gsize = a.group_size or (len(hocc.parse_spec(spec).host_groups()[0]) if spec else world)
    groups = Groups(gsize)
    entries = [e.strip() for e in a.entries.split(",") if e.strip()]
    times: dict[str, list[float]] = {e: [] for e in entries}
    memory: dict[str, dict[str, Any]] = {}
    numel = sum(p.numel() for p in build_model(a.vocab, a.dim, a.layers, a.heads, a.seq).parameters())
    for rnd in range(a.rounds):
        for e in entries:
            r = Runner(e, a, groups)
            r.step()  # warm-up: plans, buffers, optimizer states
            times[e] += timed_steps(r, a.steps)
            if rnd == 0:
                memory[e] = measure_memory(r, base)
            if rank == 0:
                print(f"# round {rnd} {e}: " + " ".join(f"{t:.3f}" for t in times[e][-a.steps:]) + " s",
                      flush=True)
            del r
    if rank == 0:
        report(a, times, memory, numel, world)
    hocc.reset_engines()
    dist.destroy_process_group()
    return 0


def report(a: argparse.Namespace, times: dict[str, list[float]], memory: dict[str, dict[str, Any]], numel: int,
           world: int) -> None:
    med = {e: statistics.median(ts) for e, ts in times.items()}
    local = med.get("local")
    baselines = [e for e in ("fsdp2", "hsdp", "fsdp2@hocc", "hsdp@hocc") if e in med]
    paro = [e for e in med if e not in baselines and e != "local" and ":" not in e]
    best = min(paro, key=med.__getitem__) if paro else None
    threads = os.environ.get("OMP_NUM_THREADS", f"default ({torch.get_num_threads()})")
    lines = [f"world {world}, TinyGPT {a.layers} blocks dim {a.dim} ({numel} fp32 parameters), batch {a.batch}x"
             f"{a.seq} tokens per micro-step, accum {a.accum}, AdamW; {a.rounds} rounds x {a.steps} steps per entry, "
             f"median of the slowest rank's step. OMP_NUM_THREADS={threads}", "",
             "| entry | step s (median) | min | max | vs fsdp2 | vs hsdp | peak RSS MB | states peak MB "
             "| predicted MB | comm hidden |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    hidden: dict[str, float] = {}
    for e in paro:
        ser = med.get(e + ":serial")
        if ser is not None and local is not None and ser > local:
            hidden[e] = (ser - med[e]) / (ser - local)
    for e in sorted(med, key=med.__getitem__):
        ts, m = times[e], memory.get(e, {})
        rel = [f"{med[b] / med[e]:.2f}x" if b in med else "-" for b in ("fsdp2", "hsdp")]
        st = m.get("states_peak", {}).get("total")
        pr = m.get("states_predicted", {}).get("total")
        lines.append(f"| {e} | {med[e]:.3f} | {min(ts):.3f} | {max(ts):.3f} | {rel[0]} | {rel[1]} "
                     f"| {m.get('rss_peak_bytes', 0) / 1e6:.1f} | {st / 1e6 if st else 0:.2f} "
                     f"| {pr / 1e6 if pr else 0:.2f} | {f'{hidden[e]:.0%}' if e in hidden else '-'} |")
    summary: dict[str, Any] = {"median_s": med, "times_s": times, "memory": memory, "hidden": hidden,
                               "numel": numel, "args": vars(a), "omp_num_threads": threads}
    if best:
        summary["best"] = best
        lines.append("")
        for b in baselines:
            lines.append(f"Best PaRO strategy {best}: {med[b] / med[best]:.2f}x the speed of {b} "
                         f"({med[best]:.3f} s vs {med[b]:.3f} s per optimizer step).")
            summary[f"speedup_vs_{b}"] = med[b] / med[best]
    print("\n".join(lines), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(summary, f, indent=1)
    if a.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        order = sorted(med, key=med.__getitem__)
        fig, (ax, bx) = plt.subplots(1, 2, figsize=(13, 4.5))
        colour = ["C1" if e in baselines else "C2" if e == "local" else "C0" for e in order]
        ax.bar(order, [med[e] for e in order], color=colour)
        ax.set_ylabel("seconds per optimizer step")
        ax.set_title(f"step time, {world} ranks, OMP_NUM_THREADS={threads}")
        bx.bar(order, [memory.get(e, {}).get("rss_peak_bytes", 0) / 1e6 for e in order], color=colour)
        bx.set_ylabel("peak RSS above baseline, MB")
        bx.set_title("memory at its peak (blue: PaRO, orange: FSDP2/HSDP)")
        for x in (ax, bx):
            plt.setp(x.get_xticklabels(), rotation=40, ha="right")
        fig.tight_layout()
        fig.savefig(a.plot, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
