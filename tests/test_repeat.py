"""The drop-in's table of repeated sync calls (hocc/api/repeat.py, csrc/python/repeat_bindings.cc): a
repeated call of a prepared shape runs from C++, never entering the engine's full way (Engine.run), and is
right on fresh buffers; it numbers, records and notes its call (the heap trimmer) as the full way does; an
algo named by a string made at run time, or a Parameter, still finds its shape; a world made again never
runs on the old world's engine."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest
import torch
import torch.distributed as dist

import hocc
from hocc.engine import heap
from hocc.engine.group_engines import find_engine
from tests.worlds import count_full_way, run_world

CPU = torch.device("cpu")


def _world_engine() -> Any:
    e = find_engine(dist.group.WORLD, CPU)
    assert e is not None
    return e


def _repeated_body(rank: int, world: int) -> None:
    hocc.configure(malloc_trim_s=0.05)  # trims within the test's time (before the shape is prepared: a change
    # of settings empties the table)
    total = sum(range(world))

    def algo() -> str:
        return "".join(["ho_", "ring"])  # a new string object each time, as a name read from a config is

    for _ in range(2):  # the first sets communicators up; the second runs plain, then is prepared
        hocc.all_reduce(torch.full((5,), float(rank)), algo=algo())
    eng = _world_engine()
    full = count_full_way(eng)
    made = eng.calls_made
    for i in range(4):
        y = torch.full((5,), float(rank + i))
        hocc.all_reduce(y, algo=algo())
        assert torch.equal(y, torch.full((5,), float(total + world * i))), (i, y)
    assert full == [0], f"{full[0]} repeated calls took the full way"
    assert eng.calls_made == made + 4, (eng.calls_made, made)
    seqs = [c[0] for c in eng.recorder.calls]
    assert seqs[-4:] == list(range(made, made + 4)), seqs
    plan = hocc.last_plan()
    assert plan is not None and plan.algo == "ho_ring", plan

    # a Parameter is a tensor to the table too
    p = torch.nn.Parameter(torch.full((5,), float(rank)), requires_grad=False)
    hocc.all_reduce(p, algo=algo())
    assert full == [0] and torch.equal(p.detach(), torch.full((5,), float(total))), (full, p)

    # the heap trimmer hears of repeated calls: once it trimmed, the next call notes it again
    trimmer = heap._trimmer
    assert trimmer is not None
    deadline = time.monotonic() + 10
    while trimmer.noted and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not trimmer.noted, "the heap trimmer did not trim"
    hocc.all_reduce(torch.ones(5), algo=algo())
    assert full == [0] and trimmer.noted, (full, trimmer.noted)

    # an async call and another dtype are not the table's: the full way runs them
    w = hocc.all_reduce(torch.ones(5), algo=algo(), async_op=True)
    assert w is not None
    w.wait()
    hocc.all_reduce(torch.ones(5, dtype=torch.float64), algo=algo())
    assert full == [2], full


def test_repeated_calls_run_from_the_table() -> None:
    run_world(2, _repeated_body, timeout_s=120)


def _remade_world_body(rank: int, world: int) -> None:
    for _ in range(3):
        hocc.all_reduce(torch.ones(3), algo="ring")  # prepared: in the table, keyed on group None
    old_eng = _world_engine()
    old_world = dist.group.WORLD  # held: its engine is not released with it
    store = dist.distributed_c10d._get_default_store()
    dist.destroy_process_group()
    with pytest.raises((ValueError, RuntimeError)):  # no world now: the full way says so, nothing runs
        hocc.all_reduce(torch.ones(3), algo="ring")
    dist.init_process_group("gloo", store=dist.PrefixStore("again", store), rank=rank, world_size=world,
                            timeout=timedelta(seconds=60))
    made = old_eng.calls_made
    x = torch.full((3,), float(rank))
    hocc.all_reduce(x, algo="ring")  # the same arguments: group None is the new world now
    assert torch.equal(x, torch.full((3,), float(sum(range(world))))), x
    assert old_eng.calls_made == made, "a call on the new world ran on the old world's engine"
    assert _world_engine() is not old_eng
    del old_world


def test_a_world_made_again_is_not_the_old_one() -> None:
    run_world(2, _remade_world_body, timeout_s=120)
