"""Memory per rank of each PaRO strategy (no torch).

The usual ZeRO accounting: for P parameters in mixed precision with Adam,
parameters 2P bytes, gradients 2P, optimizer states 12P (fp32 master copy,
momentum, variance); each divided by 1, G (the intra-group's size) or W (all
ranks) by its scope letter. Counted in elements of the padded flat vector
that ParoDP holds (W blocks of ceil(P/W)), so the prediction is exact for it.

Left out: activations, the transient whole-model buffers ParoDP gathers into
for p or g sharded (P elements each, freed after each micro-step), and the
communication buffers; `transient_bytes` gives the gathered buffers' size."""

from __future__ import annotations

from dataclasses import dataclass

from hocc.paro.strategy import Strategy, parse


@dataclass(frozen=True)
class StateBytes:
    """Bytes per parameter of each state before sharding. Defaults: mixed
    precision Adam. fp32 Adam: (4, 4, 12); SGD with momentum in bf16: (2, 2, 8)."""

    params: float = 2
    grads: float = 2
    optim: float = 12


@dataclass(frozen=True)
class Memory:
    params: int
    grads: int
    optim: int

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optim

    def as_dict(self) -> dict[str, int]:
        return {"params": self.params, "grads": self.grads, "optim": self.optim}


def scope_elems(scope: str, numel: int, world: int, group_size: int) -> int:
    """Elements a rank holds of a state at `scope` (padded to W equal blocks)."""
    if world % group_size:
        raise ValueError(f"world size {world} is not a multiple of the intra-group size {group_size}")
    block = -(-numel // world) if numel else 1
    return {"N": block * world, "I": block * (world // group_size), "G": block}[scope]


def memory_per_rank(strategy: str | Strategy, numel: int, world: int, group_size: int,
                    per_param: StateBytes | None = None) -> Memory:
    s, b = parse(strategy), per_param or StateBytes()

    def part(scope: str, bytes_per: float) -> int:
        return round(scope_elems(scope, numel, world, group_size) * bytes_per)

    return Memory(part(s.params, b.params), part(s.grads, b.grads), part(s.optim, b.optim))


def transient_bytes(strategy: str | Strategy, numel: int, world: int, per_param: StateBytes | None = None) -> int:
    """The whole-model buffers ParoDP gathers into during a micro-step
    (parameters if p is sharded, gradients if g is): not in `memory_per_rank`."""
    s, b = parse(strategy), per_param or StateBytes()
    full = scope_elems("N", numel, world, 1)
    return round(full * ((b.params if s.params != "N" else 0) + (b.grads if s.grads != "N" else 0)))
