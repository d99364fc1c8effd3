"""A repeated sync call's short way. When a drop-in call's arguments, as
passed (collective, group, op, algo, the tensors' dtype and sizes), name a
call shape the group's engine has prepared (hocc.engine.prepared), the call is
this lookup, the checks its shape does not already imply (CPU, contiguous),
and the engine's one crossing into C++. A miss of any kind takes the full way
(collectives.py: validate, find the engine, plan), which raises what is wrong
and learns the shape once it is prepared.

Why a table of its own: on ranks that share cores each microsecond of Python
a call makes costs several of every rank's call time (docs/executor.md)."""

from __future__ import annotations

import weakref
from typing import Any

import torch
import torch.distributed as dist

from hocc.engine.engine import Engine
from hocc.engine.prepared import Prepared

_SIZE = 256  # shapes kept (oldest out): as many as an engine's plan cache
# weakly: a closed engine lets go of its prepared calls, and with them its executor and transport (gloo frees
# a group's threads and sockets only with the last reference); the op object strongly, so its id is not reused
_known: dict[tuple[Any, ...], tuple[weakref.ref[Engine], weakref.ref[Prepared], object]] = {}


def run_known(collective: str, inp: torch.Tensor, out: torch.Tensor, op: object,
              group: dist.ProcessGroup | None, algo: str | None) -> bool:
    """Run the call if its shape is known and still prepared: True once it ran (its failure raises
    as the full way's does); False with nothing done."""
    try:
        hit = _known.get((collective, id(group), id(op), algo, inp.dtype, inp.numel(), out.numel()))
    except (AttributeError, TypeError):  # not a tensor (or an algo that is not hashable): the full way says
        return False
    if hit is None:
        return False
    eng_ref, prepared_ref, known_op = hit
    eng, prepared = eng_ref(), prepared_ref()
    g = group if group is not None else dist.group.WORLD  # the world of now (it may have been made again)
    if (eng is None or prepared is None or g is None or eng.group is not g
            or known_op is not op  # ids are reused: the objects
            or not (inp.is_cpu and out.is_cpu and inp.is_contiguous() and out.is_contiguous()
                    and out.dtype is inp.dtype)):
        return False
    return eng.run_prepared(prepared, inp, out)


def learn(collective: str, inp: torch.Tensor, out: torch.Tensor, op: object, group: dist.ProcessGroup | None,
          algo: str | None, eng: Engine, op_name: str) -> None:
    """After a sync call made the full way: keep its shape if the engine has prepared it."""
    g = eng.group  # None for a "hocc" backend group's engine: those calls keep the full way
    if g is None or (group is not None and group is not g):
        return
    prepared = eng.prepared((collective, inp.numel(), out.numel(), inp.dtype, op_name, algo))
    if prepared is None:
        return
    try:
        key = (collective, id(group), id(op), algo, inp.dtype, inp.numel(), out.numel())
        _known.pop(key, None)
        if len(_known) >= _SIZE:
            _known.pop(next(iter(_known)), None)  # oldest out
        _known[key] = (weakref.ref(eng), weakref.ref(prepared), op)
    except TypeError:  # an algo that is not hashable
        return
