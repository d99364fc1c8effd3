"""The in-process transport's timeout on the CPU: a rank that never joins a
collective, or fails in its own code, makes every other rank raise within the
world's timeout (never a hang), the error names the rank that never answered,
an out-of-place input is left as it was, and the same world then runs the
next collective correctly. bench/gpu_check.py runs the same on the GPU.

The bound checked is timeout + 10 s (the issue's bound for a surviving
rank): a hang check, not a timing measurement."""

from __future__ import annotations

import re
import time

import pytest
import torch

from hocc.bench.collectives import reference
from hocc.executor.inproc import InProcWorld
from hocc.plan.planner import PlannerConfig, make_plan
from hocc.topology import parse_spec

TIMEOUT_S = 0.5
N = 37
# flat ring, a host and a rail stage, several chunks, unequal hosts
CASES = (("4", "ring", None), ("2x2", "ho_ring", 1), ("2x3", "ho_ring", 3), ("2+3", "ho_ring", 1))
COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather")


def buffers(collective: str, world: int, seed: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    in_n = N * world if collective == "reduce_scatter" else N
    out_n = N * world if collective == "all_gather" else N
    ins = [torch.randint(-4, 5, (in_n,), generator=gen).float() for _ in range(world)]
    outs = [torch.full((out_n,), 99.0) for _ in range(world)]
    return ins, outs


def expected(collective: str, ins: list[torch.Tensor]) -> list[torch.Tensor]:
    return [t.float() for t in reference(collective, ins)]


@pytest.mark.slow
@pytest.mark.parametrize("collective", COLLECTIVES)
@pytest.mark.parametrize(("spec", "algo", "chunks"), CASES)
def test_a_rank_that_never_joins_makes_the_others_raise(collective: str, spec: str, algo: str,
                                                          chunks: int | None) -> None:
    topo = parse_spec(spec)
    world = topo.world_size
    plan = make_plan(collective, N, 4, topo, algo, PlannerConfig(chunks=chunks, min_chunk_bytes=1))
    w = InProcWorld(world, timeout_s=TIMEOUT_S)
    for absent in (0, world - 1):
        ins, outs = buffers(collective, world, absent)
        kept = [x.clone() for x in ins]
        start = time.monotonic()
        with pytest.raises(RuntimeError, match=r"timed out after 0.5 s waiting for rank \d+") as err:
            w.run(plan, ins, outs, "sum", absent_rank=absent)
        elapsed = time.monotonic() - start
        assert elapsed < TIMEOUT_S + 10, f"{spec} {collective}: the others took {elapsed:.1f} s to raise"
        quiet = re.search(r"rank (\d+) never answered", str(err.value))
        assert quiet is not None and int(quiet.group(1)) == absent, f"{spec} {collective}: {err.value}"
        for r in range(world):  # out of place: the caller's input is untouched
            assert torch.equal(ins[r], kept[r]), f"{spec} {collective}: rank {r}'s input changed"
        # the same world, every rank present: the next collective is right
        ins, outs = buffers(collective, world, absent + 100)
        w.run(plan, ins, outs, "sum")
        for r, want in enumerate(expected(collective, ins)):
            assert torch.equal(outs[r], want), f"{spec} {collective}: rank {r} wrong after recovery"


@pytest.mark.parametrize(("spec", "algo", "chunks"), CASES[1:3])
def test_a_rank_failing_in_its_own_code_makes_the_others_raise_at_once(spec: str, algo: str,
                                                                       chunks: int | None) -> None:
    topo = parse_spec(spec)
    world = topo.world_size
    plan = make_plan("all_reduce", N, 4, topo, algo, PlannerConfig(chunks=chunks, min_chunk_bytes=1))
    w = InProcWorld(world, timeout_s=30.0)  # a failure aborts the world: nobody waits for the timeout
    ins, outs = buffers("all_reduce", world, 1)
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=f"rank {world - 1} failed on purpose"):
        w.run(plan, ins, outs, "sum", fail_rank=world - 1)
    assert time.monotonic() - start < 10, "the others waited for the timeout instead of the abort"
    ins, outs = buffers("all_reduce", world, 2)
    w.run(plan, ins, outs, "sum")
    assert all(torch.equal(o, expected("all_reduce", ins)[0]) for o in outs)


@pytest.mark.slow
@pytest.mark.parametrize("collective", COLLECTIVES)
def test_a_slow_rank_is_not_named_for_the_absent_one(collective: str) -> None:
    """A rank that has begun the call but is slow to reach its first wait (a loaded machine) ends
    the chain of who waits on whom; the rank that never began the call is the one named. On a
    ring of 4, rank 0 sleeps past the timeout and rank 3 never comes: rank 1 waits on rank 0, and
    rank 2 on rank 1."""
    plan = make_plan(collective, N, 4, parse_spec("4"), "ring", PlannerConfig(min_chunk_bytes=1))
    w = InProcWorld(4, timeout_s=TIMEOUT_S)
    ins, outs = buffers(collective, 4, 7)
    with pytest.raises(RuntimeError, match=r"timed out after 0.5 s") as err:
        w.run(plan, ins, outs, "sum", absent_rank=3, slow_rank=0, slow_s=3 * TIMEOUT_S)
    msg = str(err.value)
    quiet = re.search(r"rank (\d+) never answered", msg)
    assert quiet is not None and int(quiet.group(1)) == 3, f"{collective}: {msg}"
    assert "rank 0 has begun this call and waits on nobody" in msg, f"{collective}: {msg}"
