"""State dicts of a PaRO model and its optimizer: gathered whole, or sharded
for torch.distributed.checkpoint (DCP), which saves each rank's part without
gathering and loads it back under any strategy and any world size.

    full_state_dict         every parameter whole on every rank (export, comparison)
    sharded_state_dict      each parameter as a ShardedTensor over its flattened
                            shape [numel]: a rank's local shard is the part inside
                            its G range (zero-size if none); buffers as plain tensors
    optim_state_dict        the optimizer's state keyed by parameter name: per-element
                            states (Adam's moments, SGD's momentum) sharded as the
                            parameters are, scalar ones (Adam's step) plain, and
                            param_groups with names in place of indices
    load_sharded_state_dict / load_full_state_dict / load_optim_state_dict: the inverses
    save / load             the two through dcp.save / dcp.load

Why the G part, whatever the strategy: the ranks' G ranges partition every
unit's flat vector and every rank holds its own (G is inside I inside N), so
each element is written once, by one rank, with no collective; and whatever
a loading model's strategy, each of its ranks reads the chunks that overlap its
own G range, then gathers G -> o into the optimizer's scope `master` (and its
optimizer's per-element state the same way). Why flattened: a rank's G part is
a contiguous range of the flattened parameter, which is a box of [numel] but
not, in general, of the parameter's own shape. Loading writes `master` in
place, so each unit refreshes its other copies at its next forward.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from functools import lru_cache, partial
from typing import TYPE_CHECKING, Any

import torch
from torch.distributed._shard.metadata import ShardMetadata
from torch.distributed._shard.sharded_tensor.api import ShardedTensor
from torch.distributed._shard.sharded_tensor.metadata import ShardedTensorMetadata, TensorProperties
from torch.distributed._shard.sharded_tensor.shard import Shard
from torch.nn.modules.module import _IncompatibleKeys

if TYPE_CHECKING:
    from hocc.paro.shard import ParoModule
    from hocc.paro.unit import Slot, Unit


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

def _units(model: ParoModule) -> Iterator[tuple[Unit, list[tuple[str, int, Slot]]]]:
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


def _g_parts(u: Unit, sl: Slot) -> list[tuple[int, int, int]]:
    """(rank, lo, hi): every rank's non-empty G part of `sl`, in its
    flattened coordinates (the blocks it spans, not all W ranks)."""
    if sl.numel == 0:
        return []
    owner, block = _rank_of_block(tuple(u.groups.hosts), tuple(u.groups.rails)), u.layout.block
    out = []
    for b in range(sl.offset // block, (sl.offset + sl.numel - 1) // block + 1):
        out.append((owner[b], max(b * block - sl.offset, 0), min((b + 1) * block - sl.offset, sl.numel)))
    return out


def _shard(u: Unit, sl: Slot, local: torch.Tensor) -> ShardedTensor | torch.Tensor:
    """A ShardedTensor over sl's flattened shape whose local shard is `local`
    (this rank's G part, perhaps empty). Its global metadata is built here,
    every rank's G range being known, so no collective runs per tensor.

    A rank whose G range misses the parameter holds a zero-size shard (at
    offset numel) rather than none: DCP's planners drop a ShardedTensor with
    no local shard from that rank's template, and dcp.load, finding a saved
    key the template lacks, falls back to its pre-2.4 flattening, which
    breaks any list of dicts in the state dict (param_groups). The metadata
    lists the shards that hold data and this rank's own zero-size one only
    (the other ranks' would add W entries per tensor; no check needs them)."""
    if sl.numel == 0:  # nothing to shard: a ShardedTensor needs a non-empty shard somewhere
        return local.clone()
    dev, me = str(local.device), u.groups.rank
    metas = [ShardMetadata([lo], [hi - lo], f"rank:{r}/{dev}") for r, lo, hi in _g_parts(u, sl)]
    mine = next((m for m in metas if m.placement is not None and m.placement.rank() == me), None)
    if mine is None:
        mine = ShardMetadata([sl.numel], [0], f"rank:{me}/{dev}")
        metas.append(mine)
    lo, hi = u.local_range(sl, "G")
    assert local.numel() == hi - lo == mine.shard_sizes[0], (sl.fqn, lo, hi, mine)
    props = TensorProperties(dtype=local.dtype, layout=torch.strided, requires_grad=False,
                             memory_format=torch.contiguous_format, pin_memory=False)
    meta = ShardedTensorMetadata(metas, torch.Size([sl.numel]), props)
    return ShardedTensor._init_from_local_shards_and_global_metadata([Shard(local.contiguous(), mine)], meta,
                                                                     process_group=u.groups.world)


def _g_part(name: str, value: Any, sl: Slot, lo: int, hi: int) -> torch.Tensor:
    """[lo, hi) of a saved value of `sl`, flattened: a ShardedTensor's local
    shards (which must cover it) or a plain full tensor's slice."""
    if isinstance(value, ShardedTensor):
        if tuple(value.size()) != (sl.numel,):
            raise ValueError(f"{name}: a ShardedTensor of size {tuple(value.size())}, but the parameter has "
                             f"{sl.numel} elements (its flattened shape)")
        pieces, at = [], lo
        for s in sorted(value.local_shards(), key=lambda s: s.metadata.shard_offsets[0]):
            s0 = s.metadata.shard_offsets[0]
            a, b = max(at, s0), min(hi, s0 + s.metadata.shard_sizes[0])
            if a == at and b > a:
                pieces.append(s.tensor.reshape(-1)[a - s0:b - s0])
                at = b
        if at != hi:
            raise ValueError(f"{name}: the ShardedTensor's local shards do not hold this rank's part "
                             f"[{lo}, {hi}); load it (dcp.load) into a template from this model's sharded_state_dict")
        return torch.cat(pieces) if len(pieces) > 1 else pieces[0]
    if isinstance(value, torch.Tensor):
        if value.numel() != sl.numel or (value.dim() > 1 and value.shape != sl.shape):
            raise ValueError(f"{name}: a tensor of shape {tuple(value.shape)}, but the parameter's is "
                             f"{tuple(sl.shape)}")
        return value.detach().reshape(-1)[lo:hi]
    raise TypeError(f"{name}: expected a tensor or a ShardedTensor, got {type(value).__name__}")


def _gather_to_optim(u: Unit, gbuf: torch.Tensor) -> torch.Tensor:
    """Every rank's G part (gbuf) gathered into a new vector at the optimizer's scope."""
    o = u.strategy.optim
    out = torch.empty(u.layout.size(o), dtype=gbuf.dtype, device=gbuf.device)
    u.moves.run(partial(u.moves.gather, out, gbuf, "G", o, "load", "params"))
    return out


# -- parameters and buffers -------------------------------------------------------------

def sharded_state_dict(model: ParoModule) -> dict[str, Any]:
    """The model's parameters as ShardedTensors (each rank: its G part, in
    the module's dtype) and its persistent buffers as plain tensors (rank
    0's), by the names of model.state_dict() (a tied parameter under each of its
    names): what dcp.save writes without
    gathering, and the template dcp.load fills under another strategy or
    world size. Collective (the buffers' broadcast)."""
    out: dict[str, Any] = {}
    tied = _tied_names(model)
    for u, named in _units(model):
        for name, _, sl in named:
            out[name] = _shard(u, sl, u.part(u.master, sl, "G", u.strategy.optim).detach().clone())
            for alias in tied.get(name, ()):  # the same ShardedTensor: dcp.load fills it once per name
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
    """Load parameters and buffers from a sharded state dict (ShardedTensors
    as sharded_state_dict makes and dcp.load fills) or a full one (whole
    tensors: full_state_dict's, or an unwrapped model's state_dict()), or a
    mix. Each rank takes its G part of every parameter, the unit gathers the
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
        for name, _, sl in named:
            lo, hi = u.local_range(sl, "G")
            key = source[name]
            if key is not None and hi > lo:
                u.part(gbuf, sl, "G", "G")[:] = _g_part(key, sd[key], sl, lo, hi)
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

def _param_index(model: ParoModule) -> dict[int, tuple[str, Unit, Slot]]:
    """id(the optimizer's parameter, a unit's `sharded`) -> (its name, unit, slot)."""
    return {id(u.sharded[i]): (name, u, sl) for u, named in _units(model) for name, i, sl in named}


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
    {key: value}}, "param_groups": [{..., "params": [names]}]}. Per-element
    states are ShardedTensors over the flattened parameter (each rank: its G
    part), scalar ones plain tensors, so a model under another strategy or
    world size can load them. An optimizer with no state yet gets one first
    (_init_state), so that this is the template dcp.load fills."""
    _init_state(optimizer)
    index = _param_index(model)
    state: dict[str, dict[str, Any]] = {}
    groups: list[dict[str, Any]] = []
    for group in optimizer.param_groups:
        names = []
        for p in group["params"]:
            if id(p) not in index:
                raise ValueError("optim_state_dict: the optimizer holds a parameter that is not one of the model's "
                                 "(create it over model.parameters() after paro_shard)")
            name, u, sl = index[id(p)]
            names.append(name)
            o = u.strategy.optim
            lo_o, _ = u.local_range(sl, o)
            lo, hi = u.local_range(sl, "G")
            entry: dict[str, Any] = {}
            for key, v in optimizer.state.get(p, {}).items():
                if _per_element(v, p):
                    part = v.detach().reshape(-1)[lo - lo_o:hi - lo_o] if hi > lo else v.detach().reshape(-1)[:0]
                    entry[key] = _shard(u, sl, part.clone())
                elif isinstance(v, torch.Tensor):
                    entry[key] = v.detach().clone()
                else:
                    entry[key] = v
            state[name] = entry
        groups.append({**{k: v for k, v in group.items() if k not in ("params", "param_names")}, "params": names})
    return {"state": state, "param_groups": groups}


def load_optim_state_dict(model: ParoModule, optimizer: torch.optim.Optimizer, sd: dict[str, Any]) -> None:
    """Load what optim_state_dict made (after dcp.load, under any strategy or
    world size) into `optimizer`, which may be fresh (no state yet). Each
    per-element state's G parts are gathered to the optimizer's scope, unit
    by unit, into the shape of the sharded parameter; then the optimizer's
    own load_state_dict takes them by index, with the saved param_groups'
    hyperparameters (groups must hold the same parameters, in any order).
    Collective: every rank calls it, with the same keys."""
    index = _param_index(model)
    saved: dict[str, dict[str, Any]] = sd["state"]
    local: dict[str, dict[str, Any]] = {}
    for u, named in _units(model):
        o = u.strategy.optim
        g0, g1 = u.layout.range("G")
        kinds = sorted({(key, v.metadata().tensor_properties.dtype) for name, _, _ in named
                        for key, v in saved.get(name, {}).items() if isinstance(v, ShardedTensor)}, key=str)
        for key, dtype in kinds:  # one gather per (unit, key): the same list on every rank
            gbuf = torch.zeros(g1 - g0, dtype=dtype, device=u.device)
            have = [(name, i, sl) for name, i, sl in named if isinstance(saved.get(name, {}).get(key), ShardedTensor)]
            for name, _, sl in have:
                lo, hi = u.local_range(sl, "G")
                if hi > lo:
                    u.part(gbuf, sl, "G", "G")[:] = _g_part(f"{name}.{key}", saved[name][key], sl, lo, hi)
            out = _gather_to_optim(u, gbuf)
            for name, i, sl in have:
                local.setdefault(name, {})[key] = u.part(out, sl, o, o).reshape(u.sharded[i].shape).clone()
        for name, _, _ in named:
            for key, v in saved.get(name, {}).items():
                if not isinstance(v, ShardedTensor):
                    local.setdefault(name, {})[key] = v.clone() if isinstance(v, torch.Tensor) else v
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
    to the directory `path`: every rank writes its G parts, nothing is gathered.
    Collective."""
    from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

    sd: dict[str, Any] = {"model": sharded_state_dict(model)}
    if optimizer is not None:
        sd["optim"] = optim_state_dict(model, optimizer)
    dcp_save(sd, checkpoint_id=path)


def load(model: ParoModule, optimizer: torch.optim.Optimizer | None, path: str | os.PathLike[str]) -> None:
    """What `save` wrote, into a model wrapped under any strategy, on any
    number of ranks: dcp.load into this model's own templates (each rank reads
    the chunks over its G parts), then load_sharded_state_dict and
    load_optim_state_dict. `optimizer` may be fresh. Collective."""
    from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

    sd: dict[str, Any] = {"model": sharded_state_dict(model)}
    if optimizer is not None:
        sd["optim"] = optim_state_dict(model, optimizer)
    dcp_load(sd, checkpoint_id=path)
    load_sharded_state_dict(model, sd["model"])
    if optimizer is not None:
        load_optim_state_dict(model, optimizer, sd["optim"])
