"""HO-Ring on unequal hierarchies (hocc/plan/ho_ring/all_reduce.py's intervals,
and rails.py's padded rails for reduce_scatter / all_gather), proved by the
symbolic simulator: random host sizes 1-9 over 2-6 hosts, one or several
switches of unequal host counts, random sub-groups, counts from 0 to primes;
each host's NIC bytes against docs/algorithms.md's 2(N-1)/N * S (all_reduce) and
against the least any plan can, (W - G_min)/W * S (the others); the
several-groups rule of types.py and its one-group-per-rank rewrite; the
planner's use of it."""

from __future__ import annotations

import dataclasses
import random

import pytest

from hocc.plan import Plan, PlanError, PlannerConfig, make_plan, simulate
from hocc.plan.cost import CostParams, step_load
from hocc.plan.ho_ring import build_ho_ring
from hocc.plan.ho_ring.all_reduce import overlay
from hocc.plan.planner import choose, predict_all
from hocc.plan.policy import planner_settings
from hocc.plan.simulate import nic_traffic
from hocc.plan.types import PAD_BLOCK, GroupSlice, Step
from hocc.topology import HostInfo, Topology, parse_spec

CPU = PlannerConfig(min_chunk_bytes=8, ring_ops=("reduce_scatter", "all_gather"), host_impl="shm")
COUNTS = (0, 1, 2, 3, 5, 7, 13, 31, 101, 257)


def unequal_topology(rng: random.Random) -> Topology:
    """2-6 hosts of 1-9 ranks, numbered in a random order, on 1-3 switches
    holding unequal numbers of hosts; sometimes a random sub-group of it."""
    sizes = [rng.randint(1, 9) for _ in range(rng.randint(2, 6))]
    ranks = list(range(sum(sizes)))
    rng.shuffle(ranks)
    switches = rng.randint(1, min(3, len(sizes)))
    cuts = sorted(rng.sample(range(1, len(sizes)), switches - 1))
    hosts, start = [], 0
    for i, n in enumerate(sizes):
        sw = sum(1 for c in cuts if i >= c)
        hosts.append(HostInfo(f"h{i}", f"s{sw}", tuple(ranks[start:start + n])))
        start += n
    topo = Topology(hosts)
    if rng.random() < 0.3:
        topo = topo.restrict(rng.sample(range(topo.world_size), rng.randint(2, topo.world_size)))
    return topo


def host_maps(topo: Topology) -> tuple[dict[int, str], dict[str, str]]:
    infos = topo.host_infos()
    return {r: h.name for h in infos for r in h.ranks}, {h.name: h.switch for h in infos}


@pytest.mark.parametrize("seed", range(200))
def test_random_unequal_hierarchies(seed: int) -> None:
    rng = random.Random(seed)
    topo = unequal_topology(rng)
    count = rng.choice(COUNTS)
    plan = build_ho_ring("all_reduce", topo, count, rng.choice([1, 2, 3]), CPU.ring_ops, rng.choice(["", "shm"]))
    assert plan is not None, topo.shape()
    simulate(plan, seed)
    simulate(Plan.from_json(plan.to_json()), seed + 2)
    for coll in ("reduce_scatter", "all_gather", "all_reduce"):
        for algo in ("auto", "ho_ring"):
            simulate(make_plan(coll, count, 4, topo, algo, CPU), seed)


@pytest.mark.parametrize("seed", range(60))
def test_nic_bytes_per_host_match_the_design(seed: int) -> None:
    """docs/algorithms.md's byte counts, whatever the sizes: with one switch every host
    sends 2(N-1)/N of the (padded) buffer S across its NIC; over M switches a
    host among k under its switch sends 2(k-1)/k * S inside the switch and
    2(M-1)/M * S/k across, so every trunk carries 2(M-1)/M * S."""
    rng = random.Random(1000 + seed)
    topo = unequal_topology(rng)
    plan = build_ho_ring("all_reduce", topo, 10_007, rng.choice([1, 4]))
    assert plan is not None
    host_of, switch_of = host_maps(topo)
    nic, trunk = nic_traffic(plan, host_of, switch_of)
    size = plan.layout.size
    m = len({switch_of[h] for h in host_of.values()})
    under = {s: sum(1 for h in set(host_of.values()) if switch_of[h] == s) for s in set(switch_of.values())}
    slack = 2 * sum(len(s.groups) for s in plan.steps)  # ring splits of segments that do not divide
    for h, sent in nic.items():
        k = under[switch_of[h]] if m > 1 else len(nic)
        want = 2 * (k - 1) / k * size if m == 1 else 2 * (k - 1) / k * size + 2 * (m - 1) / m * size / k
        assert abs(sent - want) <= slack, (h, sent, want, topo.shape())
    for s, sent in trunk.items():
        assert abs(sent - 2 * (m - 1) / m * size) <= slack, (s, sent, size)


def test_known_placements() -> None:
    for spec, intervals in (("3+5", 7), ("1+7", 7), ("2+3+3", 4), ("4+4+3", 6), ("8+8+8+7", 14)):
        plan = build_ho_ring("all_reduce", parse_spec(spec), 5003, 4, host_impl="shm")
        assert plan is not None
        simulate(plan)
        rail = next(s for s in plan.steps if s.collective == "all_reduce")
        assert len(rail.groups) == intervals  # sum(G_h) - N + 1 when no cuts coincide, fewer when they do
        assert all(len(g.ranks) == len(spec.split("+")) for g in rail.groups)  # every ring spans every host
        assert {s.impl for s in plan.steps if s.tier == "host"} == {"shm"}
        host_of, _ = host_maps(parse_spec(spec))
        nic, _ = nic_traffic(plan, host_of)
        n = len(spec.split("+"))
        slack = 2 * sum(len(s.groups) for s in plan.steps)  # ring splits of segments that do not divide
        for sent in nic.values():
            assert abs(sent - 2 * (n - 1) / n * plan.layout.size) <= slack


def test_three_levels_with_unequal_switches() -> None:
    hosts = [HostInfo("a", "s0", (0, 1, 2)), HostInfo("b", "s0", (3, 4)), HostInfo("c", "s1", (5, 6, 7, 8))]
    topo = Topology(hosts)
    plan = build_ho_ring("all_reduce", topo, 999, 2)
    assert plan is not None
    assert [s.tier for s in plan.steps if s.chunk == 0] == ["host", "nic", "trunk", "nic", "host"]
    simulate(plan)
    _, trunk = nic_traffic(plan, *host_maps(topo))
    for sent in trunk.values():
        assert sent == pytest.approx(plan.layout.size, rel=1e-3)  # 2(M-1)/M * S with M = 2 switches


def test_overlay() -> None:
    from fractions import Fraction as F
    a = [(F(0), F(1, 2), 0), (F(1, 2), F(1), 1)]
    b = [(F(0), F(1, 3), 2), (F(1, 3), F(2, 3), 3), (F(2, 3), F(1), 4)]
    assert overlay([a, b]) == [(F(0), F(1, 3), (0, 2)), (F(1, 3), F(1, 2), (0, 3)),
                               (F(1, 2), F(2, 3), (1, 3)), (F(2, 3), F(1), (1, 4))]


def _rail(plan: Plan) -> int:
    return next(i for i, s in enumerate(plan.steps) if len(s.groups) > 2)


def test_simulator_rules_for_several_groups() -> None:
    plan = build_ho_ring("all_reduce", parse_spec("3+5"), 150, 1)
    assert plan is not None
    i = _rail(plan)
    rail = plan.steps[i]
    g0, g1 = rail.groups[0], rail.groups[1]
    overlapping = dataclasses.replace(g1, ranks=g0.ranks, offset=g0.offset)
    for bad in (dataclasses.replace(rail, groups=(g0, overlapping, *rail.groups[2:])),
                dataclasses.replace(rail, groups=rail.groups[1:]),
                dataclasses.replace(plan.steps[0], impl="shm", groups=(*plan.steps[0].groups, g0))):
        steps = list(plan.steps)
        steps[i if bad.collective == "all_reduce" else 0] = bad
        with pytest.raises(PlanError):
            simulate(dataclasses.replace(plan, steps=steps))


def test_planner_uses_it() -> None:
    big = 16 << 20
    topo = parse_spec("3+5@nic=200mbit")
    plan = make_plan("all_reduce", big, 4, topo, "ho_ring", CPU)
    assert plan.algo == "ho_ring" and plan.meta["hosts"] == [3, 5], plan.summary()
    assert make_plan("all_reduce", big, 4, topo, "auto", CPU).algo == "ho_ring"
    for coll in ("reduce_scatter", "all_gather"):
        p = make_plan(coll, big // 8, 4, topo, "ho_ring", CPU)
        assert p.algo == "ho_ring" and p.meta["padded"], p.summary()
        assert make_plan(coll, big // 8, 4, topo, "auto", CPU).algo == "ho_ring"
    # one element, over UCX between hosts (bench/results/small/2x4-200mbit, 32 B): the flat ring (every hop a
    # message) is slowest; HO-Ring's host stages in shared memory beat native's hops for all_gather and
    # reduce_scatter (578 against 1127 us); native's all_reduce of a few bytes is one whole exchange, level
    # with HO-Ring there (1289 against 1260 us), and auto takes whichever the model prices lower; leaders (one
    # rank per host on the network) runs all_reduce on hosts of any size, the others need hosts of one size
    for coll in ("all_gather", "reduce_scatter", "all_reduce"):
        preds = predict_all(coll, 1, 4, topo, CPU)
        assert ("leaders" in preds) == (coll == "all_reduce"), preds
        best = min((a for a in ("native", "ho_ring", "leaders") if a in preds), key=lambda a: preds[a].seconds)
        assert make_plan(coll, 1, 4, topo, "auto", CPU).algo == best
        assert preds["ring"].seconds > max(preds["native"].seconds, preds["ho_ring"].seconds), preds
        if coll != "all_reduce":
            assert best == "ho_ring", preds


def test_auto_keeps_the_ring_where_the_backend_op_loses_to_it() -> None:
    """Where the engine runs an op's steps as rings (cfg.ring_ops: gloo's own
    reduce-scatter is about half a ring's speed) auto's default is the ring, not
    native, unless the cost model prices native for that op."""
    topo = parse_spec("3+5@nic=200mbit")
    count = (64 << 20) // 4 // 8
    topo = parse_spec("1+7@nic=200mbit")  # where the padded rails move what the ring does, plus a host stage
    assert make_plan("reduce_scatter", count, 4, topo, "auto", CPU).algo == "ring"
    assert make_plan("reduce_scatter", count, 4, topo, "auto", PlannerConfig()).algo == "native"
    fast = dataclasses.replace(CPU, params=CPU.params.with_factors({"native:reduce_scatter": 0.5}))
    assert make_plan("reduce_scatter", count, 4, topo, "auto", fast).algo == "native"


RSAG = ("reduce_scatter", "all_gather")


@pytest.mark.parametrize("seed", range(200))
def test_random_unequal_reduce_scatter_and_all_gather(seed: int) -> None:
    """Padded rails: correct on any placement, each host's NIC carries G_max(N-1)
    blocks, never less than the least possible (W - G_min) blocks, and exactly
    that where every host but the smallest is full."""
    rng = random.Random(5000 + seed)
    topo = unequal_topology(rng)
    count, chunks = rng.choice(COUNTS), rng.choice([1, 2, 3])
    sizes = sorted(len(h) for h in topo.host_groups())
    for coll in RSAG:
        host_impl = rng.choice(["", "shm"])
        plan = build_ho_ring(coll, topo, count, chunks, CPU.ring_ops, host_impl)
        assert plan is not None, topo.shape()
        if len(set(sizes)) > 1:  # unequal hosts: every host padded to the widest one's slots
            assert PAD_BLOCK in plan.layout.order, plan.describe()
        elif len(topo.switch_groups()) == 1:  # equal hosts on one switch: the grid, nothing padded
            assert PAD_BLOCK not in plan.layout.order, plan.describe()
        simulate(plan, seed)
        simulate(Plan.from_json(plan.to_json()), seed + 2)
        rails = [s for s in plan.steps if s.tier != "host"]
        if plan.meta["fans"][2] == 1:  # one switch, or rails over every host: every rail spans every host
            assert all(len(g.ranks) == len(sizes) for s in rails for g in s.groups)
        assert {s.impl for s in plan.steps if s.tier == "host"} <= ({"shm"} if host_impl else {"ring"})
        nic, trunk = nic_traffic(plan, *host_maps(topo))
        blocks = plan.layout.piece * plan.chunks  # a block, padded to whole pieces
        assert max(nic.values()) >= (sum(sizes) - sizes[0]) * blocks
        if len(topo.switch_groups()) > 1:  # flat rails or a switch stage, whichever loads its busiest link less
            flat = sizes[-1] * (len(sizes) - 1) * blocks
            assert max(trunk.values()) <= flat or max(nic.values()) <= flat
            continue
        for sent in nic.values():
            assert sent == sizes[-1] * (len(sizes) - 1) * blocks, (sent, topo.shape(), plan.describe())
        if len(set(sizes[1:])) == 1:
            assert max(nic.values()) == (sum(sizes) - sizes[0]) * blocks


@pytest.mark.parametrize("spec", ["3+5", "1+7", "2+3+3", "4+4+3", "8+8+8+7", "4+5", "1+2+9"])
def test_padded_rails_on_known_placements(spec: str) -> None:
    topo = parse_spec(spec)
    sizes = [len(h) for h in topo.host_groups()]
    for coll in RSAG:
        plan = build_ho_ring(coll, topo, 1000, 4, CPU.ring_ops, "shm")
        assert plan is not None
        simulate(plan)
        assert plan.meta["rails"] == max(sizes)
        assert {s.impl for s in plan.steps if s.tier == "host"} == {"shm"}
        # a host of g ranks beside one of g_max either splits the rows once or in two passes
        assert plan.stages == 1 + max(plan.meta["host_passes"])
        pads = plan.layout.order.count(PAD_BLOCK)
        assert pads == len(plan.layout.order) - sum(sizes) and pads > 0
        nic, _ = nic_traffic(plan, *host_maps(topo))
        assert set(nic.values()) == {max(sizes) * (len(sizes) - 1) * 1000}


@pytest.mark.parametrize("sizes,trunk_blocks", [
    ([[8, 8], [8, 7]], 16),  # 31 ranks less the larger switch's 15: the least the trunks allow
    ([[3, 2], [3]], 5),      # the 3-rank switch must send the other 5 blocks
])
def test_padded_switch_stage_on_three_levels(sizes: list[list[int]], trunk_blocks: int) -> None:
    """Several switches: pad hosts make the switches alike, and the trunk rails
    carry the least the trunks can (here below the flat rails' G_max(N-1))."""
    topo = _switched(sizes)
    for coll in RSAG:
        plan = build_ho_ring(coll, topo, 100, 2, CPU.ring_ops, "shm")
        assert plan is not None and "nic" in plan.meta["tiers"] and "trunk" in plan.meta["tiers"], plan.describe()
        simulate(plan)
        _, trunk = nic_traffic(plan, *host_maps(topo))
        assert set(trunk.values()) == {trunk_blocks * 100}, trunk
        flat = max(n for s in sizes for n in s) * (len(topo.host_groups()) - 1)
        assert trunk_blocks < flat


def test_simulator_catches_a_misplaced_pad() -> None:
    plan = build_ho_ring("reduce_scatter", parse_spec("3+5"), 10, 1)
    assert plan is not None
    simulate(plan)
    # rows of (host A slot, host B slot); A's ranks 0, 1, 2 own rows 0-1, 2-3, 4-5 (row 5 dead)
    order = list(plan.layout.order)
    assert order == [0, 3, PAD_BLOCK, 4, 1, 5, PAD_BLOCK, 6, 2, 7, PAD_BLOCK, PAD_BLOCK]
    swapped = list(order)
    swapped[0], swapped[6] = PAD_BLOCK, 0  # rank 0's block on a rail rank 1 serves
    for bad in (order[:2] + order[3:] + [PAD_BLOCK],  # every block after the pad moved off its rail
                [PAD_BLOCK if b == 0 else b for b in order],  # a rank without a block
                swapped):
        with pytest.raises(PlanError):
            simulate(dataclasses.replace(plan, layout=dataclasses.replace(plan.layout, order=tuple(bad))))


def test_cost_charges_each_round_of_rails() -> None:
    """A rank in two rings of one step runs them one after the other: two
    rounds of latency, not one (hocc.plan.cost._chain)."""
    topo = parse_spec("2+4@nic=200mbit")
    one = Step(0, 0, "reduce_scatter", "ring", "nic", (GroupSlice((0, 2), 0, 0),))
    two = Step(0, 0, "reduce_scatter", "ring", "nic", (GroupSlice((0, 2), 0, 0), GroupSlice((0, 3), 2, 0)))
    apart = Step(0, 0, "reduce_scatter", "ring", "nic", (GroupSlice((0, 2), 0, 0), GroupSlice((1, 3), 2, 0)))
    quiet = CostParams(host_message=0.0)  # the latency chain alone
    lat = [step_load(s, 4, topo, params=quiet)[1] for s in (one, two, apart)]
    assert lat[0] > 0 and lat[1] == pytest.approx(2 * lat[0]) and lat[2] == pytest.approx(lat[0])
    # a host's messages add up (CostParams.host_message): two of host A's ranks on the network cost it twice one's
    msg = CostParams(host_message=1e-3)
    busy = [step_load(s, 4, topo, params=msg)[1] - step_load(s, 4, topo, params=quiet)[1] for s in (one, apart)]
    assert busy[0] == pytest.approx(2e-3) and busy[1] == pytest.approx(4e-3)


def _switched(sizes: list[list[int]]) -> Topology:
    hosts, r = [], 0
    for s, switch in enumerate(sizes):
        for h, n in enumerate(switch):
            hosts.append(HostInfo(f"s{s}h{h}", f"s{s}", tuple(range(r, r + n))))
            r += n
    return Topology(hosts)


@pytest.mark.parametrize("spec", ["3+5", "4+4+3", "1+7", "2+3+3", "8+8+8+7", "2+5+8", "1+2+9", "3+2|3", "8+8|8+7",
                                  "4+4|4+3|4"])
def test_auto_is_no_worse_than_the_ring_fallback(spec: str) -> None:
    """By the planner's own predictions, at every size from 1 KiB to 64 MiB
    ('|' separates switches: 200 Mbit/s NICs, 100 Mbit/s trunks): auto's pick
    is the fastest, or its baseline (the ring, for these ops) where the fastest
    gains less than the margin; so never slower than the fastest by more than
    that, and never slower than the ring."""
    if "|" in spec:
        topo = _switched([[int(n) for n in s.split("+")] for s in spec.split("|")])
    else:
        topo = parse_spec(spec + "@nic=200mbit")
    cfg = planner_settings(PlannerConfig(), "cpu", topo)
    for coll in RSAG:
        for nbytes in (1 << 10, 1 << 16, 1 << 20, 1 << 24, 1 << 26):
            count = nbytes // 4 // topo.world_size
            preds = predict_all(coll, count, 4, topo, cfg)
            assert "ho_ring" in preds
            pick = choose(preds, cfg, coll)
            fastest = min(p.seconds for p in preds.values())
            assert preds[pick].seconds <= fastest / (1 - cfg.native_margin), (spec, coll, nbytes, preds)
            assert preds[pick].seconds <= preds["ring"].seconds, (spec, coll, nbytes, preds)
