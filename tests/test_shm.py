"""The shared-memory host transport (csrc/transport/shm.h): groups and jobs
side by side on one host, every wait strategy, and its error paths. Its
correctness over ops x dtypes x sizes runs in test_collectives (flat8, 2x4,
3+5 with HOCC_HOST_TRANSPORT=shm); a dying peer in test_errors."""

from __future__ import annotations

import os
import threading
import uuid

import pytest
import torch
import torch.distributed as dist

import hocc
from hocc import executor
from tests.cases import check_all
from tests.worlds import run_world

SMALL = (torch.float32, torch.int32, torch.bfloat16)


def _shm_plans(group: dist.ProcessGroup | None) -> None:
    for coll in ("all_reduce", "reduce_scatter", "all_gather"):
        plan = hocc.plan_for(coll, torch.empty(1 << 14), group=group, algo="ho_ring")
        assert {s.impl for s in plan.steps} == {"shm"}, plan.describe()


def _two_groups_body(rank: int, world: int) -> None:
    """Two host groups on one host at once, and a third (the world) overlapping both."""
    halves = [dist.new_group([0, 1, 2, 3]), dist.new_group([4, 5, 6, 7])]
    mine = halves[rank // 4]
    _shm_plans(mine)
    _shm_plans(None)
    for _ in range(2):  # alternate between overlapping groups, each with its own segment
        check_all(rank, world, group=mine, dtypes=SMALL, sizes=(1, 1031))
        check_all(rank, world, dtypes=(torch.float32,), sizes=(13, 4099))
    dist.barrier()


@pytest.mark.slow
def test_two_groups_on_one_host() -> None:
    run_world(8, _two_groups_body, env={"HOCC_TOPOLOGY": "8", "HOCC_HOST_TRANSPORT": "shm",
                                        "HOCC_SHM_PIECE_BYTES": "4096", "HOCC_SHM_WAIT": "hybrid"})


def _job_body(rank: int, world: int) -> None:
    _shm_plans(None)
    assert check_all(rank, world, dtypes=SMALL, sizes=(1, 13, 1031, 70001)) > 50


@pytest.mark.slow
@pytest.mark.parametrize("waits", [("yield", "sleep")])
def test_two_jobs_on_one_host_with_other_wait_strategies(waits: tuple[str, str]) -> None:
    """Two 4-rank jobs at the same time on one host: their segments never meet."""
    errors: list[BaseException] = []

    def job(wait: str) -> None:
        try:
            run_world(4, _job_body, env={"HOCC_TOPOLOGY": "4", "HOCC_HOST_TRANSPORT": "shm",
                                         "HOCC_SHM_PIECE_BYTES": "8192", "HOCC_SHM_WAIT": wait})
        except BaseException as e:  # noqa: BLE001 - re-raised below
            errors.append(e)

    threads = [threading.Thread(target=job, args=(w,)) for w in waits]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    assert not [f for f in os.listdir("/dev/shm") if f.startswith("hocc-")]


def test_segment_errors_are_clear(tmp_path: object) -> None:
    c = executor.load()
    path = f"/dev/shm/hocc-test-{uuid.uuid4().hex}"
    with open(path, "wb") as f:
        f.truncate(4096)
    try:
        with pytest.raises(RuntimeError, match="smaller than"):
            c.ShmComm(path, 0, 2, 65536, 1.0)
        with pytest.raises(RuntimeError, match="member 2 of 2"):
            c.ShmComm(path, 2, 2, 65536, 1.0)
        with pytest.raises(RuntimeError, match="unknown wait mode 'spin'"):
            c.ShmComm(path, 0, 1, 4096, 1.0, "spin")
    finally:
        os.unlink(path)
    with pytest.raises(RuntimeError, match="cannot open"):
        c.ShmComm(path, 0, 1, 4096, 1.0)


def test_a_member_alone_times_out_and_stays_failed() -> None:
    """A barrier nobody else reaches raises within the timeout, and the group
    then fails at once instead of waiting again."""
    c = executor.load()
    path = f"/dev/shm/hocc-test-{uuid.uuid4().hex}"
    with open(path, "wb") as f:
        f.truncate(c.ShmComm.segment_bytes(2, 4096))
    try:
        comm = c.ShmComm(path, 0, 2, 4096, 0.3)
    finally:
        os.unlink(path)
    x = torch.ones(100)
    with pytest.raises(RuntimeError, match=r"timed out after 0\.3 s waiting for member 1"):
        comm.all_reduce(x.data_ptr(), 100, "float32", "sum")
    assert comm.broken
    with pytest.raises(RuntimeError, match="failed earlier"):
        comm.all_gather(x.data_ptr(), 50, "float32")
