#!/usr/bin/env python3
"""Train a small GPT-like model under a PaRO-DP strategy, the usual way.

    torchrun --nproc-per-node 8 examples/paro_train.py --strategy IIG --accum 4
    HOCC_TOPOLOGY=2x4 torchrun --nproc-per-node 8 examples/paro_train.py --strategy NIG --bf16

Each transformer block is a unit (`paro_shard(block, ...)`), then the root:
parameters are gathered a block at a time, gradients reduced as each block's
backward ends. Training is `loss.backward()`, `opt.step()`,
`opt.zero_grad()` with `model.no_sync()` for accumulation, and
`model.clip_grad_norm_`. CPU and gloo by default; the intra-group of the I
scope is a host (HOCC_TOPOLOGY, or the ranks' hostnames). Rank 0 prints the
loss, the step time, and the peak memory of the model states per rank
next to `hocc paro advise`'s prediction.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist
from tiny_gpt import batch, build_model
from torch import nn

import hocc
from hocc.paro import paro_shard
from hocc.paro.memory import StateBytes
from hocc.paro.probe import Probe


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--strategy", default="IIG", help="PaRO strategy: params, grads, optimizer states (N/I/G)")
    p.add_argument("--accum", type=int, default=4, help="micro-steps per optimizer step")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch", type=int, default=8, help="sequences per micro-step per rank")
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--bf16", action="store_true", help="bf16 compute and gathers, fp32 reduction and AdamW")
    p.add_argument("--comm", choices=("hocc", "torch"), default="hocc")
    a = p.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = build_model(a.vocab, a.dim, a.layers, a.heads, a.seq)
    mp = {"param_dtype": torch.bfloat16, "reduce_dtype": torch.float32} if a.bf16 else {}
    for block in model.blocks:
        paro_shard(block, a.strategy, comm=a.comm, **mp)  # type: ignore[arg-type]
    paro_shard(model, a.strategy, comm=a.comm, **mp)  # type: ignore[arg-type]
    decay = [p for n, p in model.named_parameters() if p.dim() > 1 or ("weight" in n and "norm" not in n)]
    other = [p for p in model.parameters() if all(p is not q for q in decay)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}],
                            lr=a.lr)
    g = model.paro_units()[0].groups
    if rank == 0:
        print(f"# {a.strategy}: {sum(u.layout.numel for u in model.paro_units())} parameters in "
              f"{len(model.paro_units())} units, {g.size} ranks in {g.n_groups} groups of {g.group_size}")
    gen = torch.Generator().manual_seed(1 + rank)
    loss_fn = nn.CrossEntropyLoss()
    probe = Probe(model, opt)
    for step in range(a.steps):
        t0 = time.perf_counter()
        total = 0.0
        with probe if step == a.steps - 1 else _nothing():
            for m in range(a.accum):
                tok = batch(gen, a.batch, a.seq, a.vocab)
                with model.no_sync() if m < a.accum - 1 else _nothing():
                    logits = model(tok[:, :-1])
                    loss = loss_fn(logits.float().reshape(-1, a.vocab), tok[:, 1:].reshape(-1)) / a.accum
                    loss.backward()
                total += float(loss.detach())
        model.clip_grad_norm_(1.0)
        opt.step()
        opt.zero_grad()
        dt = time.perf_counter() - t0
        if rank == 0 and (step % 5 == 0 or step == a.steps - 1):
            print(f"step {step:3d}  loss {total:.4f}  {dt * 1e3:.0f} ms", flush=True)
    if rank == 0:
        per = StateBytes(2, 2, 12, 4, reduce=4) if a.bf16 else StateBytes(4, 4, 12, 4)
        want = probe.predicted(per, a.accum)
        print(f"# peak memory of the model states per rank (bytes): measured {probe.peak.as_dict()} "
              f"({probe.peak.total}), predicted {want.as_dict()} ({want.total})")
    hocc.reset_engines()
    dist.destroy_process_group()
    return 0


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


if __name__ == "__main__":
    raise SystemExit(main())
