"""State dicts of a PaRO model and its optimizer: gathered whole, or sharded
for torch.distributed.checkpoint (DCP), which saves each rank's part without
gathering and loads it back under any strategy and any world size.

    full_state_dict         every parameter whole on every rank (export, comparison)
    sharded_state_dict      each parameter as a DTensor in its own shape over a
                            1-D mesh of the world ranks, Shard(0) (a 0-d one:
                            Replicate), as FSDP2's state_dict gives it; buffers
                            as plain tensors
    optim_state_dict        the optimizer's state keyed by parameter name: per-element
                            states (Adam's moments, SGD's momentum) as DTensors as
                            the parameters are, scalar ones (Adam's step) plain, and
                            param_groups with names in place of indices
    load_sharded_state_dict / load_full_state_dict / load_optim_state_dict: the inverses
    save / load             the two through dcp.save / dcp.load

Where the data comes from: a rank's G part of a unit is one block of the
unit's flat vector on the rail-major layout (layout.py), which a parameter
may start or end inside, while a DTensor's Shard(0) chunk is the rows
torch.chunk gives rank r. The two do not line up, so per unit one
all_to_all_single over the world moves each rank's G part to the ranks whose
chunks it overlaps (and back, on loading): every rank sends about its G
block and receives about its chunks, 1/W of the unit each way, and holds
only those two buffers beyond what the state dict keeps. Why the G part,
whatever the strategy: the G ranges partition every unit's flat vector and
every rank holds its own (G is inside I inside N). A loading rank gathers
G -> o into the optimizer's scope `master` (and its optimizer's per-element
state the same way); loading writes `master` in place, so each unit
refreshes its other copies at its next forward.

Checkpoints written before (ShardedTensors over each parameter's flattened
shape [numel]) still load: `load` reads the checkpoint's metadata and makes
the template of such a parameter a DTensor over [numel], whose chunks DCP
reads from the saved 1-D ones.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator, Sequence
from functools import lru_cache, partial
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.nn.modules.module import _IncompatibleKeys

from hocc.paro.moves import Logged

if TYPE_CHECKING:
    from hocc.paro.shard import ParoModule
    from hocc.paro.unit import ShardUnit, Slot


def full_state_dict(model: ParoModule) -> dict[str, torch.Tensor]:
    """Every parameter whole, in its own shape and the module's dtype, and
    every persistent buffer, by the names of model.state_dict() and in its
    order; on every rank. A tied parameter is under each of its names, the
    same tensor under all of them (as torch's own state_dict gives it)."""
    out: dict[str, torch.Tensor] = {}
    tied = _tied_names(model)
    for u, named in _units(model):
        flat = torch.empty(u.layout.padded, dtype=u.dtype, device=u.device)
        u.moves.run(partial(u.moves.gather, flat, u.master, u.strategy.optim, "N", "load", "params"))
        for name, _, sl in named:
            out[name] = flat[sl.offset:sl.offset + sl.numel].view(sl.shape).clone()
            for alias in tied.get(name, ()):
                out[alias] = out[name]
    for name, b in _buffers(model).items():
        out[name] = b.detach().clone()
    order = list(model.state_dict(keep_vars=True))  # type: ignore[attr-defined]  # the shards: no copies
    return {k: out[k] for k in order if k in out} | out


# -- where things are -------------------------------------------------------------------

def _units(model: ParoModule) -> Iterator[tuple[ShardUnit, list[tuple[str, int, Slot]]]]:
    """Each unit (in the pass's order, the same on every rank) with its
    slots' state-dict names and indices."""
    prefix = {id(m): n + "." if n else "" for n, m in model.named_modules()}  # type: ignore[attr-defined]
    for u in model._paro_pass.units:
        base = prefix[id(u.module)]
        yield u, [(base + sl.fqn, i, sl) for i, sl in enumerate(u.slots)]


def _buffers(model: ParoModule) -> dict[str, torch.Tensor]:
    """The buffers state_dict() names (the persistent ones)."""
    out: dict[str, torch.Tensor] = {}
    for name, m in model.named_modules():  # type: ignore[attr-defined]
        for attr, b in m._buffers.items():
            if b is not None and attr not in m._non_persistent_buffers_set:
                out.setdefault(f"{name}.{attr}" if name else attr, b)
    return out


def _tied_names(model: ParoModule) -> dict[str, list[str]]:
    """A tied parameter's first name (the one _units gives) -> its other
    names in model.state_dict() (a weight tied inside a unit: an output head
    that reuses the embedding's, say)."""
    prefix = {id(m): n + "." if n else "" for n, m in model.named_modules()}  # type: ignore[attr-defined]
    return {name: [prefix[id(owner)] + attr for owner, attr in sl.aliases]
            for _, named in _units(model) for name, _, sl in named if sl.aliases}


@lru_cache(maxsize=16)
def _rank_of_block(hosts: tuple[tuple[int, ...], ...], rails: tuple[tuple[int, ...], ...]) -> tuple[int, ...]:
    """The world rank whose G shard is each block: on the rail-major layout
    (layout.py) rank r's is block position(r) * n_groups + rail_index(r)."""
    out = [0] * sum(len(h) for h in hosts)
    for h in hosts:
        for pos, r in enumerate(h):
            out[pos * len(hosts) + rails[pos].index(r)] = r
    return tuple(out)


def _g_parts(u: ShardUnit, sl: Slot) -> list[tuple[int, int, int]]:
    """(rank, lo, hi): every rank's non-empty G part of `sl`, in its
    flattened coordinates (the blocks it spans, not all W ranks)."""
    if sl.numel == 0:
        return []
    owner, block = _rank_of_block(tuple(u.groups.hosts), tuple(u.groups.rails)), u.layout.block
    out = []
    for b in range(sl.offset // block, (sl.offset + sl.numel - 1) // block + 1):
        out.append((owner[b], max(b * block - sl.offset, 0), min((b + 1) * block - sl.offset, sl.numel)))
    return out


# -- DTensors: each rank's G parts <-> its Shard(0) chunks ---------------------------

Form = tuple[tuple[int, ...], bool]           # a slot's DTensor: (its shape, replicated)
Piece = tuple[int, int, int, int]             # (rank, slot index, lo, hi): [lo, hi) of the flattened slot
_MESHES: dict[tuple[Any, str], DeviceMesh] = {}


def _mesh(u: ShardUnit) -> DeviceMesh:
    """The 1-D mesh of the world ranks, in order, on the unit's device type:
    made once (it takes the default group, as FSDP2's 1-D mesh does)."""
    key = (u.groups.world, u.device.type)
    if key not in _MESHES:
        _MESHES[key] = DeviceMesh(u.device.type, list(range(u.groups.size)))
    return _MESHES[key]


def _form(shape: Sequence[int]) -> Form:
    """Shard(0) over the rows, but a 0-d parameter has none: Replicate."""
    return tuple(shape), len(shape) == 0


def _chunk(form: Form, rank: int, world: int) -> tuple[int, int]:
    """[a, b) of the flattened tensor that `rank` holds: its Shard(0) rows, as
    torch.chunk (and DTensor) cut them (the last ranks' empty when rows < W),
    or all of it when replicated."""
    shape, replicated = form
    if replicated or not shape:
        return 0, math.prod(shape)
    rows, row = shape[0], math.prod(shape[1:])
    per = -(-rows // world)
    return min(rank * per, rows) * row, min((rank + 1) * per, rows) * row


def _local_shape(form: Form, rank: int, world: int) -> tuple[int, ...]:
    shape, replicated = form
    if replicated or not shape:
        return shape
    a, b = _chunk(form, rank, world)
    return ((b - a) // max(math.prod(shape[1:]), 1), *shape[1:])


def _dtensor(u: ShardUnit, local: torch.Tensor, form: Form) -> DTensor:
    """`local` (this rank's chunk) as the DTensor of `form`; its global shape
    and stride are given, so no rank checks another's (no collective)."""
    shape, replicated = form
    stride = tuple(math.prod(shape[d + 1:]) for d in range(len(shape)))
    return DTensor.from_local(local, _mesh(u), [Replicate() if replicated else Shard(0)], run_check=False,
                              shape=torch.Size(shape), stride=stride)


def _pieces(u: ShardUnit, forms: dict[int, Form]) -> tuple[list[Piece], list[Piece]]:
    """For the slots in `forms` (slot index -> its DTensor's form): the pieces
    of this rank's G part that go to each rank's chunk (give), and the pieces of
    its own chunks that come from each rank's G part (take). Each is sorted by
    rank, then slot: all_to_all_single's order on the sending and the
    receiving side alike (a rank owns one block, so one piece per rank and slot)."""
    world, me = u.groups.size, u.groups.rank
    give: list[Piece] = []
    take: list[Piece] = []
    for i, form in forms.items():
        lo, hi = u.local_range(u.slots[i], "G")
        for r in range(world) if hi > lo else ():
            a, b = _chunk(form, r, world)
            if max(a, lo) < min(b, hi):
                give.append((r, i, max(a, lo), min(b, hi)))
        a, b = _chunk(form, me, world)
        for r, lo, hi in _g_parts(u, u.slots[i]):
            if max(a, lo) < min(b, hi):
                take.append((r, i, max(a, lo), min(b, hi)))
    return sorted(give), sorted(take)


def _all_to_all(u: ShardUnit, give: list[Piece], take: list[Piece], read: Callable[[Piece], torch.Tensor],
                dtype: torch.dtype) -> torch.Tensor:
    """One all_to_all_single over the world, on the unit's worker (every rank
    makes it for the same unit at the same point): sends read(p) for each
    piece p of `give`; returns what came for `take`, in its order."""
    world = u.groups.size
    empty = torch.empty(0, dtype=dtype, device=u.device)
    send = torch.cat([read(p).to(dtype) for p in give]) if give else empty
    recv = torch.empty(sum(hi - lo for *_, lo, hi in take), dtype=dtype, device=u.device)

    def sizes(pieces: list[Piece]) -> list[int]:
        n = [0] * world
        for r, _, lo, hi in pieces:
            n[r] += hi - lo
        return n

    def move() -> None:
        u.moves.trace.append(Logged("all_to_all", "world", "load", "params", send.numel()))
        if world == 1:
            recv.copy_(send)
        else:
            dist.all_to_all_single(recv, send, sizes(take), sizes(give), group=u.groups.world)
    u.moves.run(move)
    return recv


def _to_chunks(u: ShardUnit, forms: dict[int, Form], dtype: torch.dtype,
               gparts: dict[int, torch.Tensor] | None) -> dict[int, DTensor]:
    """A DTensor per slot in `forms`, its local chunk made of every rank's G
    part of it (gparts[i]: this rank's, 1-D): one all_to_all for the unit.
    gparts None: chunks left unwritten, as dcp.load's template (no collective)."""
    world, me = u.groups.size, u.groups.rank
    local = {i: torch.empty(_local_shape(f, me, world), dtype=dtype, device=u.device) for i, f in forms.items()}
    if gparts is not None and forms:
        give, take = _pieces(u, forms)
        g0 = {i: u.local_range(u.slots[i], "G")[0] for i in forms}
        recv = _all_to_all(u, give, take, lambda p: gparts[p[1]][p[2] - g0[p[1]]:p[3] - g0[p[1]]], dtype)
        at = 0
        for _, i, lo, hi in take:  # the G parts cover every element of every chunk once
            a = _chunk(forms[i], me, world)[0]
            local[i].view(-1)[lo - a:hi - a] = recv[at:at + hi - lo]
            at += hi - lo
    return {i: _dtensor(u, local[i], forms[i]) for i in forms}


def _from_chunks(u: ShardUnit, values: dict[int, DTensor], gbuf: torch.Tensor) -> None:
    """The inverse of _to_chunks: this rank's G part of each slot's DTensor,
    from every rank's chunk of it, into gbuf (the unit's vector at scope G).
    One all_to_all for the unit."""
    world, me = u.groups.size, u.groups.rank
    forms = {i: _form_of(v) for i, v in values.items()}
    local = {i: v.to_local().reshape(-1) for i, v in values.items()}
    a = {i: _chunk(f, me, world)[0] for i, f in forms.items()}
    give, take = _pieces(u, forms)
    recv = _all_to_all(u, take, give, lambda p: local[p[1]][p[2] - a[p[1]]:p[3] - a[p[1]]], gbuf.dtype)
    at = 0
    for _, i, lo, hi in give:
        sl = u.slots[i]
        g0 = u.local_range(sl, "G")[0]
        u.part(gbuf, sl, "G", "G")[lo - g0:hi - g0] = recv[at:at + hi - lo]
        at += hi - lo


def _form_of(v: DTensor) -> Form:
    return tuple(v.shape), v.placements[0].is_replicate()


def _check_dtensor(name: str, v: DTensor, sl: Slot, u: ShardUnit) -> DTensor:
    """A DTensor this module can move: over a 1-D mesh of the world ranks in
    order, Shard(0) or Replicate (FSDP2's form too), in the parameter's shape
    or flattened (checkpoints written before DTensors)."""
    mesh = v.device_mesh
    if mesh.ndim != 1 or mesh.mesh.tolist() != list(range(u.groups.size)) or not (
            v.placements[0].is_replicate() or v.placements[0] == Shard(0)):
        raise ValueError(f"{name}: a DTensor on mesh {mesh.mesh.tolist()} with placements {v.placements}; loading "
                         f"takes Shard(0) or Replicate over a 1-D mesh of all {u.groups.size} ranks (redistribute it, "
                         f"or pass full_tensor())")
    if tuple(v.shape) not in (tuple(sl.shape), (sl.numel,)):
        raise ValueError(f"{name}: a DTensor of shape {tuple(v.shape)}, but the parameter's is {tuple(sl.shape)}")
    want = _local_shape(_form_of(v), u.groups.rank, u.groups.size)
    if tuple(v.to_local().shape) != want:
        raise ValueError(f"{name}: this rank's chunk has shape {tuple(v.to_local().shape)}, not torch.chunk's {want}")
    return v


def _plain_part(name: str, value: Any, sl: Slot, lo: int, hi: int) -> torch.Tensor:
    """[lo, hi) of a whole saved value of `sl`, flattened."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name}: expected a tensor or a DTensor, got {type(value).__name__}")
    if value.numel() != sl.numel or (value.dim() > 1 and value.shape != sl.shape):
        raise ValueError(f"{name}: a tensor of shape {tuple(value.shape)}, but the parameter's is {tuple(sl.shape)}")
    return value.detach().reshape(-1)[lo:hi]


def _fill_g(u: ShardUnit, gbuf: torch.Tensor, values: dict[int, tuple[str, Any]]) -> None:
    """Each value's part in this rank's G range into gbuf (slot index -> (its
    name, a DTensor or a whole tensor)): the DTensors' by one all_to_all for
    all of them, the whole ones' by slicing. Collective when any is a DTensor
    (then on every rank: the ranks' values are of the same kinds)."""
    moved: dict[int, DTensor] = {}
    for i, (name, v) in values.items():
        sl = u.slots[i]
        if isinstance(v, DTensor):
            moved[i] = _check_dtensor(name, v, sl, u)
            continue
        lo, hi = u.local_range(sl, "G")
        if hi > lo:
            u.part(gbuf, sl, "G", "G")[:] = _plain_part(name, v, sl, lo, hi)
    if moved:
        _from_chunks(u, moved, gbuf)


def _gather_to_optim(u: ShardUnit, gbuf: torch.Tensor) -> torch.Tensor:
    """Every rank's G part (gbuf) gathered into a new vector at the optimizer's scope."""
    o = u.strategy.optim
    out = torch.empty(u.layout.size(o), dtype=gbuf.dtype, device=gbuf.device)
    u.moves.run(partial(u.moves.gather, out, gbuf, "G", o, "load", "params"))
    return out


# -- parameters and buffers -------------------------------------------------------------

def sharded_state_dict(model: ParoModule) -> dict[str, Any]:
    """The model's parameters as DTensors in their own shapes, Shard(0) over
    a 1-D mesh of the world (a 0-d one Replicate; an empty one a plain
    tensor), in the module's dtype, and its persistent buffers as plain
    tensors (rank 0's), by the names of model.state_dict() (a tied parameter
    under each of its names): FSDP2's form, what dcp.save writes and the
    template dcp.load fills under another strategy or world size. Each rank's
    chunks are moved from the ranks' G parts, one all_to_all per unit.
    Collective."""
    return _model_sd(model, fill=True)


def _model_sd(model: ParoModule, fill: bool, flat: frozenset[str] = frozenset()) -> dict[str, Any]:
    """sharded_state_dict; fill=False: chunks unwritten (a template for
    dcp.load, no data moved). flat: the names to make over [numel] (an old
    checkpoint's form)."""
    out: dict[str, Any] = {}
    tied = _tied_names(model)
    for u, named in _units(model):
        o = u.strategy.optim
        forms = {i: _form((sl.numel,) if name in flat else sl.shape) for name, i, sl in named if sl.numel}
        parts = {i: u.part(u.master, sl, "G", o).detach() for _, i, sl in named} if fill else None
        chunks = _to_chunks(u, forms, u.dtype, parts)
        for name, i, sl in named:
            out[name] = chunks[i] if i in chunks else u.master.new_zeros(sl.shape)
            for alias in tied.get(name, ()):  # the same DTensor: dcp.load fills it once per name
                out[alias] = out[name]
    out.update(_rank0_buffers(model))
    return out


def _rank0_buffers(model: ParoModule) -> dict[str, torch.Tensor]:
    """Copies of the persistent buffers as world rank 0 holds them (the
    ones every rank takes at the next forward, as DDP's): the ranks' own may
    differ (BatchNorm's statistics of their own batches), and DCP writes a
    plain tensor once, from whichever rank it picks."""
    bufs = {name: b.detach().clone() for name, b in _buffers(model).items()}
    model._paro_pass.moves.broadcast_all(list(bufs.values()))
    return bufs


def load_sharded_state_dict(model: ParoModule, sd: dict[str, Any], strict: bool = True) -> _IncompatibleKeys:
    """Load parameters and buffers from a sharded state dict (DTensors as
    sharded_state_dict makes and dcp.load fills, or FSDP2's: Shard(0) or
    Replicate over a 1-D mesh of the world) or a full one (whole
    tensors: full_state_dict's, or an unwrapped model's state_dict()), or a
    mix. Each rank takes its G part of every parameter (from the ranks'
    DTensor chunks: one all_to_all per unit), the unit gathers the
    parts to the optimizer's scope and writes `master`, so master ends up with
    exactly the saved values on every rank (the next forward refreshes the
    rest). A tied parameter takes its first name's value, else any other
    name's. strict, as torch's load_state_dict: every name of
    model.state_dict() (tied ones under each name, persistent buffers) must
    be in `sd` and nothing else, else RuntimeError naming both lists; either
    way the missing and unexpected keys are returned. Collective: every rank
    calls it, with the same keys."""
    units = list(_units(model))
    tied = _tied_names(model)
    names = {name for _, named in units for name, _, _ in named} | {a for al in tied.values() for a in al}
    persistent = _buffers(model)
    missing = [k for k in model.state_dict(keep_vars=True) if k not in sd]  # type: ignore[attr-defined]
    unexpected = [k for k in sd if k not in names and k not in persistent]
    if strict and (missing or unexpected):
        def quoted(keys: list[str]) -> str:
            return ", ".join(f'"{k}"' for k in keys)
        lines = [f"Missing key(s) in state_dict: {quoted(missing)}. " if missing else "",
                 f"Unexpected key(s) in state_dict: {quoted(unexpected)}. " if unexpected else ""]
        raise RuntimeError(f"Error(s) in loading state_dict for {type(model).__name__}:\n\t"
                           + "\n\t".join(x for x in lines if x))
    for u, named in units:
        g0, g1 = u.layout.range("G")
        gbuf = torch.zeros(g1 - g0, dtype=u.dtype, device=u.device)
        source = {name: next((k for k in (name, *tied.get(name, ())) if k in sd), None) for name, _, _ in named}
        _fill_g(u, gbuf, {i: (key, sd[key]) for name, i, _ in named if (key := source[name]) is not None})
        present = [source[name] is not None for name, _, _ in named]
        if not any(present):
            continue  # (the same on every rank: the keys are)
        out = _gather_to_optim(u, gbuf)
        o = u.strategy.optim
        with torch.no_grad():  # in place: master's version changes, so the unit refreshes its copies
            if all(present):
                u.master.copy_(out)
            else:  # strict=False: keep the parameters `sd` does not have
                for (_, _, sl), here in zip(named, present, strict=True):
                    if here:
                        u.part(u.master, sl, o, o)[:] = u.part(out, sl, o, o)
    with torch.no_grad():
        for name, b in persistent.items():
            if name in sd:
                b.copy_(sd[name])
    return _IncompatibleKeys(missing, unexpected)


def load_full_state_dict(model: ParoModule, sd: dict[str, torch.Tensor], strict: bool = True) -> _IncompatibleKeys:
    """Load whole tensors (full_state_dict's, or an unwrapped model's
    state_dict()) into the wrapped model: load_sharded_state_dict, which
    takes either; named for the call sites that mean this one."""
    return load_sharded_state_dict(model, sd, strict)


# -- optimizer state --------------------------------------------------------------------

def _param_index(model: ParoModule) -> dict[int, tuple[str, ShardUnit, int]]:
    """id(the optimizer's parameter, a unit's `sharded`) -> (its name, unit, slot index)."""
    return {id(u.sharded[i]): (name, u, i) for u, named in _units(model) for name, i, _ in named}


def _per_element(v: Any, p: torch.Tensor) -> bool:
    """A state tensor with one value per element of the parameter (sharded
    as the parameter is), as opposed to a scalar (Adam's step). Decided by
    shape, which is the same on every rank: at scopes I and G every sharded
    parameter is 1-D, perhaps empty, and scalars are 0-D."""
    return isinstance(v, torch.Tensor) and v.dim() > 0 and v.shape == p.shape


def _init_state(optimizer: torch.optim.Optimizer) -> None:
    """Create a fresh optimizer's state (as torch's get_optimizer_state_dict
    does): one step with zero gradients and lr 0, which leaves the parameters
    as they are, so that its state dict can be a template for dcp.load."""
    params = [p for g in optimizer.param_groups for p in g["params"]]
    if optimizer.state or any(p.grad is not None for p in params):
        return
    for p in params:
        if p.requires_grad:
            p.grad = torch.zeros_like(p)
    lrs = [(g, g["lr"]) for g in optimizer.param_groups if "lr" in g]
    try:
        for g, lr in lrs:
            g["lr"] = torch.zeros_like(lr) if isinstance(lr, torch.Tensor) else 0.0
        optimizer.step()
    finally:
        for g, lr in lrs:
            g["lr"] = lr
        for p in params:
            p.grad = None


def optim_state_dict(model: ParoModule, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimizer's state by parameter name, for DCP: {"state": {name:
    {key: value}}, "param_groups": [{..., "params": [names]}]}, the form of
    torch's get_optimizer_state_dict. Per-element states are DTensors as
    sharded_state_dict gives the parameters (moved from the ranks' G parts:
    one all_to_all per unit and state), scalar ones plain tensors, so a
    model under another strategy or world size can load them. An optimizer
    with no state yet gets one first (_init_state), so that this is the
    template dcp.load fills. Collective."""
    return _optim_sd(model, optimizer, fill=True)


def _optim_sd(model: ParoModule, optimizer: torch.optim.Optimizer, fill: bool,
              flat: frozenset[str] = frozenset()) -> dict[str, Any]:
    """optim_state_dict; fill=False: per-element chunks unwritten (a template
    for dcp.load, no data moved). flat: the "name.key"s to make over [numel]."""
    _init_state(optimizer)
    index = _param_index(model)
    state: dict[str, dict[str, Any]] = {}
    groups: list[dict[str, Any]] = []
    held: dict[int, list[tuple[str, int, torch.Tensor]]] = {}  # id(unit) -> its parameters this optimizer holds
    for group in optimizer.param_groups:
        names = []
        for p in group["params"]:
            if id(p) not in index:
                raise ValueError("optim_state_dict: the optimizer holds a parameter that is not one of the model's "
                                 "(create it over model.parameters() after paro_shard)")
            name, u, i = index[id(p)]
            names.append(name)
            held.setdefault(id(u), []).append((name, i, p))
            state[name] = {key: None if _per_element(v, p) else v.detach().clone() if isinstance(v, torch.Tensor)
                           else v for key, v in optimizer.state.get(p, {}).items()}  # None: filled below
        groups.append({**{k: v for k, v in group.items() if k not in ("params", "param_names")}, "params": names})
    for u, _ in _units(model):  # by unit, in the pass's order, which is the same on every rank
        o, mine = u.strategy.optim, held.get(id(u), [])
        kinds = sorted({(key, v.dtype) for _, _, p in mine for key, v in optimizer.state.get(p, {}).items()
                        if _per_element(v, p)}, key=str)
        for key, dtype in kinds:
            has = [(name, i, p) for name, i, p in mine if _per_element(optimizer.state.get(p, {}).get(key), p)]
            forms: dict[int, Form] = {}
            parts: dict[int, torch.Tensor] = {}
            for name, i, p in has:
                sl, v = u.slots[i], optimizer.state[p][key].detach()
                if not sl.numel:
                    state[name][key] = v.clone()
                    continue
                forms[i] = _form((sl.numel,) if f"{name}.{key}" in flat else sl.shape)
                (lo_o, _), (lo, hi) = u.local_range(sl, o), u.local_range(sl, "G")
                if hi > lo:
                    parts[i] = v.reshape(-1)[lo - lo_o:hi - lo_o]
            chunks = _to_chunks(u, forms, dtype, parts if fill else None)
            for name, i, _ in has:
                if i in chunks:
                    state[name][key] = chunks[i]
    return {"state": state, "param_groups": groups}


def load_optim_state_dict(model: ParoModule, optimizer: torch.optim.Optimizer, sd: dict[str, Any]) -> None:
    """Load what optim_state_dict made (after dcp.load, under any strategy or
    world size) into `optimizer`, which may be fresh (no state yet). Each
    per-element state (a DTensor) moves from the ranks' chunks to their G
    parts and is gathered to the optimizer's scope, unit by unit, into the
    shape of the sharded parameter; then the optimizer's own load_state_dict
    takes them by index, with the saved param_groups' hyperparameters (groups
    must hold the same parameters, in any order). Collective: every rank
    calls it, with the same keys."""
    index = _param_index(model)
    saved: dict[str, dict[str, Any]] = sd["state"]
    local: dict[str, dict[str, Any]] = {}
    for u, named in _units(model):
        o = u.strategy.optim
        g0, g1 = u.layout.range("G")
        kinds = sorted({(key, v.dtype) for name, _, _ in named
                        for key, v in saved.get(name, {}).items() if isinstance(v, DTensor)}, key=str)
        for key, dtype in kinds:  # one all_to_all and one gather per (unit, key): the same list on every rank
            gbuf = torch.zeros(g1 - g0, dtype=dtype, device=u.device)
            have = {i: name for name, i, _ in named if isinstance(saved.get(name, {}).get(key), DTensor)}
            _fill_g(u, gbuf, {i: (f"{name}.{key}", saved[name][key]) for i, name in have.items()})
            out = _gather_to_optim(u, gbuf)
            for i, name in have.items():
                local.setdefault(name, {})[key] = u.part(out, u.slots[i], o, o).reshape(u.sharded[i].shape).clone()
        for name, i, _ in named:
            for key, v in saved.get(name, {}).items():
                if isinstance(v, torch.Tensor) and not isinstance(v, DTensor):
                    # an empty parameter's per-element state is saved plain: in this strategy's shape
                    v = v.clone().reshape(u.sharded[i].shape) if v.dim() and not v.numel() else v.clone()
                if not isinstance(v, DTensor):
                    local.setdefault(name, {})[key] = v
    state: dict[int, dict[str, Any]] = {}
    groups: list[dict[str, Any]] = []
    if len(sd["param_groups"]) != len(optimizer.param_groups):
        raise ValueError(f"load_optim_state_dict: {len(sd['param_groups'])} saved param_groups, but the optimizer "
                         f"has {len(optimizer.param_groups)}")
    i = 0
    for n, (group, want) in enumerate(zip(optimizer.param_groups, sd["param_groups"], strict=True)):
        names = []
        for p in group["params"]:
            if id(p) not in index:
                raise ValueError("load_optim_state_dict: the optimizer holds a parameter that is not one of the "
                                 "model's (create it over model.parameters() after paro_shard)")
            names.append(index[id(p)][0])
            if local.get(names[-1]):
                state[i] = local[names[-1]]
            i += 1
        if sorted(names) != sorted(want["params"]):
            raise ValueError(f"load_optim_state_dict: param_groups[{n}] holds {sorted(names)} here but "
                             f"{sorted(want['params'])} in the state dict")
        groups.append({**{k: v for k, v in want.items() if k != "params"},
                       "params": list(range(i - len(names), i))})
    optimizer.load_state_dict({"state": state, "param_groups": groups})


# -- DCP --------------------------------------------------------------------------------

def save(model: ParoModule, optimizer: torch.optim.Optimizer | None, path: str | os.PathLike[str]) -> None:
    """dcp.save of {"model": sharded_state_dict, "optim": optim_state_dict}
    to the directory `path`: every rank writes its Shard(0) chunks, moved
    there from the ranks' G parts unit by unit; nothing is gathered.
    Collective."""
    from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

    sd: dict[str, Any] = {"model": sharded_state_dict(model)}
    if optimizer is not None:
        sd["optim"] = optim_state_dict(model, optimizer)
    dcp_save(sd, checkpoint_id=path)


def load(model: ParoModule, optimizer: torch.optim.Optimizer | None, path: str | os.PathLike[str]) -> None:
    """What `save` wrote (or FSDP2's dcp.save of {"model": ..., "optim": ...}),
    into a model wrapped under any strategy, on any number of ranks: dcp.load
    into this model's own templates (each rank reads the saved chunks over its
    own), then load_sharded_state_dict and load_optim_state_dict. `optimizer`
    may be fresh. Collective."""
    from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

    flat = _saved_flat(model, path)
    sd: dict[str, Any] = {"model": _model_sd(model, fill=False, flat=flat)}
    if optimizer is not None:
        sd["optim"] = _optim_sd(model, optimizer, fill=False,
                                flat=frozenset(k[len("optim.state."):] for k in flat if k.startswith("optim.state.")))
    dcp_load(sd, checkpoint_id=path)
    load_sharded_state_dict(model, sd["model"])
    if optimizer is not None:
        load_optim_state_dict(model, optimizer, sd["optim"])


def _saved_flat(model: ParoModule, path: str | os.PathLike[str]) -> frozenset[str]:
    """The model's names (and "optim.state.<name>.<key>"s) that a checkpoint
    written before DTensors holds over [numel] where the parameter has another
    shape: their templates take that form. Read from the directory's metadata
    (every rank reads the same file, so every rank's templates agree)."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    if not os.path.isdir(path):
        return frozenset()
    md = FileSystemReader(path).read_metadata().state_dict_metadata
    shapes = {name: tuple(sl.shape) for _, named in _units(model) for name, _, sl in named}
    out = set()
    for key, m in md.items():
        if not isinstance(m, TensorStorageMetadata) or len(m.size) != 1:
            continue
        name = key[len("model."):] if key.startswith("model.") else key[len("optim.state."):].rpartition(".")[0]
        if name in shapes and len(shapes[name]) != 1 and tuple(m.size) == (math.prod(shapes[name]),):
            out.add(key[len("model."):] if key.startswith("model.") else key)
    return frozenset(out)
