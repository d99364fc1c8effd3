"""Memory per rank of each PaRO strategy (no torch).

The usual ZeRO accounting: for P parameters in mixed precision with Adam,
parameters 2P bytes, gradients 2P, optimizer states 12P (fp32 master copy,
momentum, variance); each divided by 1, G (the intra-group's size) or W (all
ranks) by its scope letter. Counted in elements of the padded flat vector
that paro_shard holds (W blocks of ceil(P/W)), so the prediction is exact for it.

`memory_per_rank` is what a rank holds between the micro-steps of an
accumulation (gradients at scope g); `peak_per_rank` adds what a pass
gathers, unit by unit, as hocc/paro/shard.py runs it. Left out of both:
activations and the collectives' own scratch.

`Probe` measures the same thing on a running model: the distinct storages
its units and its optimizer hold, sampled at every hook of a pass."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hocc.paro.strategy import Strategy, parse


@dataclass(frozen=True)
class StateBytes:
    """Bytes per parameter of each state before sharding. Defaults: mixed
    precision Adam. fp32 Adam: (4, 4, 12); SGD with momentum in bf16: (2, 2, 8).
    `optim` counts the optimizer's own copy of the parameters (`master` bytes)
    unless that copy is the parameters themselves (`aliased`: same scope and dtype)."""

    params: float = 2
    grads: float = 2
    optim: float = 12
    master: float = 4
    reduce: float = 0  # bytes of a gradient reduced and accumulated at scope g (reduce_dtype); 0: `grads`

    @property
    def acc(self) -> float:
        return self.reduce or self.grads

    def aliased(self, s: Strategy) -> bool:
        return s.params == s.optim and self.params == self.master

    def optim_bytes(self, s: Strategy) -> float:
        return self.optim - (self.master if self.aliased(s) else 0)


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

    return Memory(part(s.params, b.params), part(s.grads, b.grads if s.grads == "N" else b.acc),
                  part(s.optim, b.optim_bytes(s)))


def peak_per_rank(strategy: str | Strategy, units: Sequence[int], root: int, world: int, group_size: int,
                  per_param: StateBytes | None = None, accum: int = 1) -> Memory:
    """The most a rank holds during forward and backward, by state, when a
    model is wrapped as `units` (parameter counts, in forward order) under a
    root that owns `root` parameters, trained with `accum` micro-steps per
    optimizer step. Follows hocc/paro/shard.py: the root stays gathered from
    its forward to the end of its backward; a unit is gathered with the next
    one prefetched; autograd's gradient buffer of a unit is whole (scope N)
    until its reduction, and one reduction is in flight while the next unit
    computes; a synced backward leaves the optimizer's gradient at scope o."""
    s, b = parse(strategy), per_param or StateBytes()
    names = ["root", *range(len(units))]
    numel = dict(zip(names, [root, *units], strict=True))

    def size(scope: str, u: object) -> int:
        return scope_elems(scope, numel[u], world, group_size)

    rest_p = sum(size(s.params, u) for u in names) * b.params
    rest_o = sum(size(s.optim, u) for u in names) * b.optim_bytes(s)
    gathered = (lambda u: size("N", u) * b.params) if s.params != "N" else (lambda u: 0)
    peak = Memory(0, 0, 0)

    def sample(params: float, grads: float) -> None:
        nonlocal peak
        now = Memory(round(rest_p + params), round(grads), round(rest_o))
        if now.total > peak.total:
            peak = now

    order = list(range(len(units)))
    for m in range(accum):
        sync = m == accum - 1
        # between micro-steps: g != N keeps gacc (scope g), g == N keeps autograd's buffer (scope N)
        acc = {u: (size(s.grads, u) * (b.grads if s.grads == "N" else b.acc) if m else 0) for u in names}
        for i, u in enumerate(["root", *order]):  # forward: root, then each unit with the next prefetched
            nxt = order[i] if i < len(order) else None
            extra = gathered("root") + (gathered(u) if u != "root" else 0) + (gathered(nxt) if nxt is not None else 0)
            sample(extra, sum(acc.values()))
        held: dict[object, float] = dict(acc)
        whole: dict[object, float] = {}
        for i, u in enumerate(["root", *reversed(order)]):  # backward, the unit before prefetched
            rev = list(reversed(order))
            prev = rev[i] if i < len(rev) else None
            whole[u] = size("N", u) * b.grads
            if s.grads == "N":
                held[u] = 0.0  # its buffer is `whole`
            extra = gathered("root") + (gathered(u) if u != "root" else 0) + (gathered(prev) if prev is not None else 0)
            sample(extra, sum(held.values()) + sum(whole.values()))
            if u != "root":  # its reduction: the buffer in flight until the next unit's ends
                if s.grads != "N" or sync:
                    done = [k for k in whole if k not in ("root", u)]
                    for k in done:
                        del whole[k]
                if sync:
                    held[u] = size(s.optim, u) * b.master
                elif s.grads != "N":
                    held[u] = size(s.grads, u) * b.acc
        if sync:  # the root's reduction last, then every unit's gradient at scope o
            sample(0, sum(size(s.optim, u) * b.master for u in names))
    return peak
