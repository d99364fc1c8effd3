"""Plans as data: the symbolic simulator over hundreds of random hierarchies,
the simulator's own ability to catch broken plans, serialization, and the
cost model / planner on hand-checked cases."""

from __future__ import annotations

import dataclasses
import random

import pytest

from hocc.plan import Plan, PlanError, PlannerConfig, link_bound, make_plan, predict, simulate
from hocc.plan.cost import _Places, step_load
from hocc.plan.ho_ring import build_ho_ring
from hocc.plan.ring import build_ring
from hocc.plan.simulate import nic_traffic
from hocc.plan.types import PAD_BLOCK
from hocc.topology import HostInfo, Topology, parse_spec, uniform

COLLS = ("all_reduce", "reduce_scatter", "all_gather")


def random_topology(rng: random.Random) -> Topology:
    """Uniform or not, one to three levels, block / scattered / shuffled placement,
    sometimes a random sub-group of it."""
    kind = rng.choice(["uniform", "uniform", "three", "uneven", "shuffled"])
    if kind == "uneven":
        sizes = [rng.randint(1, 5) for _ in range(rng.randint(1, 5))]
        ranks = list(range(sum(sizes)))
        rng.shuffle(ranks)
        hosts, start = [], 0
        for i, n in enumerate(sizes):
            hosts.append(HostInfo(f"h{i}", "s0", tuple(ranks[start:start + n])))
            start += n
        topo = Topology(hosts)
    elif kind == "three":
        s, h, g = rng.randint(1, 3), rng.randint(1, 3), rng.randint(1, 4)
        topo = uniform(s * h, g, s, rng.choice(["block", "scattered"]))
    elif kind == "shuffled":
        h, g = rng.randint(1, 4), rng.randint(1, 4)
        ranks = list(range(h * g))
        rng.shuffle(ranks)
        topo = Topology([HostInfo(f"h{i}", "s0", tuple(ranks[i * g:(i + 1) * g])) for i in range(h)])
    else:
        topo = uniform(rng.randint(1, 5), rng.randint(1, 5), 1, rng.choice(["block", "scattered"]))
    if rng.random() < 0.3 and topo.world_size > 1:
        members = rng.sample(range(topo.world_size), rng.randint(1, topo.world_size))
        topo = topo.restrict(members)
    return topo


@pytest.mark.parametrize("seed", range(300))
def test_random_hierarchies(seed: int) -> None:
    rng = random.Random(seed)
    topo = random_topology(rng)
    coll = COLLS[seed % 3]
    count = rng.choice([0, 1, 2, 3, 5, 7, 11, 16, 31, 64, 101])
    chunks = rng.choice([1, 2, 3, 5])
    plan = build_ho_ring(coll, topo, count, chunks)
    if plan is not None:
        simulate(plan, seed)
        simulate(Plan.from_json(plan.to_json()), seed + 1)
    simulate(build_ring(coll, topo, count), seed)
    cfgs = (PlannerConfig(min_chunk_bytes=8),
            PlannerConfig(min_chunk_bytes=8, ring_ops=("reduce_scatter", "all_gather"), host_impl="shm"))
    for algo in ("auto", "native", "ring", "ho_ring"):
        for cfg in cfgs:
            simulate(make_plan(coll, count, 4, topo, algo, cfg), seed)


def test_ho_ring_exists_for_uniform_and_unequal_hierarchies() -> None:
    for coll in ("reduce_scatter", "all_gather", "all_reduce"):  # unequal: tests/test_plans_uneven.py
        assert build_ho_ring(coll, parse_spec("3+5"), 10, 1) is not None
    assert build_ho_ring("all_reduce", parse_spec("2x2x2"), 10, 1) is not None
    plan = make_plan("all_gather", 1000, 4, parse_spec("3+5"), "ho_ring")
    assert plan.algo == "ho_ring" and plan.meta["padded"]


def _break(plan: Plan, how: str) -> Plan:
    steps = list(plan.steps)
    s = steps[0]
    g = s.groups[0]
    if how == "offset":
        g = dataclasses.replace(g, offset=g.offset + 1)
    elif how == "members":
        g = dataclasses.replace(g, ranks=g.ranks[1:] + g.ranks[:1])
        s = dataclasses.replace(s, impl="ring")
    elif how == "drop":
        steps.pop()
        return dataclasses.replace(plan, steps=steps)
    elif how == "race":
        s = dataclasses.replace(steps[-1], chunk=0)
        steps[-1] = s
        return dataclasses.replace(plan, steps=steps)
    steps[0] = dataclasses.replace(s, groups=(g, *s.groups[1:]))
    return dataclasses.replace(plan, steps=steps)


@pytest.mark.parametrize("how", ["offset", "members", "drop", "race"])
@pytest.mark.parametrize("coll", COLLS)
def test_simulator_catches_broken_plans(coll: str, how: str) -> None:
    plan = build_ho_ring(coll, parse_spec("2x2x2"), 24, 2)
    assert plan is not None
    simulate(plan)
    with pytest.raises(PlanError):
        simulate(_break(plan, how))


def test_plan_json_roundtrip() -> None:
    plan = make_plan("reduce_scatter", 1000, 2, parse_spec("2x4:scattered"), "ho_ring",
                     PlannerConfig(chunks=3))
    again = Plan.from_json(plan.to_json())
    assert again == plan and again.chunks == 3
    assert "stage 1 chunk 2" in plan.describe()


def test_inter_host_bytes_match_the_design() -> None:
    """docs/algorithms.md: per host, inter-host bytes 2(N-1)/N*S for ho_ring all-reduce
    against 2(W-1)/W*S for the flat ring."""
    topo = parse_spec("2x4")
    places = _Places(topo)
    S = 8 * 1024
    ho = build_ho_ring("all_reduce", topo, S, 1)
    assert ho is not None
    nic = sum(step_load(s, 1, topo, places, PlannerConfig().params)[0].get(("nic_out", "host0"), 0.0)
              for s in ho.steps)
    assert nic == pytest.approx(2 * (2 - 1) / 2 * S)
    ring = build_ring("all_reduce", topo, S)
    nic_ring = sum(step_load(s, 1, topo, places, PlannerConfig().params)[0].get(("nic_out", "host0"), 0.0)
                   for s in ring.steps)
    assert nic_ring == pytest.approx(2 * (8 - 1) / 8 * S)
    rs = build_ho_ring("reduce_scatter", topo, S // 8, 1)
    assert rs is not None
    nic_rs = sum(step_load(s, 1, topo, places, PlannerConfig().params)[0].get(("nic_out", "host0"), 0.0)
                 for s in rs.steps)
    assert nic_rs == pytest.approx((2 - 1) / 2 * S)


@pytest.mark.parametrize("spec", ["2x4", "2x4:scattered", "4x2", "8x1", "3x5", "1x8", "2x2x2", "3x2x4",
                                  "2x3x2:scattered", "4x1x3", "2x2x2@trunk=100gbit", "3x3x2@trunk=100gbit"])
def test_uniform_grids_meet_the_closed_forms(spec: str) -> None:
    """The one builder on a uniform grid: every host's NIC and every switch's
    trunk carry exactly docs/algorithms.md's bytes (all_reduce 2(N-1)/N * S and
    2(M-1)/M * S; the others (N-1)/N and (M-1)/M), one group per rank per step
    (no rounds), no pad slot, and one stage per tier and direction."""
    topo = parse_spec(spec)
    infos = topo.host_infos()
    host_of, switch_of = {r: h.name for h in infos for r in h.ranks}, {h.name: h.switch for h in infos}
    n_hosts, n_switches = len(infos), len(set(switch_of.values()))
    tiers = sum(1 for n in (max(len(h.ranks) for h in infos), n_hosts // n_switches, n_switches) if n > 1)
    for coll in COLLS:
        block = 2 * 3 * 4 * 5 * 7 * 9  # divides every segment: no padding, exact ring parts
        plan = build_ho_ring(coll, topo, block, 1)
        assert plan is not None and PAD_BLOCK not in plan.layout.order
        simulate(plan)
        S = block if coll == "all_reduce" else block * topo.world_size
        f = 2 if coll == "all_reduce" else 1
        nic, trunk = nic_traffic(plan, host_of, switch_of)
        if n_hosts > 1:
            assert set(nic.values()) == {f * (n_hosts - 1) * S // n_hosts}, (coll, nic)
        if n_switches > 1:
            assert set(trunk.values()) == {f * (n_switches - 1) * S // n_switches}, (coll, trunk)
        assert plan.stages == (2 * tiers - 1 if coll == "all_reduce" else tiers), plan.describe()
        for s in plan.steps:
            assert sorted(r for g in s.groups for r in g.ranks) == sorted(set(r for g in s.groups for r in g.ranks))


def test_flow_sharing_on_one_nic() -> None:
    """G rails leaving one host share its NIC: a step's NIC time grows with G."""
    one = predict(build_ho_ring("all_gather", parse_spec("2x1"), 1 << 20, 1), parse_spec("2x1"), 4)  # type: ignore[arg-type]
    four = predict(build_ho_ring("all_gather", parse_spec("2x4"), 1 << 20, 1), parse_spec("2x4"), 4)  # type: ignore[arg-type]
    assert four > 3.5 * one


def test_pipelining_helps_when_stages_balance() -> None:
    topo = parse_spec("2x4@nic=1gbit,host=4gbit")  # host stages (both on loopback) ~ rail stage
    k1 = predict(build_ho_ring("all_reduce", topo, 1 << 24, 1), topo, 4)  # type: ignore[arg-type]
    k8 = predict(build_ho_ring("all_reduce", topo, 1 << 24, 8), topo, 4)  # type: ignore[arg-type]
    assert k8 < 0.8 * k1


def test_the_pipeline_floor_is_the_devices() -> None:
    """HO-Ring's K keeps chunks of at least 64 KiB on CPU and 512 KiB on CUDA (bench/results/chunks/); a set
    floor wins on either, and calibrate re-prices a recorded run with the floor it ran with."""
    from hocc.plan.calibrate import planner_for
    from hocc.plan.policy import planner_settings, settings_meta
    topo = parse_spec("2x4@nic=1gbit")
    count = (1 << 20) // 4  # a 1 MiB all_reduce: K=16 makes 64 KiB chunks, K=2 512 KiB
    cpu = planner_settings(PlannerConfig(), "cpu", topo)
    cuda = planner_settings(PlannerConfig(), "cuda", topo)
    assert (cpu.min_chunk_bytes, cuda.min_chunk_bytes) == (64 << 10, 512 << 10)
    assert make_plan("all_reduce", count, 4, topo, "ho_ring", cpu).chunks > 2
    assert make_plan("all_reduce", count, 4, topo, "ho_ring", cuda).chunks <= 2
    assert planner_settings(PlannerConfig(min_chunk_bytes=4096), "cuda", topo).min_chunk_bytes == 4096
    assert planner_for("cpu", settings_meta(cpu)).min_chunk_bytes == 64 << 10
    assert planner_for("cuda").min_chunk_bytes == 512 << 10
    assert planner_for("cpu", {"ring_ops": []}).min_chunk_bytes == 512 << 10  # a run from before it was recorded


def test_auto_choices() -> None:
    big = 16 << 20
    assert make_plan("all_reduce", big, 4, parse_spec("2x4"), "auto").algo == "ho_ring"
    assert make_plan("all_reduce", big, 4, parse_spec("2x4:scattered"), "auto").algo == "ho_ring"
    assert make_plan("all_reduce", big, 4, parse_spec("8"), "auto").algo == "native"
    assert make_plan("all_gather", 16, 4, parse_spec("8"), "auto").algo == "native"
    uneven = make_plan("all_reduce", big, 4, parse_spec("3+5"), "auto")
    assert uneven.algo == "ho_ring" and "auto" in uneven.reason
    uneven_rs = make_plan("reduce_scatter", big, 4, parse_spec("3+5"), "auto")
    assert uneven_rs.algo == "ho_ring" and "auto" in uneven_rs.reason  # padded rails: fewer NIC bytes


def test_link_bound() -> None:
    topo = parse_spec("2x4")
    assert link_bound("all_reduce", 25_000_000, topo) == pytest.approx(1.0)
    assert link_bound("all_gather", 25_000_000, topo) == pytest.approx(0.5)
    assert link_bound("all_reduce", 1, parse_spec("8")) is None


def test_unknown_names() -> None:
    with pytest.raises(ValueError, match="unknown algo"):
        make_plan("all_reduce", 4, 4, parse_spec("2x2"), "tree")
    with pytest.raises(ValueError, match="unknown collective"):
        make_plan("broadcast", 4, 4, parse_spec("2x2"), "auto")
