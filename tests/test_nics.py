"""Hosts with several NICs: the spec and file round trip, and the cost model
charging each flow to the NIC of the rank that sends it (hand-checked: eight
rails on eight NICs run in parallel, on one NIC they share it; a flat ring's
host crossings use one NIC whatever the host has)."""

from __future__ import annotations

import json

import pytest

from hocc.plan import CostParams, predict
from hocc.plan.cost import step_load
from hocc.plan.ho_ring import build_ho_ring
from hocc.plan.nccl_native import options, predict_nccl
from hocc.plan.ring import build_ring
from hocc.plan.volumes import link_bound
from hocc.topology import HostInfo, Topology, parse_spec, with_nics

NO_SOFTWARE = CostParams(launch=0.0, ring_step=0.0, copy_bandwidth=1e30, host_message=0.0)
MB = 1_000_000
FAST_HOST = "host=8000gbit,host_latency=0,nic=8mbit,nic_latency=0"  # NICs at 1 MB/s


def test_spec_and_file_round_trip_with_nics(tmp_path) -> None:  # type: ignore[no-untyped-def]
    t = parse_spec("4x8@nics=8,fabric=nvswitch,nic=400gbit,host=450GB")
    h = t.host_infos()[1]
    assert h.nics == 8 and h.fabric == "nvswitch" and h.nic_map() == tuple(range(8))
    assert t.nic_of(13) == 5 and t.links.nic.bandwidth == pytest.approx(50e9)
    p = tmp_path / "t.json"
    p.write_text(t.to_json())
    assert parse_spec(str(p)) == t
    assert json.loads(p.read_text())["hosts"][0]["nics"] == 8
    # two NICs per host: blocks of four ranks; an explicit map and names survive too
    assert parse_spec("2x8@nics=2").host_infos()[0].nic_map() == (0, 0, 0, 0, 1, 1, 1, 1)
    y = tmp_path / "t.yaml"
    y.write_text("hosts:\n  - {name: a, ranks: [0, 1, 2, 3], nics: [mlx5_0, mlx5_1], nic_of: [1, 1, 0, 0]}\n"
                 "  - {name: b, ranks: [4, 5, 6, 7], nics: 2, fabric: nvswitch}\n")
    ty = parse_spec(str(y))
    assert [ty.nic_of(r) for r in range(8)] == [1, 1, 0, 0, 0, 0, 1, 1]
    assert ty.host_infos()[0].nic_names == ("mlx5_0", "mlx5_1")
    assert Topology.from_dict(json.loads(ty.to_json())) == ty
    # the CPU testbed's files do not change: one NIC writes no NIC fields
    assert set(parse_spec("2x4").to_dict()["hosts"][0]) == {"name", "switch", "ranks"}


def test_restrict_keeps_each_ranks_nic() -> None:
    t = parse_spec("2x8@nics=8")
    sub = t.restrict([9, 3, 12])
    assert [sub.nic_of(r) for r in range(3)] == [1, 3, 4]
    assert sub.host_infos()[0].nics == 8


@pytest.mark.parametrize("bad, what", [("2x8@nics=0", "at least one NIC"), ("2x8@nics=two", "number"),
                                       ("2x8@fabric=pcie", "fabric")])
def test_bad_nic_specs(bad: str, what: str) -> None:
    with pytest.raises(ValueError, match=what):
        parse_spec(bad)


def test_bad_nic_maps() -> None:
    with pytest.raises(ValueError, match=r"outside 0\.\.1"):
        Topology([HostInfo("a", "s", (0, 1), nics=2, nic_of=(0, 2))])
    with pytest.raises(ValueError, match="one NIC index per rank"):
        Topology([HostInfo("a", "s", (0, 1), nics=2, nic_of=(0,))])


@pytest.mark.parametrize("nics, seconds", [(8, 1.0), (2, 4.0), (1, 8.0)])
def test_rails_on_their_own_nics(nics: int, seconds: float) -> None:
    """2 hosts x 8 ranks, HO-Ring all-gather of 1 MB per rank, one chunk: the
    rail stage's 8 rings each send 1 MB out of every host. On 8 NICs each NIC
    carries 1 MB (1 s at 1 MB/s); on 2 NICs four rails share one (4 s); on one
    NIC all eight do (8 s). The host stage is free (host link at 1 TB/s)."""
    topo = parse_spec(f"2x8@nics={nics},{FAST_HOST}")
    plan = build_ho_ring("all_gather", topo, MB // 4, 1)
    assert plan is not None
    rail = next(s for s in plan.steps if s.tier == "nic")
    load, _ = step_load(rail, 4, topo, params=NO_SOFTWARE)
    busiest = max(v for k, v in load.items() if k[0] == "nic_out")
    assert busiest == pytest.approx(8 / nics * MB)
    assert sum(1 for k in load if k[0] == "nic_out") == 2 * nics
    assert predict(plan, topo, 4, NO_SOFTWARE) == pytest.approx(seconds, rel=1e-3)


def test_flat_ring_crosses_through_one_nic() -> None:
    """A flat ring leaves each host once, from its last rank: one NIC carries
    every crossing whether the host has one NIC or eight, so the ring's time
    does not change with the NIC count (what a one-ring NCCL would see)."""
    one, eight = parse_spec(f"2x8@{FAST_HOST}"), parse_spec(f"2x8@nics=8,{FAST_HOST}")
    plan = build_ring("all_gather", one, MB // 4)
    load, _ = step_load(plan.steps[0], 4, eight, params=NO_SOFTWARE)
    used = {k for k in load if k[0] == "nic_out"}
    assert used == {("nic_out", "host0/nic7"), ("nic_out", "host1/nic7")}
    assert load[("nic_out", "host0/nic7")] == pytest.approx(15 * MB)  # a 1 MB block on each of the 15 hops
    assert predict(plan, eight, 4, NO_SOFTWARE) == pytest.approx(predict(plan, one, 4, NO_SOFTWARE))


def test_nvswitch_gives_each_rank_its_link() -> None:
    """One host of 8 ranks, ring all-gather of 1 MB blocks at 1 MB/s host links:
    through an NVSwitch each rank sends its 7 MB on its own link (7 s); on a
    shared fabric the 8 ranks' 56 MB share one link (56 s)."""
    links = "host=8mbit,host_latency=0"
    shared, switched = parse_spec(f"8@{links}"), parse_spec(f"8@fabric=nvswitch,{links}")
    plan = build_ring("all_gather", shared, MB // 4)
    assert predict(plan, shared, 4, NO_SOFTWARE) == pytest.approx(56.0)
    assert predict(plan, switched, 4, NO_SOFTWARE) == pytest.approx(7.0)


def test_nccl_rings_use_every_nic() -> None:
    """NCCL's channels spread over all NICs: 2 hosts x 8, all-gather of S = 16
    MB, the ring's bus bytes (15/16 S) leave each host over 8 NICs at 1 MB/s,
    so 15/16 * 16 / 8 s; with one NIC 8x that. Latency-free, simple protocol."""
    gpu = CostParams(launch=0.0, native="nccl")
    for nics, want in ((8, 15 / 16 * 16 / 8), (1, 15 / 16 * 16)):
        topo = parse_spec(f"2x8@nics={nics},{FAST_HOST}")
        assert options("all_gather", topo, MB // 4, 4, gpu)["ring/simple"] == pytest.approx(want)
        # the least the links allow (HO-Ring's (N-1)/N * S per host) spreads over the NICs too
        assert link_bound("all_gather", 16 * MB, topo) == pytest.approx(16 / 2 / nics)
    # latency-bound: a tiny all-reduce over many hosts takes the tree, a big one a ring or NVLS
    big = with_nics(parse_spec("64x8@nic=400gbit,host=450GB,nic_latency=8us,host_latency=2us"), 8, "nvswitch")
    assert predict_nccl("all_reduce", big, 2, 4, gpu)[0].startswith("tree/")
    assert not predict_nccl("all_reduce", big, 1 << 28, 4, gpu)[0].startswith("tree/")
