"""The hocc backend's barrier when a member never comes: every member that
waits raises within the group's timeout (+10 s), with torch's own test's
words ("timeout"), the group, and the member that never arrived; the group
is failed from then on, as after a failed collective. Three cases: the inner
gloo group already set up by an earlier barrier; not yet (the barrier is its
first use, so the member is missed while it is being set up); and a sub-group
whose ranks are not the global ones (the member is named by both)."""

from __future__ import annotations

import re
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from hocc import CollectiveError
from tests.worlds import run_world

TIMEOUT = timedelta(seconds=2)
# torch/testing/_internal/distributed/distributed_test.py, _test_barrier_timeout: what a
# backend's barrier timeout must say, and that it must not come before the timeout.
TORCH_WORDS = re.compile(" (Timed out|closed|timeout) ")


def _missed_barrier(rank: int, group: dist.ProcessGroup, members: list[int], absent: int, store: dist.Store,
                    tag: str) -> None:
    """Every member but global rank `absent` enters a barrier; `absent` waits until they have raised."""
    if rank not in members:
        return
    if rank == absent:
        store.wait([f"{tag}/{r}" for r in members if r != absent])
        return
    started = time.monotonic()
    with pytest.raises(CollectiveError) as info:
        dist.barrier(group=group)
    took = time.monotonic() - started
    store.set(f"{tag}/{rank}", "raised")
    msg = str(info.value)
    assert TORCH_WORDS.search(msg), msg
    in_group = members.index(absent)
    named = f"rank {in_group}" + ("" if in_group == absent else f" (global rank {absent})")
    assert f"{named} never arrived" in msg and "barrier on group" in msg, msg
    assert TIMEOUT.total_seconds() - 0.1 <= took <= TIMEOUT.total_seconds() + 10, (took, msg)
    started = time.monotonic()
    with pytest.raises(CollectiveError, match="failed earlier"):
        dist.all_reduce(torch.ones(3), group=group)  # the group is failed: at once, no second timeout
    assert time.monotonic() - started < 1.0


def _barrier_body(rank: int, world: int) -> None:
    store = dist.distributed_c10d._get_default_store()
    everyone = list(range(world))
    warm = dist.new_group(everyone, timeout=TIMEOUT)
    assert dist.get_backend(warm) == "hocc"
    dist.barrier(group=warm)  # sets the inner gloo group up; every member comes
    _missed_barrier(rank, warm, everyone, world - 1, store, "t/warm")
    cold = dist.new_group(everyone, timeout=TIMEOUT)
    _missed_barrier(rank, cold, everyone, 0, store, "t/cold")
    part = dist.new_group([1, 2], timeout=TIMEOUT)  # a sub-group: its rank 1 is global rank 2
    _missed_barrier(rank, part, [1, 2], 2, store, "t/part")
    x = torch.full((5,), float(rank))
    dist.all_reduce(x)  # the default group is untouched by its sub-groups' failures
    assert torch.equal(x, torch.full((5,), float(sum(range(world)))))


@pytest.mark.slow
def test_barrier_a_member_never_reaches() -> None:
    run_world(3, _barrier_body, backend="hocc", timeout_s=60)
