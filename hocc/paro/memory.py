"""Memory per rank of each PaRO strategy (no torch).

The usual ZeRO accounting: for P parameters in mixed precision with Adam,
parameters 2P bytes, gradients 2P, optimizer states 12P (fp32 master copy,
momentum, variance); each divided by 1, G (the intra-group's size) or W (all
ranks) by its scope letter. Counted in elements of the padded flat vector
that paro_shard holds (W blocks of ceil(P/W)), so the prediction is exact for it.

`memory_per_rank` is what a rank holds between the micro-steps of an
accumulation (gradients at scope g); `peak_per_rank` adds what a pass
gathers, unit by unit, and what its reductions hold in flight, as
hocc/paro/shard.py runs it (frozen weights, UnitSize). Left out of both:
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


@dataclass(frozen=True)
class UnitSize:
    """A unit's parameters, and how many of them train (None: all). Frozen
    ones have no gradient of their own and no optimizer state, and keep the
    unit gathered from its backward to the end of backward (shard.py frees a
    unit at its last gradient only when every weight trains: a frozen one may
    still be read for the input's gradient). LoRA is this case."""

    numel: int
    trainable: int | None = None

    @property
    def trains(self) -> int:
        return self.numel if self.trainable is None else self.trainable

    @property
    def frozen(self) -> bool:
        return self.trains < self.numel


def peak_per_rank(strategy: str | Strategy, units: Sequence[int | UnitSize], root: int | UnitSize, world: int,
                  group_size: int, per_param: StateBytes | None = None, accum: int = 1) -> Memory:
    """The most a rank holds during forward and backward, by state, when a
    model is wrapped as `units` (their parameters, in forward order) under a
    root that owns `root` parameters, trained with `accum` micro-steps per
    optimizer step. Follows hocc/paro/shard.py and unit.py buffer by buffer:
    - the root stays gathered from its forward to the end of its backward, a
      unit is gathered with the next one prefetched, and a unit with frozen
      weights stays gathered from its backward to the end of backward;
    - autograd's gradient buffer of a unit is whole (scope N) from its
      backward until its reduction is settled;
    - a reduction holds, from its submission until it is settled, every
      buffer its move writes (Unit.reduce_move makes them when it is
      submitted): the cast to reduce_dtype, the micro-step's part at scope g,
      the step's result at scope o and its cast to the module's dtype, each
      only where the strategy and dtypes need it, and one buffer once where
      an in-place reduction makes two of them the same;
    - one reduction is in flight while the next unit computes: a unit's is
      settled after the next one's is submitted;
    - a synced backward leaves the optimizer's gradient at scope o;
    - optimizer states (all but its `master` copy) are for trainable
      parameters only: the rank counted is the one whose part at scope o
      holds the most of them (a LoRA unit's adapters lie in a few ranks'
      parts), so this is the most any rank holds."""
    s, b = parse(strategy), per_param or StateBytes()
    shape: dict[object, UnitSize] = {"root": _unit_size(root), **{i: _unit_size(u) for i, u in enumerate(units)}}
    order: list[object] = list(range(len(units)))
    g, o = s.grads, s.optim

    def size(scope: str, u: object) -> int:
        return scope_elems(scope, shape[u].numel, world, group_size)

    def trains(u: object) -> bool:
        return shape[u].trains > 0

    rest_p = sum(size(s.params, u) for u in shape) * b.params
    states = b.optim - b.master  # the optimizer's per-element states, without its copy of the parameters
    # the rank that holds the most of them: as many as its part at scope o can take of the trainable ones
    rest_o = sum(size(o, u) * b.optim_bytes(s) - states * (size(o, u) - min(shape[u].trains, size(o, u)))
                 for u in shape)
    cast_in = bool(b.reduce) and b.reduce != b.grads   # gradients cast to reduce_dtype before reducing
    cast_out = b.acc != b.master                        # the step's result cast to the module's dtype
    gathered = (lambda u: size("N", u) * b.params) if s.params != "N" else (lambda u: 0)
    grads: dict[tuple[object, str], float] = {}         # (unit, buffer) -> bytes held now
    pending: list[object] = []                           # units whose reduction is submitted, not settled
    peak = Memory(0, 0, 0)

    def sample(whole: set[object]) -> None:
        nonlocal peak
        now = Memory(round(rest_p + sum(gathered(u) for u in whole if u is not None)), round(sum(grads.values())),
                     round(rest_o))
        if now.total > peak.total:
            peak = now

    def submit(u: object, sync: bool) -> None:
        """Unit.reduce_move's buffers: in flight until settled ("fly"), and what stays (gacc or ograd)."""
        if not trains(u) or (g == "N" and not sync):
            return  # nothing to move (g == N accumulates in autograd's buffer)
        gfull = grads.pop((u, "gfull"))
        fly = gfull + (size("N", u) * b.acc if cast_in else 0)
        kept: tuple[str, float] | None = None
        if g != "N":
            fly += size(g, u) * b.acc  # the micro-step's part
            acc = grads.pop((u, "gacc"), None)
            if not sync:
                if acc is None:  # the part becomes the sum
                    fly -= size(g, u) * b.acc
                    kept = ("gacc", size(g, u) * b.acc)
                else:
                    grads[(u, "gacc")] = acc
            elif acc is not None:
                fly += acc  # the sum, consumed by the step
        if sync:
            if cast_out:
                kept = ("ograd", size(o, u) * b.master)
                if g != o:
                    fly += size(o, u) * b.acc
            elif g != o:
                kept = ("ograd", size(o, u) * b.acc)
            else:  # the result is the buffer reduced in place: it stays, as the gradient
                base = size(g, u) * (b.grads if g == "N" and not cast_in else b.acc)
                fly -= base
                kept = ("ograd", base)
        grads[(u, "fly")] = fly
        if kept is not None:
            grads[(u, kept[0])] = kept[1]
        pending.append(u)

    def settle(upto: int) -> None:
        for u in pending[:upto]:
            grads.pop((u, "fly"), None)
        del pending[:upto]

    for m in range(accum):
        sync = m == accum - 1
        if m == 0:
            grads.clear()  # the last step's gradients went with zero_grad
        for i, u in enumerate(["root", *order]):  # forward: root, then each unit with the next prefetched
            sample({"root", u, order[i] if i < len(order) else None})
        rev = list(reversed(order))
        kept_whole: set[object] = {"root"}
        for i, u in enumerate(["root", *rev]):  # backward, the unit before prefetched
            prev = rev[i] if i < len(rev) else None
            if trains(u):
                grads.setdefault((u, "gfull"), size("N", u) * b.grads)
            sample(kept_whole | {u, prev})
            if u == "root":
                continue  # its last gradient (its first layer's) lands at the end
            if shape[u].frozen:
                kept_whole.add(u)
            submit(u, sync)
            sample(kept_whole | {prev})
            settle(len(pending) - 1)
        if not shape["root"].frozen:
            kept_whole.discard("root")
        submit("root", sync)  # the end of backward: the root's reduction, then every one settled
        sample(kept_whole)
        settle(len(pending))
        sample(kept_whole)
    return peak


def _unit_size(u: int | UnitSize) -> UnitSize:
    return u if isinstance(u, UnitSize) else UnitSize(u)
