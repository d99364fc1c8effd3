"""Ranks that disagree on a call (count, dtype, reduction op, algo, or one that
skips a call) get an error on every rank, never a crashed process or a wrong
result: with HOCC_CHECK=1 before any byte moves, naming the rank and what
differs; without it at the communicators' own check, within the timeout.

Each case runs on a fresh group of all ranks (a failed group stays failed),
in one world; a crash of any process fails the test (run_world)."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

import hocc
from tests.worlds import hocc_env, run_world

pytestmark = pytest.mark.slow

TIMEOUT_S = 3.0
ODD = 3  # the rank that differs


def _ar(group: dist.ProcessGroup, t: torch.Tensor, **kw: object) -> None:
    hocc.all_reduce(t, group=group, **kw)  # type: ignore[arg-type]


# what each rank calls: (rank, group) -> None; rank ODD differs
def _count(r: int, g: dist.ProcessGroup) -> None:
    _ar(g, torch.ones(1000 + (17 if r == ODD else 0)), algo="ho_ring")


def _dtype(r: int, g: dist.ProcessGroup) -> None:
    _ar(g, torch.ones(1000, dtype=torch.float64 if r == ODD else torch.float32), algo="ho_ring")


def _op(r: int, g: dist.ProcessGroup) -> None:
    _ar(g, torch.ones(1000), op=dist.ReduceOp.MAX if r == ODD else dist.ReduceOp.SUM, algo="ho_ring")


def _algo(r: int, g: dist.ProcessGroup) -> None:
    _ar(g, torch.ones(1000), algo="ring" if r == ODD else "ho_ring")


def _skip(r: int, g: dist.ProcessGroup) -> None:
    if r != ODD:  # ODD skips the first call: its second meets the others' first
        _ar(g, torch.ones(1000), algo="ho_ring")
    _ar(g, torch.ones(2000), algo="ho_ring")


def _gather_count(r: int, g: dist.ProcessGroup) -> None:
    n = 999 if r == ODD else 1000
    hocc.all_gather_into_tensor(torch.empty(4 * n), torch.ones(n), group=g, algo="ring")


def _split(r: int, g: dist.ProcessGroup) -> None:
    """Two halves, each agreeing within itself: ranks 1 and 3 each see an agreeing ring predecessor and
    go on into gloo's own reduce-scatter, where sizes must never meet (gloo would abort the process)."""
    n = 1000 if r < 2 else 1017
    hocc.reduce_scatter_tensor(torch.empty(n), torch.ones(4 * n), group=g, algo="native")


def _tiny(r: int, g: dist.ProcessGroup) -> None:
    """Both calls tiny (their inputs travel in the call check's frames)."""
    _ar(g, torch.ones(1 if r == ODD else 2), algo="native")


def _tiny_big(r: int, g: dist.ProcessGroup) -> None:
    """A tiny call (frames alone) against a call that is not (its check frame, then gloo's all-reduce)."""
    _ar(g, torch.ones(1000 if r == ODD else 1), algo="native")


CASES: dict[str, tuple[Callable[[int, dist.ProcessGroup], None], str]] = {
    # name: (calls, what HOCC_CHECK's message names)
    "count": (_count, r"count \(ranks 0,1,2: 1000; rank 3: 1017\)"),
    "dtype": (_dtype, r"dtype \(ranks 0,1,2: float32; rank 3: float64\)"),
    "op": (_op, r"reduction op \(ranks 0,1,2: sum; rank 3: max\)"),
    "algo": (_algo, r"algo \(ranks 0,1,2: ho_ring; rank 3: ring\)"),
    "skip": (_skip, r"count \(ranks 0,1,2: 1000; rank 3: 2000\)"),
    "gather_count": (_gather_count, r"count \(ranks 0,1,2: 1000; rank 3: 999\)"),
    "split": (_split, r"count \(ranks 0,1: 1000; ranks 2,3: 1017\)"),
    "tiny": (_tiny, r"count \(ranks 0,1,2: 2; rank 3: 1\)"),
    "tiny_big": (_tiny_big, r"count \(ranks 0,1,2: 1; rank 3: 1000\)"),
}


def _cases(rank: int, world: int, check: bool) -> None:
    hocc.configure(check="all" if check else "comm")
    for name, (calls, names) in CASES.items():
        dist.barrier()  # the last case's ranks raised at different times; the new group's timeout is short
        group = dist.new_group(list(range(world)), timeout=timedelta(seconds=TIMEOUT_S))
        probe = torch.arange(6, dtype=torch.float32)
        before = probe.clone()
        t0 = time.monotonic()
        with pytest.raises(hocc.CollectiveError) as info:
            calls(rank, group)
            hocc.all_reduce(probe, group=group, algo="ho_ring")  # only reached if the mismatch went unseen
        took = time.monotonic() - t0
        msg = str(info.value)
        assert took < TIMEOUT_S + 10, f"{name}: raised after {took:.1f} s: {msg}"
        assert torch.equal(probe, before), f"{name}: a later call ran on the failed group"
        if check:
            assert isinstance(info.value, hocc.CallMismatchError), f"{name}: {msg}"
            assert "HOCC_CHECK" in msg and "nothing was sent" in msg, f"{name}: {msg}"
            import re

            assert re.search(names, msg), f"{name}: the message does not name what differs: {msg}"
        else:
            assert "hocc:" in msg and "destroy it and create it again" in msg, f"{name}: {msg}"
            # the ranks that saw the other call say so by type; the rest raise for the failed peer
            # (another algo already differs in the communicators it sets up: those time out)
            seen: list[object] = [None] * world
            dist.all_gather_object(seen, isinstance(info.value, hocc.CallMismatchError))
            assert name == "algo" or any(seen), f"{name}: no rank raised CallMismatchError: {msg}"
        with pytest.raises(hocc.CollectiveError, match="failed earlier"):  # the group stays failed
            hocc.all_reduce(torch.ones(3), group=group)
    # the world group is untouched by all of that
    x = torch.full((1001,), float(rank))
    hocc.all_reduce(x, algo="ho_ring")
    assert torch.all(x == sum(range(world)))


def _agreeing(rank: int, world: int) -> None:
    """HOCC_CHECK=1 passes agreeing calls through, every size and algo."""
    hocc.configure(check="all")
    for n in (0, 1, 7, 4099):
        for algo in ("native", "ring", "ho_ring"):
            x = torch.arange(n, dtype=torch.float32) * (rank + 1)
            want = x.clone()
            dist.all_reduce(want)
            hocc.all_reduce(x, algo=algo)
            assert torch.equal(x, want), (n, algo)
            out = torch.empty(world * n)
            hocc.all_gather_into_tensor(out, torch.full((n,), float(rank)), algo=algo)
            assert torch.equal(out, torch.arange(world).repeat_interleave(n).float()), (n, algo)


def _body(rank: int, world: int) -> None:
    _cases(rank, world, check=True)
    _cases(rank, world, check=False)
    _agreeing(rank, world)


def test_mismatched_calls_raise_on_every_rank() -> None:
    """With HOCC_CHECK=1, then with the default check, in one world (spawning costs seconds)."""
    run_world(4, _body, env=hocc_env("2x2", "shm"), timeout_s=180)


def _tiny_tree(rank: int, world: int, splits: list[tuple[int, ...]]) -> None:
    """A tiny call runs over a tree, a call that is not tiny starts with its ring check: however the
    ranks split between the two, some rank must see the mismatch at once, long before the group's
    timeout (ranks already inside gloo's own all-reduce wait for that timeout)."""
    hocc.configure(check="comm")
    for big in splits:
        dist.barrier()
        group = dist.new_group(list(range(world)), timeout=timedelta(seconds=2 * TIMEOUT_S))
        t0 = time.monotonic()
        with pytest.raises(hocc.CollectiveError) as info:
            _ar(group, torch.ones(1000 if rank in big else 1), algo="native")
        took = time.monotonic() - t0
        seen = isinstance(info.value, hocc.CallMismatchError)
        assert not seen or took < TIMEOUT_S, f"ranks {big} in the big call: seen after {took:.1f} s"
        every: list[object] = [None] * world
        dist.all_gather_object(every, seen)
        assert any(every), f"ranks {big} in the big call: no rank saw the mismatch: {info.value}"


@pytest.mark.parametrize("world", [3, 4])
def test_tiny_against_big_is_seen_at_once(world: int) -> None:
    """Every split of the ranks between a tiny call and a big one (a host's ranks against the other's,
    alternate ranks, a single rank at every position), on an odd world and an even one."""
    splits = [big for k in range(1, world) for big in itertools.combinations(range(world), k)]
    run_world(world, _tiny_tree, splits, env=hocc_env(f"1x{world}", "net"), timeout_s=400)
