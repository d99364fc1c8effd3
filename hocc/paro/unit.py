"""One PaRO unit: the parameters of one wrapped module (those no inner unit
owns), as flat vectors at the strategy's scopes, and the moves between them.

What a unit holds, each a flat vector on the rail-major layout (layout.py):

    master   scope o, the module's own dtype: the optimizer's parameters are
             views of it (`sharded`), so its version counter tells when the
             optimizer (or a load) changed them
    pstore   scope p, param_dtype: what forward gathers from; `master` itself
             when p == o and the dtypes agree
    full     scope N, param_dtype: the gathered parameters; the module's
             compute parameters are views of it; freed after use when p != N
    gfull    scope N, param_dtype: autograd accumulates into it; kept across
             micro-steps only when g == N
    gacc     scope g, reduce_dtype: the micro-steps' reduced gradients (g != N)
    ograd    scope o, the module's dtype: the mean gradient the optimizer
             reads (the `sharded` parameters' .grad are views of it)

Compute parameters get their storage through `.data`, so their version
counter is their own: gathering into `full` after forward does not trip
autograd's saved-tensor check.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from torch import nn
from torch.optim.optimizer import register_optimizer_step_post_hook

from hocc.paro.layout import Groups, ShardLayout
from hocc.paro.moves import Moves
from hocc.paro.strategy import Strategy


@dataclass(frozen=True)
class Slot:
    """One original parameter of the unit."""

    fqn: str            # its name relative to the unit's module
    owner: nn.Module    # the module that registers it
    attr: str           # its attribute name there
    shape: torch.Size
    offset: int         # where it starts in the flat vector
    trainable: bool
    aliases: tuple[tuple[nn.Module, str], ...] = ()  # other (module, attribute) names of a tied parameter

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def _free(t: torch.Tensor) -> None:
    t.untyped_storage().resize_(0)


def _alloc(t: torch.Tensor) -> None:
    need = t.numel() * t.element_size()
    if t.untyped_storage().nbytes() != need:
        t.untyped_storage().resize_(need)


def owned_parameters(module: nn.Module,
                     aliases: dict[int, list[tuple[nn.Module, str]]] | None = None,
                     ) -> list[tuple[str, nn.Module, str, nn.Parameter]]:
    """(fqn, owner, attr, parameter) of `module` not inside an inner unit,
    each parameter once, under its first name; the other names of a tied one
    go to `aliases` (by the parameter's id)."""
    out: list[tuple[str, nn.Module, str, nn.Parameter]] = []
    seen: set[int] = set()

    def walk(m: nn.Module, prefix: str) -> None:
        for attr, p in m._parameters.items():
            if p is not None and id(p) in seen and aliases is not None:
                aliases.setdefault(id(p), []).append((m, attr))
            elif p is not None:
                seen.add(id(p))
                out.append((prefix + attr, m, attr, p))
        for name, child in m._modules.items():
            if child is not None and getattr(child, "_paro_unit", None) is None:
                walk(child, prefix + name + ".")

    walk(module, "")
    return out


class ShardUnit:
    def __init__(self, module: nn.Module, strategy: Strategy, groups: Groups, moves: Moves,
                 param_dtype: torch.dtype | None, reduce_dtype: torch.dtype | None) -> None:
        tied_names: dict[int, list[tuple[nn.Module, str]]] = {}
        found = owned_parameters(module, tied_names)
        tied = _tied_elsewhere(found)
        if tied:
            raise ValueError(f"paro_shard: parameter {tied} is shared with a module outside this unit; wrap the "
                             f"modules that share a parameter in one unit (apply paro_shard to their common parent)")
        params = [p for *_, p in found]
        dtypes = {p.dtype for p in params}
        if len(dtypes) > 1 or (params and not params[0].is_floating_point()):
            raise ValueError(f"paro_shard needs the parameters of a unit in one floating dtype, got "
                             f"{sorted(map(str, dtypes))}; cast the module first (module.float())")
        devices = {p.device for p in params}
        if len(devices) > 1:
            raise ValueError(f"paro_shard: the unit's parameters are on several devices {sorted(map(str, devices))}; "
                             f"move the module to one device")
        _take(params)
        self.module, self.strategy, self.groups, self.moves = module, strategy, groups, moves
        self.dtype = params[0].dtype if params else torch.float32
        self.device = params[0].device if params else torch.device("cpu")
        self.param_dtype = param_dtype or self.dtype
        self.reduce_dtype = reduce_dtype or self.param_dtype
        slots, off = [], 0
        for fqn, owner, attr, p in found:
            slots.append(Slot(fqn, owner, attr, p.shape, off, p.requires_grad, tuple(tied_names.get(id(p), ()))))
            off += p.numel()
        self.slots: list[Slot] = slots
        self.layout = ShardLayout.of(off, groups)
        self.n_trainable = sum(s.trainable for s in slots)

        s, lay = self.strategy, self.layout
        flat = torch.zeros(lay.padded, dtype=self.dtype, device=self.device)
        if params:
            torch.cat([p.detach().reshape(-1) for p in params], out=flat[:off])
        moves.run(partial(moves.broadcast, flat))  # every replica starts from rank 0's parameters
        a, b = lay.range(s.optim)
        self.master = flat[a:b].clone()
        self._aliased = s.params == s.optim and self.param_dtype == self.dtype
        if self._aliased:
            self.pstore = self.master
        else:
            pa, pb = lay.range(s.params)
            self.pstore = flat[pa:pb].to(self.param_dtype).clone()
        self.full = self.pstore if s.params == "N" else torch.empty(lay.padded, dtype=self.param_dtype,
                                                                    device=self.device)
        del flat
        self._seen = self.master._version
        self.stepped = False
        # the module's parameters between passes (the optimizer's) and during them (autograd's)
        self.sharded = [self._sharded_param(sl) for sl in slots]
        self.compute = []
        for sl in slots:
            cp = nn.Parameter(torch.empty(0, dtype=self.param_dtype, device=self.device), requires_grad=sl.trainable)
            cp.data = self.full[sl.offset:sl.offset + sl.numel].view(sl.shape)
            self.compute.append(cp)
        if s.params != "N":  # after the views are made: a view of an empty storage is refused
            _free(self.full)
        self.gathered = s.params == "N"
        self.gfull: torch.Tensor | None = None
        self.gacc: torch.Tensor | None = None
        self.ograd: torch.Tensor | None = None
        self.reduced = False      # this backward's reduction is submitted
        self.ready = 0            # trainable parameters whose gradient arrived this backward
        self.inflight: list[torch.Tensor] = []  # buffers a submitted move still uses
        self.register(self.sharded)
        for sp in self.sharded:
            _OWNER[id(sp)] = weakref.ref(self)

    # -- the parameters the module shows --------------------------------------------
    def _sharded_param(self, sl: Slot) -> nn.Parameter:
        return nn.Parameter(self.optim_view(self.master, sl), requires_grad=sl.trainable)

    def local_range(self, sl: Slot, scope: str) -> tuple[int, int]:
        """The part of `sl` this rank holds at `scope`, in the parameter's own
        flat coordinates (empty: lo == hi)."""
        a, b = self.layout.range(scope)
        lo, hi = max(sl.offset, a), min(sl.offset + sl.numel, b)
        return (lo - sl.offset, hi - sl.offset) if hi > lo else (0, 0)

    def part(self, buf: torch.Tensor, sl: Slot, scope: str, buf_scope: str) -> torch.Tensor:
        """The 1-D view of `buf` (this rank's flat vector at `buf_scope`) that
        holds `sl`'s part at `scope` (a scope inside buf_scope); empty if none."""
        lo, hi = self.local_range(sl, scope)
        if hi == lo:
            return buf[:0]
        start = sl.offset + lo - self.layout.range(buf_scope)[0]
        return buf[start:start + hi - lo]

    def optim_view(self, buf: torch.Tensor, sl: Slot) -> torch.Tensor:
        """`sl` as the optimizer sees it, out of a flat vector at its scope
        (master, or the gradient): the whole parameter at o = N, else a 1-D part."""
        if self.strategy.optim == "N":
            return buf[sl.offset:sl.offset + sl.numel].view(sl.shape)
        return self.part(buf, sl, self.strategy.optim, self.strategy.optim)

    def register(self, params: list[nn.Parameter]) -> None:
        for sl, p in zip(self.slots, params, strict=True):
            sl.owner._parameters[sl.attr] = p
            for owner, attr in sl.aliases:  # a weight tied inside the unit: every name shows the same one
                owner._parameters[attr] = p

    # -- parameters: o -> p after an update, p -> N for compute ------------------------
    def stale(self) -> bool:
        """master changed since pstore was made from it: an optimizer stepped
        over this unit's parameters (every rank steps: the hook below), a load
        wrote it, or an in-place update bumped its version counter."""
        return self.stepped or self.master._version != self._seen

    def gather_move(self) -> Any:
        """What the worker runs to make `full` whole (refreshing pstore first if
        the optimizer changed master); call on the main thread."""
        s, refresh = self.strategy, self.stale()
        self._seen, self.stepped = self.master._version, False
        if s.params != "N":
            _alloc(self.full)
        self.gathered = True
        master, pstore, full, moves = self.master, self.pstore, self.full, self.moves

        def move() -> None:
            if refresh and not self._aliased:
                if s.params == s.optim:
                    pstore.copy_(master)
                else:
                    moves.gather(pstore, master.to(self.param_dtype), s.optim, s.params, "step", "params")
            if s.params != "N":
                moves.gather(full, pstore, s.params, "N", "micro", "params")
        return move

    def free(self) -> None:
        if self.strategy.params != "N" and self.gathered:
            _free(self.full)
            self.gathered = False

    # -- gradients -------------------------------------------------------------------
    def start_grads(self) -> None:
        """Before this unit's backward: a zeroed gfull for autograd to add into."""
        if self.gfull is None and self.n_trainable:
            self.gfull = torch.zeros(self.layout.padded, dtype=self.param_dtype, device=self.device)
            for sl, cp in zip(self.slots, self.compute, strict=True):
                if sl.trainable:
                    cp.grad = self.gfull[sl.offset:sl.offset + sl.numel].view(sl.shape)

    def reduce_move(self, sync: bool) -> Any:
        """What the worker runs after this unit's backward: the micro-step's
        reduction to scope g and, when `sync`, the step's reduction to scope o
        (a mean over ranks, in the module's dtype, left in `ograd`). Call on
        the main thread: it takes gfull away from autograd, and makes every
        buffer the move writes here, held in `inflight` until the move is
        settled, so what a reduction in flight holds is fixed when it is
        submitted (the Probe sees it; memory.peak_per_rank counts it)."""
        s, moves, lay = self.strategy, self.moves, self.layout
        self.reduced = True
        if not self.n_trainable:
            return lambda: None
        if self.gfull is None:  # not used in this backward: zeros keep every rank's collectives alike
            self.start_grads()
        gfull = self.gfull
        assert gfull is not None
        if s.grads == "N" and not sync:
            return lambda: None  # nothing to move: g == N accumulates in gfull
        for cp in self.compute:
            cp.grad = None
        self.gfull = None
        rd, g, o = self.reduce_dtype, s.grads, s.optim

        def held(t: torch.Tensor) -> torch.Tensor:
            self.inflight.append(t)
            return t

        def new(scope: str, dtype: torch.dtype) -> torch.Tensor:
            return held(torch.empty(lay.size(scope), dtype=dtype, device=self.device))

        held(gfull)
        src = gfull if gfull.dtype == rd else new("N", rd)
        out = acc = None
        if g != "N":
            out = new(g, rd)
            acc = self.gacc  # the earlier micro-steps' sum (None at the first): out is added to it
            if acc is None:
                acc = self.gacc = out
            if sync:  # the step consumes the sum
                if acc is not out:
                    held(acc)
                self.gacc = None
        total = acc if acc is not None else src  # at scope g
        res = new(o, rd) if g != o else total  # g == o: reduced in place (an all-reduce, or nothing at G)
        grad = res if rd == self.dtype else new(o, self.dtype)
        if sync:
            self.ograd = grad  # read by hand_grads only after the move is settled

        def move() -> None:
            if src is not gfull:
                src.copy_(gfull)
            if out is not None:
                moves.reduce(out, src, "N", g, "micro")
                if acc is not out:
                    acc.add_(out)  # type: ignore[union-attr]
                if not sync:
                    return
            if g == o and g != "G":
                moves.reduce(res, res, g, g, "step")
            elif g == "N" and o == "I":
                moves.reduce(res, src, "N", "I", "step")
                moves.reduce(res, res, "I", "I", "step")
            elif g != o:
                moves.reduce(res, total, g, o, "step")
            if grad is not res:
                grad.copy_(res)
            grad.div_(self.groups.size)
        return move

    def done_moving(self) -> None:
        """The worker is done with this unit's buffers (called on the main thread)."""
        self.inflight.clear()

    def hand_grads(self) -> None:
        """After a synced backward: the optimizer's .grad, views of ograd
        (added to a .grad the caller kept)."""
        if self.ograd is None:
            return
        for sl, sp in zip(self.slots, self.sharded, strict=True):
            if not sl.trainable:
                continue
            view = self.optim_view(self.ograd, sl)
            if sp.grad is None:
                sp.grad = view
            else:
                sp.grad.add_(view)
        self.ograd = None

    # -- what it holds -----------------------------------------------------------------
    def storages(self) -> Iterator[tuple[str, torch.Tensor]]:
        """(kind, tensor) for every buffer this unit holds now."""
        yield "params", self.pstore
        yield "optim", self.master  # counted once: as parameters when it is pstore
        yield "params", self.full
        for t in (self.gfull, self.gacc, self.ograd, *self.inflight):
            if t is not None:
                yield "grads", t
        for sp in self.sharded:
            if sp.grad is not None:
                yield "grads", sp.grad


# the unit of each optimizer parameter, by id (weakly): an optimizer step marks it stale
_OWNER: dict[int, weakref.ref[ShardUnit]] = {}


def _after_step(optimizer: torch.optim.Optimizer, _args: object, _kwargs: object) -> None:
    """After any optimizer's step: the units whose parameters it holds refresh
    pstore at their next forward. By the step, not by version counters, which
    fused optimizers and .data updates do not bump."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            ref = _OWNER.get(id(p))
            unit = ref() if ref is not None else None
            if unit is not None and any(sp is p for sp in unit.sharded):
                unit.stepped = True


register_optimizer_step_post_hook(_after_step)

# every parameter a unit took over, by id (weakly), to catch one tied across units
_TAKEN: dict[int, weakref.ref[nn.Parameter]] = {}


def _tied_elsewhere(found: list[tuple[str, nn.Module, str, nn.Parameter]]) -> str | None:
    for fqn, *_, p in found:
        ref = _TAKEN.get(id(p))
        if ref is not None and ref() is p:
            return fqn
    return None


def _take(params: list[nn.Parameter]) -> None:
    for p in params:
        key = id(p)
        _TAKEN[key] = weakref.ref(p, partial(_forget, key))


def _forget(key: int, _ref: object) -> None:
    _TAKEN.pop(key, None)

