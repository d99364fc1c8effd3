"""Topology model and specs (no torch, no processes)."""

from __future__ import annotations

import json

import pytest

from hocc.topology import LinkModel, Topology, from_hostnames, parse_rate, parse_spec, uniform


def test_compact_specs() -> None:
    t = parse_spec("2x4")
    assert t.world_size == 8 and t.host_groups() == [(0, 1, 2, 3), (4, 5, 6, 7)]
    assert t.rails() == [(0, 4), (1, 5), (2, 6), (3, 7)]
    s = parse_spec("2x4:scattered")
    assert s.host_groups() == [(0, 2, 4, 6), (1, 3, 5, 7)] and s.host_of(5) == "host1"
    three = parse_spec("2x2x2")
    assert three.switch_groups() == [[(0, 1), (2, 3)], [(4, 5), (6, 7)]] and three.shape() == "2x2x2"
    assert three.switch_of(0) != three.switch_of(7)
    uneven = parse_spec("3+5")
    assert [len(h) for h in uneven.host_groups()] == [3, 5] and uneven.shape() == "3+5"
    assert parse_spec("8").host_groups() == [tuple(range(8))]


def test_link_settings() -> None:
    t = parse_spec("2x4@nic=1gbit,host=20gbit,nic_latency=50us")
    assert t.links.nic.bandwidth == pytest.approx(125e6)
    assert t.links.host.bandwidth == pytest.approx(2.5e9)
    assert t.links.nic.latency == pytest.approx(50e-6)
    assert parse_rate("200mbit") == pytest.approx(25e6)
    assert parse_rate("25GB") == pytest.approx(25e9)


@pytest.mark.parametrize("bad", ["", "2y4", "0x4", "2x4:diagonal", "2x4@nic", "2x4@wire=1gbit", "1x2x3x4",
                                 "3+5:scattered"])
def test_bad_specs_name_the_problem(bad: str) -> None:
    with pytest.raises(ValueError, match=r"\S"):
        parse_spec(bad)


def test_restrict_renumbers_by_group_rank() -> None:
    t = parse_spec("2x4:scattered")
    sub = t.restrict([1, 3, 5, 2])
    assert sub.world_size == 4
    assert sub.host_groups() == [(0, 1, 2), (3,)]
    with pytest.raises(KeyError):
        t.restrict([0, 9])


def test_file_roundtrip(tmp_path) -> None:  # type: ignore[no-untyped-def]
    t = uniform(4, 2, switches=2, links=LinkModel().with_tier("trunk", LinkModel().nic))
    p = tmp_path / "topo.json"
    p.write_text(t.to_json())
    assert parse_spec(str(p)) == t
    y = tmp_path / "topo.yaml"
    y.write_text("hosts:\n  - {name: a, ranks: [0, 2]}\n  - {name: b, ranks: [1, 3]}\nlinks:\n  nic: 1gbit\n")
    ty = parse_spec(str(y))
    assert ty.host_groups() == [(0, 2), (1, 3)] and ty.links.nic.bandwidth == pytest.approx(125e6)
    assert Topology.from_dict(json.loads(t.to_json())) == t


def test_invalid_topologies() -> None:
    with pytest.raises(ValueError, match="missing"):
        Topology.from_dict({"hosts": [{"ranks": [0, 2]}]})
    with pytest.raises(ValueError, match="two hosts"):
        Topology.from_dict({"hosts": [{"ranks": [0, 1]}, {"ranks": [1]}]})
    with pytest.raises(ValueError, match="hosts"):
        Topology.from_dict({"ranks": [0]})


def test_from_hostnames() -> None:
    t = from_hostnames(["a", "b", "a", "b"])
    assert t.host_groups() == [(0, 2), (1, 3)]
