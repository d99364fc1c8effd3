"""`paro_shard`: PaRO-DP applied unit by unit, as FSDP2's `fully_shard` is.

    for block in model.blocks:
        paro_shard(block, "IIG")
    paro_shard(model, "IIG")                      # the root: what no block owns
    opt = torch.optim.AdamW(model.parameters())   # the optimizer's shards, by name
    for step in ...:
        with model.no_sync():                     # accumulate without the step's reduction
            loss_fn(model(x0)).backward()
        loss_fn(model(x1)).backward()             # this one reduces to the optimizer's scope
        model.clip_grad_norm_(1.0)
        opt.step(); opt.zero_grad()

How a pass runs (the hooks below):
- forward of a unit: wait for its gathered parameters (or gather them), show
  the module its compute parameters, start gathering the next unit's; after
  it, show the optimizer's parameters again and free the gathered ones
  (p != N; the root keeps its own until backward);
- backward of a unit: gather again, prefetch the unit before it; when the
  last gradient of the unit lands, its reduction goes to the worker and the
  parameters are freed;
- end of backward: every unit is reduced (zeros for one no rank used), the
  worker is waited for, and after a synced backward each optimizer parameter
  gets its .grad. Every rank must use the same units in a pass (as DDP
  without find_unused_parameters): a unit's reduction is issued when its
  last gradient lands, which must happen in the same order everywhere.
Outside a forward or a backward no PaRO collective is in flight, so the
caller's own collectives (a loss all-reduce, say) are safe there.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.autograd.graph import register_multi_grad_hook
from torch.utils._pytree import tree_leaves

from hocc.paro.checkpoint import full_state_dict, load_sharded_state_dict
from hocc.paro.clip import clip_grad_norm_
from hocc.paro.layout import Groups, build_groups, intra_groups_of
from hocc.paro.moves import Moves
from hocc.paro.strategy import Strategy, parse
from hocc.paro.unit import ShardUnit


class Pass:
    """What the units under one root share: the worker, the order units ran
    in, and the state of the current forward and backward."""

    def __init__(self, moves: Moves, root: nn.Module) -> None:
        self.moves = moves
        self.root = root
        self.units: list[ShardUnit] = []
        self.order: list[ShardUnit] | None = None   # forward order, learnt on the first pass
        self._seen: list[ShardUnit] = []
        self.owner: ShardUnit | None = None         # the unit whose forward began this pass
        self.sync = True                       # set by no_sync / set_requires_gradient_sync
        self.sync_now = True                   # what this pass's backward does
        self.in_backward = False
        self.gathering: dict[int, Future[Any]] = {}
        self.pending: list[tuple[ShardUnit, Future[Any]]] = []
        self.broadcast_buffers = True
        self.buffers_due = True                # as DDP: at the forward after a synced one
        self.overlap = True                    # False: every move is waited for at once (to measure overlap)
        self.probe: Any = None                 # a memory probe (memory.Probe) sampling at each hook

    # -- order and prefetch -----------------------------------------------------------
    def _next(self, unit: ShardUnit, step: int) -> ShardUnit | None:
        """The unit after (step +1) or before (-1) this one in forward order;
        the root's forward and backward come first, so for it the first unit's
        forward and the last unit's backward."""
        if not self.order:
            return None
        if unit not in self.order:
            return self.order[0] if step > 0 else self.order[-1]
        i = self.order.index(unit) + step
        return self.order[i] if 0 <= i < len(self.order) else None

    def gather(self, unit: ShardUnit, wait: bool) -> None:
        fut = self.gathering.pop(id(unit), None)
        if fut is not None and unit.stale():  # prefetched before an optimizer step: gather again
            fut.result()
            fut = None
        if fut is None and (not unit.gathered or unit.stale()):
            fut = self.moves.submit(unit.gather_move())
        if fut is not None:
            if wait or not self.overlap:
                fut.result()
            else:
                self.gathering[id(unit)] = fut

    def free(self, unit: ShardUnit) -> None:
        """Free a unit's gathered parameters, after any gather into them ended."""
        fut = self.gathering.pop(id(unit), None)
        if fut is not None:
            fut.exception()
        unit.free()

    def prefetch(self, unit: ShardUnit | None) -> None:
        if not self.overlap:
            return
        if (unit is not None and unit is not self.owner and id(unit) not in self.gathering
                and (not unit.gathered or unit.stale())):
            self.gather(unit, wait=False)

    def sample(self, where: str) -> None:
        if self.probe is not None:
            self.probe.sample(where)

    # -- forward -----------------------------------------------------------------------
    def pre_forward(self, unit: ShardUnit) -> None:
        if self.owner is None:
            if self.in_backward:  # the last backward raised before it finished: let its moves go
                self._abandon()
            self.owner = unit
            self._seen = []
            if torch.is_grad_enabled():  # an evaluation pass leaves the pending backward's choice alone
                self.sync_now = self.sync
            if self.broadcast_buffers and self.buffers_due:
                self._sync_buffers()
        self._seen.append(unit)
        self.gather(unit, wait=True)
        unit.register(unit.compute)
        if torch.is_grad_enabled():
            self.prefetch(self._next(unit, +1))
        self.sample(f"forward {unit.module.__class__.__name__}")

    def post_forward(self, unit: ShardUnit, output: Any) -> Any:
        unit.register(unit.sharded)
        grads = [t for t in _tensors(output) if t.requires_grad]
        if grads:
            register_multi_grad_hook(grads, lambda _g, u=unit: self.pre_backward(u), mode="any")
        if unit is not self.owner:  # the root keeps its own: its backward comes first
            self.free(unit)
        if unit is self.owner:
            self.owner = None
            self.buffers_due = not torch.is_grad_enabled() or self.sync_now
            if self.order is None and grads:
                self.order = [u for u in self._seen if u is not unit]
            for fut in list(self.gathering.values()):
                fut.result()
            if not grads:  # no backward follows (evaluation): nothing stays gathered
                for u in self.units:
                    self.free(u)
        return output

    def _sync_buffers(self) -> None:
        """Rank 0's buffers to every rank, as DDP does at each forward."""
        self.moves.broadcast_all([b for b in self.root.buffers() if b is not None])

    # -- backward ----------------------------------------------------------------------
    def pre_backward(self, unit: ShardUnit) -> None:
        if not self.in_backward:
            self.in_backward = True
            torch.autograd.Variable._execution_engine.queue_callback(self.finish_backward)
        self.gather(unit, wait=True)
        unit.start_grads()
        self.prefetch(self._next(unit, -1))
        self.sample(f"backward {unit.module.__class__.__name__}")

    def grad_ready(self, unit: ShardUnit) -> None:
        if unit.gfull is None and not unit.reduced:
            raise RuntimeError(
                f"paro_shard: {type(unit.module).__name__}'s parameters got gradients before its backward began; "
                f"its forward's output holds no tensor hocc found (tensors, lists, tuples, dicts and other "
                f"pytrees are searched). Return tensors from a wrapped module, or wrap its parent instead")
        unit.ready += 1
        if unit.ready == unit.n_trainable and not unit.reduced:
            self.post_backward(unit)

    def post_backward(self, unit: ShardUnit) -> None:
        """Submit this unit's reduction, then wait for the one before it: one
        reduction in flight while autograd computes, so at most two units'
        gradient buffers are held whole (FSDP2 bounds its memory the same way)."""
        self.pending.append((unit, self.moves.submit(unit.reduce_move(self.sync_now))))
        if unit.n_trainable == len(unit.slots):  # frozen weights may still be read for the input's gradient
            self.free(unit)
        self.sample(f"reduce {unit.module.__class__.__name__}")
        if len(self.pending) > (1 if self.overlap else 0):
            self._settle(len(self.pending) - (1 if self.overlap else 0))

    def _settle(self, upto: int) -> None:
        """Wait for pending[:upto]; their buffers are let go here, on this thread."""
        done, self.pending = self.pending[:upto], self.pending[upto:]
        first: BaseException | None = None
        for unit, fut in done:
            try:
                fut.result()
            except BaseException as e:  # noqa: BLE001 - every move is waited for; the first error is raised
                first = first or e
            unit.done_moving()
        if first is not None:
            raise first

    def finish_backward(self) -> None:
        try:
            for unit in [*reversed(self.order or self.units), *self.units]:  # the order's, then the root
                if not unit.reduced:
                    self.post_backward(unit)
            self._settle(len(self.pending))
            self.sample("end of backward")
            if self.sync_now:
                for unit in self.units:
                    unit.hand_grads()
        finally:
            self.pending.clear()
            for unit in self.units:
                self.free(unit)
                unit.reduced, unit.ready = False, 0
            self.in_backward = False

    def _abandon(self) -> None:
        """After a backward that raised: wait for its moves, and drop what it
        and the micro-steps before it accumulated (that step's gradients are lost)."""
        for _, fut in self.pending:
            fut.exception()
        self.pending.clear()
        for unit in self.units:
            unit.done_moving()
            self.free(unit)
            unit.reduced, unit.ready, unit.gfull, unit.gacc, unit.ograd = False, 0, None, None, None
            for cp in unit.compute:
                cp.grad = None
        self.in_backward = False


def _tensors(obj: Any) -> Iterator[torch.Tensor]:
    """The tensors in a forward's output (any pytree: tensors, lists, tuples, dicts, named tuples, ...)."""
    return (t for t in tree_leaves(obj) if isinstance(t, torch.Tensor))


class ParoModule:
    """Methods a module gains from paro_shard (its class becomes a subclass
    of this and of its own class, as with FSDP2)."""

    _paro_unit: ShardUnit
    _paro_pass: Pass

    @contextmanager
    def no_sync(self) -> Iterator[None]:
        """Forward and backward inside do only the micro-step's reduction
        (scope g), as DDP's no_sync: the backward after it reduces to the
        optimizer's scope and sets .grad."""
        p = self._paro_pass
        old, p.sync = p.sync, False
        try:
            yield
        finally:
            p.sync = old

    def set_requires_gradient_sync(self, sync: bool) -> None:
        self._paro_pass.sync = bool(sync)

    def paro_units(self) -> list[ShardUnit]:
        return list(self._paro_pass.units)

    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
        """torch.nn.utils.clip_grad_norm_ over the whole model: each rank
        holds a shard of the gradients at the optimizer's scope, so the norm
        is summed over the ranks that hold distinct shards."""
        return clip_grad_norm_(self._paro_pass, max_norm, norm_type)

    def paro_state_dict(self) -> dict[str, torch.Tensor]:
        """The whole model's parameters (the module's own shapes and dtype) and
        persistent buffers, gathered on every rank, by the names of a plain
        model's state_dict() (tied ones under each name): what a plain model's
        load_state_dict, or transformers' save_pretrained(state_dict=...), takes."""
        return full_state_dict(self)

    def load_paro_state_dict(self, state_dict: dict[str, Any], strict: bool = True) -> Any:
        """A plain model's state_dict() (or paro_state_dict's, or DCP's sharded
        one) into this model, as torch's load_state_dict takes it (strict, tied
        names, the missing and unexpected keys returned). Collective."""
        return load_sharded_state_dict(self, state_dict, strict)


def paro_shard(module: nn.Module, strategy: str | Strategy, *, groups: Groups | None = None,
               intra_groups: Sequence[Sequence[int]] | None = None, mesh: Any = None, mesh_dim: str | int = -1,
               param_dtype: torch.dtype | None = None, reduce_dtype: torch.dtype | None = None,
               comm: str = "hocc", algo: str | None = None, broadcast_buffers: bool = True,
               overlap: bool = True) -> nn.Module:
    """Make `module` a PaRO unit under `strategy` ('NIG', 'IIG', ..., see
    hocc/paro/strategy.py) and return it. Apply to the blocks first, then to
    the root: a unit owns the parameters no inner unit owns.

    The intra-group (the I scope) is the host (hocc's topology) unless
    `intra_groups` (rank lists) or a 2-D DeviceMesh and its intra dimension
    say otherwise; `groups` reuses another unit's (`module.paro_units()[0].groups`).
    param_dtype: the dtype forward and backward run in and parameters are
    gathered in (bf16, say); reduce_dtype: gradients are reduced in it
    (default param_dtype); the optimizer's parameters keep the module's dtype.
    comm: 'hocc' (hocc's calls, `algo` passed on) or 'torch' (torch.distributed's
    own). broadcast_buffers: rank 0's buffers to all at every forward, as DDP.
    overlap=False waits for every gather and reduction where it is issued (no
    prefetch, nothing behind compute): to measure what overlap hides."""
    s = parse(strategy)
    if not dist.is_initialized():
        raise RuntimeError("paro_shard needs torch.distributed: call dist.init_process_group first")
    if isinstance(module, ParoModule):
        raise ValueError(f"paro_shard: {type(module).__name__} is already a PaRO unit")
    if mesh is not None:
        intra_groups = intra_groups_of(mesh, mesh_dim if mesh_dim != -1 else 1)
    inner = [m for m in module.modules() if m is not module and isinstance(m, ParoModule)]
    if groups is None:
        groups = inner[0]._paro_unit.groups if inner and intra_groups is None else build_groups(intra_groups)
    if any(m._paro_unit.groups is not groups for m in inner):
        raise ValueError("paro_shard: the inner units use other groups; give every unit of a model the same "
                         "intra-groups (or pass groups=)")
    device = next((p.device for p in module.parameters()), torch.device("cpu"))
    moves = Moves(groups, comm, algo, device)
    unit = ShardUnit(module, s, groups, moves, param_dtype, reduce_dtype)
    shared = Pass(moves, module)
    shared.broadcast_buffers, shared.overlap = broadcast_buffers, overlap
    adopted = {id(p) for m in inner for p in [m._paro_pass]}
    for m in inner:  # the inner units join this root's pass and worker
        if id(m._paro_pass) in adopted:
            for u in m._paro_pass.units:
                u.moves = moves
                shared.units.append(u)
            adopted.discard(id(m._paro_pass))
        m._paro_pass = shared
    shared.units.append(unit)
    if broadcast_buffers:
        shared._sync_buffers()
    cls = type(module)
    module.__class__ = type(f"Paro{cls.__name__}", (ParoModule, cls), {})
    object.__setattr__(module, "_paro_unit", unit)
    object.__setattr__(module, "_paro_pass", shared)
    module.register_forward_pre_hook(lambda m, _a: m._paro_pass.pre_forward(m._paro_unit))
    # always_call: a forward that raises still shows the optimizer's parameters again and ends the pass
    module.register_forward_hook(lambda m, _a, out: m._paro_pass.post_forward(m._paro_unit, out), always_call=True)
    for sl, cp in zip(unit.slots, unit.compute, strict=True):
        if sl.trainable:
            cp.register_post_accumulate_grad_hook(lambda _p, m=module: m._paro_pass.grad_ready(m._paro_unit))
    return module
