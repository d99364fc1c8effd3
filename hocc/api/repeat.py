"""A repeated sync call's short way. When a drop-in call's arguments, as
passed (collective, group, op, algo, the tensors' dtype and sizes), name a
call shape the group's engine has prepared (hocc.engine.prepared), the call
runs from a table in C++ (csrc/python/repeat_bindings.cc): the lookup, the
checks its shape does not already imply (a plain CPU tensor, contiguous), the
engine's bookkeeping (the call's number, last_plan, the flight recorder, the
heap trimmer) and the plan run, with no Python frame but the drop-in
function's. A miss of any kind takes the full way (collectives.py: validate,
find the engine, plan), which raises what is wrong and learns the shape once
it is prepared.

Why in C++: on ranks that share cores each microsecond of Python a call
makes costs several of every rank's call time. The same table in Python cost
a 32-byte all_reduce on 8 local ranks 57 us a call, against 17 us for its
plan run alone (docs/executor.md).

The table forgets a shape when its engine lets go of it (failed, closed,
evicted: Engine._let_go) and every shape when the settings change
(hocc.config.on_change); a group that is gone, or a world made again, is a
miss."""

from __future__ import annotations

import functools
import weakref
from typing import Any

import torch
import torch.distributed as dist

from hocc.config import get_config, on_change
from hocc.engine.engine import Engine
from hocc.engine.heap import note_cpu_call
from hocc.executor import available, load

# the table's codes for the collectives it runs
ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER = 0, 1, 2
_CODES = {"all_reduce": ALL_REDUCE, "all_gather": ALL_GATHER, "reduce_scatter": REDUCE_SCATTER}


def _no_table(*_: object) -> bool:
    return False


_cpp: Any = load() if available() else None
if _cpp is not None:
    _cpp.repeat_setup(torch.Tensor, torch.nn.Parameter, dist.distributed_c10d._world)
    on_change(_cpp.repeat_clear)

# run_known(code, input, output, op, group, algo): True once the call ran (its failure raises as the full
# way's does); False with nothing done
run_known = _cpp.repeat_run if _cpp is not None else _no_table


def learn(collective: str, inp: torch.Tensor, out: torch.Tensor, op: object, group: dist.ProcessGroup | None,
          algo: str | None, eng: Engine, op_name: str) -> None:
    """After a sync call made the full way: keep its shape if the engine has prepared it."""
    g = eng.group  # None for a "hocc" backend group's engine: those calls keep the full way
    if _cpp is None or g is None or (group is not None and group is not g):
        return
    prepared = eng.prepared((collective, inp.numel(), out.numel(), inp.dtype, op_name, algo))
    if prepared is None:
        return
    rec = eng.recorder
    _cpp.repeat_learn(
        collective=_CODES[collective], group=group, op=op, algo=algo, dtype=inp.dtype, n_in=inp.numel(),
        n_out=out.numel(), group_ref=weakref.ref(g), prepared=prepared,
        # Recorder.made's tuple is (seq, *record_fields, enqueue_ns): the table appends it itself
        record=rec.calls.append if rec.on else None, fields=prepared.record_fields(),
        note=functools.partial(note_cpu_call, get_config().malloc_trim_s),
        failed=eng._prepared_failed, busy=eng._prepared_busy)
