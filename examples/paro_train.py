#!/usr/bin/env python3
"""Train a small transformer language model under a PaRO-DP strategy.

    torchrun --nproc-per-node 8 examples/paro_train.py --strategy IIG --accum 4
    HOCC_TOPOLOGY=2x4 torchrun --nproc-per-node 8 examples/paro_train.py --strategy NIG --bf16

CPU and gloo by default (hocc's collectives run on any group of any backend).
The intra-group of the I scope is a host: hocc's topology (HOCC_TOPOLOGY, or
the ranks' hostnames). Data are random tokens with a learnable pattern (each
token is the previous plus one), so the loss falls. Rank 0 prints the loss,
the step time and the memory each model state takes per rank, next to the
memory model's prediction.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist
from torch import nn

import hocc
from hocc.paro import ParoDP
from hocc.paro.memory import StateBytes, memory_per_rank


class TinyLM(nn.Module):
    def __init__(self, vocab: int, dim: int, layers: int, heads: int, seq: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.zeros(seq, dim))
        layer = nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout=0.0, batch_first=True)
        self.body = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(dim, vocab)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(seq), persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.pos[: tokens.shape[1]].to(self.embed.weight.dtype)
        return self.head(self.body(x, mask=self.mask.to(x.dtype), is_causal=True))


def batch(gen: torch.Generator, n: int, seq: int, vocab: int) -> torch.Tensor:
    start = torch.randint(0, vocab, (n, 1), generator=gen)
    return (start + torch.arange(seq + 1)) % vocab


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--strategy", default="IIG", help="PaRO strategy: params, grads, optimizer states (N/I/G)")
    p.add_argument("--accum", type=int, default=4, help="micro-steps per optimizer step")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch", type=int, default=8, help="sequences per micro-step per rank")
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--bf16", action="store_true", help="bf16 parameters and gradients, fp32 master and Adam")
    p.add_argument("--comm", choices=("hocc", "torch"), default="hocc")
    a = p.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = TinyLM(a.vocab, a.dim, a.layers, a.heads, a.seq)
    dtype = torch.bfloat16 if a.bf16 else None
    dp = ParoDP(model, a.strategy, lambda ps: torch.optim.AdamW(ps, lr=a.lr), param_dtype=dtype, comm=a.comm)
    g = dp.groups
    if rank == 0:
        print(f"# {dp.strategy}: {dp.numel} parameters, {g.size} ranks in {g.n_groups} groups of {g.group_size}; "
              f"schedule:")
        for c in dp.strategy.schedule():
            print(f"#   {c.describe()}")
    gen = torch.Generator().manual_seed(1 + rank)
    loss_fn = nn.CrossEntropyLoss()
    for step in range(a.steps):
        t0 = time.perf_counter()
        total = 0.0
        for _ in range(a.accum):
            tok = batch(gen, a.batch, a.seq, a.vocab)
            logits = dp(tok[:, :-1])
            loss = loss_fn(logits.float().reshape(-1, a.vocab), tok[:, 1:].reshape(-1)) / a.accum
            dp.backward(loss)
            total += float(loss.detach())
        dp.step()
        dt = time.perf_counter() - t0
        if rank == 0 and (step % 5 == 0 or step == a.steps - 1):
            print(f"step {step:3d}  loss {total:.4f}  {dt * 1e3:.0f} ms", flush=True)
    if rank == 0:
        per = StateBytes(2, 2, 12) if a.bf16 else StateBytes(4, 4, 12)
        want = memory_per_rank(dp.strategy, dp.numel, g.size, g.group_size, per).as_dict()
        print(f"# memory per rank (bytes): measured {dp.storage_bytes()}, model {want}")
    hocc.reset_engines()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
