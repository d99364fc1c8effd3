#!/usr/bin/env python3
"""Peak memory of every PaRO strategy, measured against the guideline's prediction.

    HOCC_TOPOLOGY=2x4 torchrun --nproc-per-node 8 bench/paro_memory.py --out bench/results/paro/memory.md
    HOCC_TOPOLOGY=2x4 torchrun --nproc-per-node 8 bench/paro_memory.py --kind lora --out bench/results/paro/memory.md

For each of the 14 strategies, TinyGPT (examples/tiny_gpt.py: 8 blocks and a
root; --kind frozen: one LayerNorm weight frozen inside the last block;
--kind lora: every weight frozen, a rank-4 adapter beside each block's
linear layers) is wrapped block by block over hocc's collectives
(paro_shard's default), trained one optimizer step (so the optimizer's
states exist), then one step of --accum micro-steps is watched
by the Probe (hocc/paro/probe.py): the bytes of parameters, gradients and
optimizer states held, sampled at every hook of forward and backward. Rank 0
writes a markdown table: the measured peak of the rank that held the most
(by kind, that rank's), the guideline's `peak_per_rank` for the same units
(the most a rank holds), and their ratio. Memory does not depend
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
from hocc.paro.memory import Memory, StateBytes, memory_per_rank
from hocc.paro.probe import Probe


class LoraLinear(nn.Module):
    """A frozen linear layer and a trainable rank-`r` adapter beside it (B starts at zero, as LoRA's)."""

    def __init__(self, base: nn.Linear, r: int = 4) -> None:
        super().__init__()
        self.base = base.requires_grad_(False)
        self.a = nn.Linear(base.in_features, r, bias=False)
        self.b = nn.Linear(r, base.out_features, bias=False)
        nn.init.zeros_(self.b.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.base(x) + self.b(self.a(x))
        return out


def model_of(kind: str, dim: int, layers: int) -> nn.Module:
    model = build_model(dim=dim, layers=layers)
    if kind == "frozen":
        model.blocks[-1].norm1.weight.requires_grad_(False)  # its backward is first: held longest
    elif kind == "lora":
        model.requires_grad_(False)
        for blk in model.blocks:
            for i, layer in enumerate(blk.mlp):
                if isinstance(layer, nn.Linear):
                    blk.mlp[i] = LoraLinear(layer)
    return model


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--accum", type=int, default=2)
    p.add_argument("--bf16", action="store_true", help="bf16 compute and gathers, fp32 reduction and AdamW")
    p.add_argument("--kind", choices=("plain", "frozen", "lora"), default="plain")
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
        model = model_of(a.kind, a.dim, a.layers)
        for b in model.blocks:
            paro_shard(b, s.name, **mp)  # type: ignore[arg-type]
        paro_shard(model, s.name, **mp)  # type: ignore[arg-type]
        opt = torch.optim.AdamW([q for q in model.parameters() if q.requires_grad], lr=1e-4)

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
        mine = torch.tensor([probe.peak.total, rank], dtype=torch.float64)
        every = [torch.zeros(2, dtype=torch.float64) for _ in range(world)]
        dist.all_gather(every, mine)
        most = int(max(every, key=lambda t: float(t[0]))[1])  # the rank that held the most
        peaks = [torch.tensor([probe.peak.params, probe.peak.grads, probe.peak.optim], dtype=torch.float64)]
        dist.broadcast(peaks[0], src=most)
        got = Memory(*(int(v) for v in peaks[0]))
        where = [probe.where]
        dist.broadcast_object_list(where, src=most)
        rows.append((s.name, got, pred, rest, f"rank {most}: {where[0]}"))
    if rank == 0:
        plain = model_of(a.kind, a.dim, a.layers)
        numel = sum(p.numel() for p in plain.parameters())
        trains = sum(p.numel() for p in plain.parameters() if p.requires_grad)
        what = {"plain": "", "frozen": ", one LayerNorm weight frozen in the last block",
                "lora": f", LoRA (every weight frozen, rank-4 adapters on the MLPs: {trains} trainable)"}[a.kind]
        lines = [f"### {world} ranks ({os.environ.get('HOCC_TOPOLOGY', 'one host')}), TinyGPT {a.layers} blocks dim "
                 f"{a.dim} ({numel} parameters, {a.layers + 1} units{what}), "
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
