"""host_rails (hocc/plan/host_rails.py): small all_reduce in two steps, inside each host and then across
hosts on every rail. Its plans, and its results against torch.distributed's own on hosts of one size (shared
memory and network host steps, one host, one rank per host) and where it falls back (unequal hosts, the
other collectives)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import hocc
from hocc.plan.planner import make_plan
from hocc.plan.registry import PlannerConfig
from hocc.topology import parse_spec
from tests.cases import check_all
from tests.worlds import hocc_env, run_world


def test_two_steps_each_over_the_whole_buffer() -> None:
    plan = make_plan("all_reduce", 13, 4, parse_spec("2x4"), "host_rails", PlannerConfig(host_impl="shm"))
    assert plan.algo == "host_rails" and plan.stages == 2
    host, rails = plan.steps
    assert (host.tier, host.impl, [g.ranks for g in host.groups]) == ("host", "shm", [(0, 1, 2, 3), (4, 5, 6, 7)])
    assert rails.tier == "nic" and [g.ranks for g in rails.groups] == [(0, 4), (1, 5), (2, 6), (3, 7)]
    assert all((g.offset, g.seg) == (0, 13) for s in plan.steps for g in s.groups)
    assert host.src == "input"  # stage 0 reads the caller's tensor: nothing packed


@pytest.mark.parametrize("spec,stages", [("8", 1), ("8x1", 1), ("4x2", 2), ("2x2x2", 2)])
def test_one_step_per_tier_with_peers(spec: str, stages: int) -> None:
    plan = make_plan("all_reduce", 7, 4, parse_spec(spec), "host_rails")
    assert plan.algo == "host_rails" and plan.stages == stages, plan.describe()


@pytest.mark.parametrize("coll,spec", [("all_reduce", "3+5"), ("all_gather", "2x4"), ("reduce_scatter", "2x4")])
def test_falls_back_to_ho_ring_saying_why(coll: str, spec: str) -> None:
    plan = make_plan(coll, 7, 4, parse_spec(spec), "host_rails")
    assert plan.algo == "ho_ring" and "hosts of one size" in plan.reason, plan.reason


def _body(rank: int, world: int) -> None:
    n = check_all(rank, world, algos=("host_rails",), dtypes=(torch.float32, torch.int64, torch.bfloat16),
                  sizes=(0, 1, 13, 1031))
    x = torch.full((600,), float(rank + 1))  # over the shared-memory one-barrier size (2 KiB)
    hocc.all_reduce(x, algo="host_rails")
    assert torch.equal(x, torch.full((600,), float(world * (world + 1) // 2))), x[:4]
    assert hocc.last_plan().algo == "host_rails"
    assert n > 50
    dist.barrier()


@pytest.mark.slow
@pytest.mark.parametrize("spec,transport", [("2x4", "shm"), ("4x2", "net"), ("8", "shm"), ("8x1", "net")])
def test_against_torch(spec: str, transport: str) -> None:
    run_world(8, _body, env=hocc_env(spec, transport))
