"""Multi-process correctness of HO-Ring on unequal hosts (plan/ho_ring_uneven.py)
on gloo: every collective x dtype x reduction op x size against
torch.distributed, on 1+7, 2+3+3, 4+4+3 and three levels with unequal
switches (3+5 and a 3+2 sub-group are in test_collectives.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import hocc
from tests.cases import check_all
from tests.worlds import hocc_env, run_world

SMALL = (torch.float32, torch.int64, torch.bfloat16)


def _body(rank: int, world: int, transport: str, full: bool) -> None:
    plan = hocc.plan_for("all_reduce", torch.empty(1 << 16), algo="ho_ring")
    assert plan.algo == "ho_ring" and plan.meta.get("uneven"), plan.describe()
    if transport == "shm":
        assert {s.impl for s in plan.steps if s.tier == "host"} == {"shm"}, plan.describe()
    assert max(len(s.groups_of(rank)) for s in plan.steps) >= 1
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
