"""A small GPT-like language model for the examples and benchmarks: token
and position embeddings, `layers` pre-norm transformer blocks (causal
self-attention and an MLP) in an nn.ModuleList, a final norm and a head.
The blocks are what one wraps as units (paro_shard, fully_shard).

    hocc paro advise --model examples/tiny_gpt.py:build_model --topology 2x4@nic=200mbit --bytes 4,4,12,4
"""

from __future__ import annotations

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        mask = nn.Transformer.generate_square_subsequent_mask(x.shape[1], dtype=x.dtype)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False, is_causal=True)[0]
        return x + self.mlp(self.norm2(x))


class TinyGPT(nn.Module):
    def __init__(self, vocab: int = 256, dim: int = 128, layers: int = 8, heads: int = 4, seq: int = 32) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.zeros(seq, dim))
        self.blocks = nn.ModuleList([Block(dim, heads) for _ in range(layers)])
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.pos[: tokens.shape[1]].to(self.embed.weight.dtype)
        for b in self.blocks:
            x = b(x)
        return self.head(self.norm(x))  # type: ignore[no-any-return]


def build_model(vocab: int = 256, dim: int = 128, layers: int = 8, heads: int = 4, seq: int = 32) -> TinyGPT:
    torch.manual_seed(0)
    return TinyGPT(vocab, dim, layers, heads, seq)


def batch(gen: torch.Generator, n: int, seq: int, vocab: int) -> torch.Tensor:
    """Random sequences with a learnable pattern (each token the previous plus one)."""
    start = torch.randint(0, vocab, (n, 1), generator=gen)
    return (start + torch.arange(seq + 1)) % vocab
