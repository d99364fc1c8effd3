"""Multi-process correctness on gloo: every collective x algorithm x dtype x
reduction op x size, on each named topology and on sub-groups, against
torch.distributed's own result."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import hocc
from tests.cases import check_all, check_list_forms
from tests.worlds import hocc_env, run_world


def _world_body(rank: int, world: int, spec: str, transport: str) -> None:
    cases = check_all(rank, world)
    check_list_forms(rank, world)
    for coll in ("all_reduce", "reduce_scatter", "all_gather"):
        plan = hocc.plan_for(coll, torch.empty(1 << 16), algo="ho_ring")
        # unequal hosts: all_reduce by intervals (plan/ho_ring/all_reduce.py), the others by padded rails
        assert plan.algo == "ho_ring", plan.summary()
        assert plan.meta.get("padded", False) == ("+" in spec and coll != "all_reduce"), plan.describe()
        host_impls = {s.impl for s in plan.steps if s.tier == "host"}
        if plan.algo == "ho_ring" and "host" in plan.meta["tiers"]:
            assert host_impls == ({"shm"} if transport == "shm" else host_impls - {"shm"}), plan.describe()
    assert cases > 300


# (topology, forced K, host transport, shm piece bytes): small pieces make small
# tensors stream through the segment in many pieces, as large ones do
@pytest.mark.slow
@pytest.mark.parametrize("spec,chunks,transport,piece", [
    ("2x4", "3", "net", ""), ("2x4", "2", "shm", "4096"), ("4x2", "", "net", ""), ("2x4:scattered", "2", "shm", ""),
    ("2x2x2", "2", "net", ""), ("3+5", "", "shm", ""), ("8", "", "shm", "4096"), ("8", "", "net", ""),
])
def test_eight_ranks(spec: str, chunks: str, transport: str, piece: str) -> None:
    run_world(8, _world_body, spec, transport, env=hocc_env(spec, transport, chunks, piece))


def _subgroups_body(rank: int, world: int) -> None:
    uniform = dist.new_group([1, 2, 5, 6])      # 2 hosts x 2 ranks of the 2x4 world
    uneven = dist.new_group([0, 1, 2, 4, 5])    # hosts of 3 and 2 ranks
    small = (torch.float32, torch.int64, torch.bfloat16)
    if rank in (1, 2, 5, 6):
        plan = hocc.plan_for("all_reduce", torch.empty(1 << 12), group=uniform, algo="ho_ring")
        assert plan.algo == "ho_ring" and plan.meta["hosts"] == [2, 2] and plan.meta["unit"] == 2, plan.describe()
        check_all(rank, world, group=uniform, dtypes=small)
        check_list_forms(rank, world, group=uniform)
    if rank in (0, 1, 2, 4, 5):
        plan = hocc.plan_for("all_reduce", torch.empty(1 << 12), group=uneven, algo="ho_ring")
        assert plan.algo == "ho_ring" and plan.meta["hosts"] == [3, 2], plan.describe()
        plan = hocc.plan_for("all_gather", torch.empty(1 << 12), group=uneven, algo="ho_ring")
        assert plan.algo == "ho_ring" and plan.meta["hosts"] == [3, 2] and plan.meta["padded"], plan.describe()
        check_all(rank, world, group=uneven, dtypes=small)
    dist.barrier()


@pytest.mark.slow
def test_subgroups() -> None:
    run_world(8, _subgroups_body, env={"HOCC_TOPOLOGY": "2x4", "HOCC_CHUNKS": "2"})


def _four_body(rank: int, world: int, held: bool) -> None:
    check_all(rank, world, dtypes=(torch.float32, torch.int32, torch.float16), sizes=(1, 3, 4, 5, 37))
    check_list_forms(rank, world)
    if held:
        check_held_memory(rank, world)


def check_held_memory(rank: int, world: int) -> None:
    """What hocc holds between calls is bounded, whatever the largest call: the executor's work buffer
    at most the largest of its last calls' (kept while that size repeats), and 4 MiB (Executor::kKeepWork)
    once 8 calls (kKeepRuns) did not need it; each communicator a few segments of one stage's region (its
    scratch, and over UCX the buffer a reduction lands in: Comm::held_bytes). Here the ring's world comm holds
    3 of its 4 segments (2 of scratch for reduce_scatter_out, 1 landing) and HO-Ring's comms less."""
    from hocc.engine.group_engines import find_engine

    big = 16 << 20  # bytes of the largest buffer of each call
    n = big // 4
    for algo in ("ho_ring", "ring", "native"):
        x = torch.full((n,), float(rank + 1))
        hocc.all_reduce(x, algo=algo)  # in place: native runs beside the caller's tensor
        assert torch.equal(x, torch.full((n,), float(sum(range(1, world + 1))))), algo
        out = torch.empty(n)
        hocc.all_gather_into_tensor(out, torch.full((n // world,), float(rank)), algo=algo)
        assert torch.equal(out, torch.arange(world).float().repeat_interleave(n // world)), algo
        part = torch.empty(n // world)
        hocc.reduce_scatter_tensor(part, torch.ones(n), algo=algo)
        assert torch.equal(part, torch.full((n // world,), float(world))), algo
    eng = find_engine(dist.group.WORLD, torch.device("cpu"))
    assert eng is not None
    assert eng.executor.held_bytes <= 2 * big, eng.executor.held_bytes  # the plan's layout: about the call's
    assert eng.transport.held_bytes <= big + big // 4, eng.transport.held_bytes
    for _ in range(8):  # small calls: the large buffer goes back
        hocc.all_reduce(torch.ones(1000), algo="ho_ring")
    assert eng.executor.held_bytes <= 4 << 20, eng.executor.held_bytes


@pytest.mark.slow
@pytest.mark.parametrize("spec", ["2x2", "4", "4x1"])
def test_four_ranks(spec: str) -> None:
    # 2x2 also in trace mode: every step from one thread in wavefront order, the GPU's path (Executor::
    # run_wavefront), here over shared memory and gloo
    env = {"HOCC_TOPOLOGY": spec, "HOCC_CHUNKS": "4", **({"HOCC_TRACE": "1"} if spec == "2x2" else {})}
    run_world(4, _four_body, spec == "2x2", env=env)


def _one_body(rank: int, world: int) -> None:
    check_all(rank, world, dtypes=(torch.float32, torch.int64), sizes=(1, 5))


def test_world_of_one() -> None:
    run_world(1, _one_body, env={"HOCC_TOPOLOGY": "1"})
