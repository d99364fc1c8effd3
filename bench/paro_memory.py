#!/usr/bin/env python3
"""Peak memory of every PaRO strategy, measured against the guideline's prediction.

    HOCC_TOPOLOGY=2x4 torchrun --nproc-per-node 8 bench/paro_memory.py --out bench/results/paro/memory.md

For each of the 14 strategies, TinyGPT (examples/tiny_gpt.py: 8 blocks and a
root) is wrapped block by block, trained one optimizer step (so the
optimizer's states exist), then one step of --accum micro-steps is watched
by the Probe (hocc/paro/probe.py): the bytes of parameters, gradients and
optimizer states held, sampled at every hook of forward and backward. Rank 0
writes a markdown table: measured peak per kind, the guideline's
`peak_per_rank` for the same units, and their ratio. Memory does not depend
on the network, so this runs on plain local ranks.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.distributed as dist
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
from tiny_gpt import batch, build_model

import hocc
from hocc.paro import all_strategies, paro_shard
from hocc.paro.memory import StateBytes, memory_per_rank
from hocc.paro.probe import Probe


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--accum", type=int, default=2)
    p.add_argument("--bf16", action="store_true", help="bf16 compute and gathers, fp32 reduction and AdamW")
    p.add_argument("--out", help="append the markdown table here (rank 0)")
    a = p.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mp = {"param_dtype": torch.bfloat16, "reduce_dtype": torch.float32} if a.bf16 else {}
    per = StateBytes(2, 2, 12, 4, reduce=4) if a.bf16 else StateBytes(4, 4, 12, 4)
    gen = torch.Generator().manual_seed(rank)
    tokens = [batch(gen, 2, 32, 256) for _ in range(a.accum)]
    loss_fn = nn.CrossEntropyLoss()
    rows = []
    for s in all_strategies():
        model = build_model(dim=a.dim, layers=a.layers)
        for b in model.blocks:
            paro_shard(b, s.name, comm="torch", **mp)  # type: ignore[arg-type]
        paro_shard(model, s.name, comm="torch", **mp)  # type: ignore[arg-type]
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def step(probe: Probe | None, model: nn.Module = model, opt: torch.optim.Optimizer = opt) -> None:
            for m, tok in enumerate(tokens):
                model.set_requires_gradient_sync(m == len(tokens) - 1)  # type: ignore[operator]
                if probe is not None:
                    with probe:
                        loss_fn(model(tok[:, :-1]).float().reshape(-1, 256), tok[:, 1:].reshape(-1)).backward()
                else:
                    loss_fn(model(tok[:, :-1]).float().reshape(-1, 256), tok[:, 1:].reshape(-1)).backward()
            opt.step()
            opt.zero_grad()

        step(None)
        probe = Probe(model, opt)
        step(probe)
        units = model.paro_units()
        group = units[0].groups.group_size
        pred = probe.predicted(per, a.accum)
        rest = memory_per_rank(s.name, sum(u.layout.numel for u in units), world, group, per)
        rows.append((s.name, probe.peak, pred, rest, probe.where))
    if rank == 0:
        numel = sum(p.numel() for p in build_model(dim=a.dim, layers=a.layers).parameters())
        lines = [f"### {world} ranks ({os.environ.get('HOCC_TOPOLOGY', 'one host')}), TinyGPT {a.layers} blocks dim "
                 f"{a.dim} ({numel} parameters, {a.layers + 1} units), "
                 f"{'bf16 compute, fp32 reduction and AdamW' if a.bf16 else 'fp32, AdamW'}, accum {a.accum}", "",
                 "| strategy | measured params | grads | optim | total MB | predicted total MB | measured / predicted "
                 "| at rest MB | where the peak was |",
                 "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for name, got, pred, rest, where in rows:
            lines.append(f"| {name} | {got.params / 1e6:.3f} | {got.grads / 1e6:.3f} | {got.optim / 1e6:.3f} "
                         f"| {got.total / 1e6:.3f} | {pred.total / 1e6:.3f} | {got.total / pred.total:.3f} "
                         f"| {rest.total / 1e6:.3f} | {where} |")
        worst = max(abs(g.total / p.total - 1) for _, g, p, _, _ in rows)
        lines += ["", f"Largest difference between measured and predicted peak: {worst:.1%}.", ""]
        text = "\n".join(lines)
        print(text, flush=True)
        if a.out:
            with open(a.out, "a") as f:
                f.write(text + "\n")
    hocc.reset_engines()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
