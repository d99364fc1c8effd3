"""The hocc backend's barrier when a member never comes: every member that
waits raises within the group's timeout (+10 s), with torch's own test's
words ("timeout"), the group, and the member that never arrived; the group
is failed from then on, as after a failed collective. Two cases: the inner
gloo group already set up by an earlier barrier, and not yet (the barrier is
its first use, so the member is missed while it is being set up)."""

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


def _missed_barrier(rank: int, group: dist.ProcessGroup, absent: int, store: dist.Store, tag: str) -> None:
    """Every member but `absent` enters a barrier; `absent` waits until they have raised."""
    if rank == absent:
        store.wait([f"{tag}/{r}" for r in range(dist.get_world_size()) if r != absent])
        return
    started = time.monotonic()
    with pytest.raises(CollectiveError) as info:
        dist.barrier(group=group)
    took = time.monotonic() - started
    store.set(f"{tag}/{rank}", "raised")
    msg = str(info.value)
    assert TORCH_WORDS.search(msg), msg
    assert f"rank {absent} never arrived" in msg and "barrier on group" in msg, msg
    assert TIMEOUT.total_seconds() - 0.1 <= took <= TIMEOUT.total_seconds() + 10, (took, msg)
    started = time.monotonic()
    with pytest.raises(CollectiveError, match="failed earlier"):
        dist.all_reduce(torch.ones(3), group=group)  # the group is failed: at once, no second timeout
    assert time.monotonic() - started < 1.0


def _barrier_body(rank: int, world: int) -> None:
    store = dist.distributed_c10d._get_default_store()
    warm = dist.new_group(list(range(world)), timeout=TIMEOUT)
    assert dist.get_backend(warm) == "hocc"
    dist.barrier(group=warm)  # sets the inner gloo group up; every member comes
    _missed_barrier(rank, warm, world - 1, store, "t/warm")
    cold = dist.new_group(list(range(world)), timeout=TIMEOUT)
    _missed_barrier(rank, cold, 0, store, "t/cold")
    x = torch.full((5,), float(rank))
    dist.all_reduce(x)  # the default group is untouched by its sub-groups' failures
    assert torch.equal(x, torch.full((5,), float(sum(range(world)))))


def test_barrier_a_member_never_reaches() -> None:
    run_world(3, _barrier_body, backend="hocc", timeout_s=60)
