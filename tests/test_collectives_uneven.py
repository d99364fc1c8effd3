"""Multi-process correctness of HO-Ring on unequal hosts (plan/ho_ring_uneven.py,
and the padded rails of plan/ho_ring_uneven_rsag.py for reduce_scatter and
all_gather) on gloo: every collective x dtype x reduction op x size against
torch.distributed, on 1+7, 2+3+3, 4+4+3, three levels with unequal switches,
and every dtype on a 3+2 sub-group (3+5, and the sub-group with all algos,
are in test_collectives.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import hocc
from tests.cases import check_all
from tests.worlds import hocc_env, run_world

SMALL = (torch.float32, torch.int64, torch.bfloat16)


def _body(rank: int, world: int, transport: str, full: bool) -> None:
    for coll in ("all_reduce", "reduce_scatter", "all_gather"):
        plan = hocc.plan_for(coll, torch.empty(1 << 16), algo="ho_ring")
        assert plan.algo == "ho_ring" and plan.meta.get("uneven"), plan.describe()
        assert plan.meta.get("padded", False) == (coll != "all_reduce"), plan.describe()
        if transport == "shm":
            assert {s.impl for s in plan.steps if s.tier == "host"} == {"shm"}, plan.describe()
        if not full and coll != "all_reduce":  # three levels: a switch stage, then trunk rails
            assert {"host", "nic", "trunk"} <= set(plan.meta["tiers"]), plan.describe()
    # only ho_ring is new here (native, ring and auto run on these shapes in test_collectives.py)
    kw = {"algos": ("ho_ring",)} if full else {"dtypes": SMALL, "algos": ("ho_ring", "auto")}
    assert check_all(rank, world, **kw) > 50


@pytest.mark.parametrize("spec,chunks,transport,piece", [
    ("1+7", "3", "net", ""), ("2+3+3", "2", "shm", "4096"), ("4+4+3", "", "shm", ""),
])
def test_unequal_hosts(spec: str, chunks: str, transport: str, piece: str) -> None:
    world = sum(int(x) for x in spec.split("+"))
    run_world(world, _body, transport, True, env=hocc_env(spec, transport, chunks, piece))


def test_three_levels_unequal_switches(tmp_path: Path) -> None:
    """Switch 0 holds hosts of 3 and 2 ranks, switch 1 one host of 3; ranks numbered out of host order."""
    hosts = [{"name": "a", "switch": "s0", "ranks": [0, 4, 7]}, {"name": "b", "switch": "s0", "ranks": [1, 5]},
             {"name": "c", "switch": "s1", "ranks": [2, 3, 6]}]
    path = tmp_path / "topo.json"
    path.write_text(json.dumps({"hosts": hosts}))
    run_world(8, _body, "shm", False, env={"HOCC_TOPOLOGY": str(path), "HOCC_CHUNKS": "2"})


def _subgroup_body(rank: int, world: int) -> None:
    """3 ranks of one host and 2 of another, every dtype and op, ho_ring only."""
    group = dist.new_group([0, 1, 2, 4, 5])
    if rank in (0, 1, 2, 4, 5):
        for coll in ("reduce_scatter", "all_gather"):
            plan = hocc.plan_for(coll, torch.empty(1 << 12), group=group, algo="ho_ring")
            assert plan.meta["padded"] and plan.meta["hosts"] == [3, 2], plan.describe()
        assert check_all(rank, world, group=group, algos=("ho_ring",)) > 50
    dist.barrier()


def test_unequal_subgroup() -> None:
    run_world(8, _subgroup_body, env=hocc_env("2x4", "shm", "2"))
