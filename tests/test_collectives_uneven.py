"""Multi-process correctness of HO-Ring on unequal hosts (plan/ho_ring/all_reduce.py,
and the padded rails of plan/ho_ring/rails.py for reduce_scatter and
all_gather) on gloo: every collective x dtype x reduction op x size against
torch.distributed, on 1+7, 2+3+3, 4+4+3, three levels with unequal switches,
and every dtype on a 3+2 sub-group (3+5, and the sub-group with all algos,
are in test_collectives.py)."""

from __future__ import annotations

import dataclasses
import itertools
import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import hocc
from hocc.executor.inproc import InProcWorld
from hocc.plan.ho_ring import build_ho_ring
from hocc.plan.types import PAD_BLOCK
from hocc.topology import HostInfo, Topology, parse_spec
from tests.cases import check_all
from tests.worlds import hocc_env, run_world

SMALL = (torch.float32, torch.int64, torch.bfloat16)


def _body(rank: int, world: int, transport: str, full: bool) -> None:
    for coll in ("all_reduce", "reduce_scatter", "all_gather"):
        plan = hocc.plan_for(coll, torch.empty(1 << 16), algo="ho_ring")
        assert plan.algo == "ho_ring", plan.describe()
        if coll == "all_reduce":  # intervals: some rank owns several, so sits on several rails of one step
            assert any(len(s.groups_of(r)) > 1 for s in plan.steps for r in range(world)), plan.describe()
        else:  # rails padded to the widest host
            assert PAD_BLOCK in plan.layout.order, plan.describe()
        if transport == "shm":
            assert {s.impl for s in plan.steps if s.tier == "host"} == {"shm"}, plan.describe()
        if not full and coll != "all_reduce":  # three levels: a switch stage, then trunk rails
            assert {"host", "nic", "trunk"} <= set(plan.meta["tiers"]), plan.describe()
    # only ho_ring is new here (native, ring and auto run on these shapes in test_collectives.py)
    kw = {"algos": ("ho_ring",)} if full else {"dtypes": SMALL, "algos": ("ho_ring", "auto")}
    assert check_all(rank, world, **kw) > 50


@pytest.mark.slow
@pytest.mark.parametrize("spec,chunks,transport,piece", [
    ("1+7", "3", "net", ""), ("2+3+3", "2", "shm", "4096"), ("4+4+3", "", "shm", ""),
])
def test_unequal_hosts(spec: str, chunks: str, transport: str, piece: str) -> None:
    world = sum(int(x) for x in spec.split("+"))
    run_world(world, _body, transport, True, env=hocc_env(spec, transport, chunks, piece))


@pytest.mark.slow
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


@pytest.mark.slow
def test_unequal_subgroup() -> None:
    run_world(8, _subgroup_body, env=hocc_env("2x4", "shm", "2"))


@pytest.mark.parametrize("sizes", [[[3, 5]], [[1, 7]], [[4, 4, 3]], [[1, 2, 9]], [[3, 2], [3]], [[2, 2], [2, 1]]])
def test_padded_rails_in_process(sizes: list[list[int]]) -> None:
    """The C++ executor's pad slots (csrc/executor/layout.cc: zeros on pack,
    skipped on unpack) on every padded-rail shape, ranks as threads."""
    hosts, r = [], 0
    for s, switch in enumerate(sizes):
        for h, n in enumerate(switch):
            hosts.append(HostInfo(f"s{s}h{h}", f"s{s}", tuple(range(r, r + n))))
            r += n
    topo = Topology(hosts)
    world = InProcWorld(r)
    gen = torch.Generator().manual_seed(r)
    for coll, count, chunks in itertools.product(("reduce_scatter", "all_gather"), (0, 1, 7, 31), (1, 3)):
        plan = build_ho_ring(coll, topo, count, chunks, ("reduce_scatter", "all_gather"))
        assert plan is not None and plan.meta["padded"] and PAD_BLOCK in plan.layout.order
        n_in = count * r if coll == "reduce_scatter" else count
        xs = [torch.randint(-4, 5, (n_in,), generator=gen).to(torch.int32) for _ in range(r)]
        outs = [torch.full((count * r if coll == "all_gather" else count,), 77, dtype=torch.int32) for _ in range(r)]
        world.run(plan, xs, outs)
        for rank in range(r):
            if coll == "reduce_scatter":
                want = torch.stack([x[rank * count:(rank + 1) * count] for x in xs]).sum(0).to(torch.int32)
            else:
                want = torch.cat(xs)
            assert torch.equal(outs[rank], want), (sizes, coll, count, chunks, rank, plan.describe())


def test_a_layout_naming_no_rank_is_refused_before_any_byte_moves() -> None:
    plan = build_ho_ring("reduce_scatter", parse_spec("3+5"), 4, 1)
    assert plan is not None
    bad = dataclasses.replace(plan, layout=dataclasses.replace(plan.layout, order=(9, *plan.layout.order[1:])))
    xs = [torch.ones(32, dtype=torch.int32) for _ in range(8)]
    outs = [torch.full((4,), 77, dtype=torch.int32) for _ in range(8)]
    with pytest.raises(RuntimeError, match=r"names block 9, outside 0\.\.7"):
        InProcWorld(8).run(bad, xs, outs)
    assert all(torch.equal(o, torch.full((4,), 77, dtype=torch.int32)) for o in outs)
