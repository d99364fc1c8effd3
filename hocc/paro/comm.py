"""Communication of each PaRO strategy per optimizer step, per tier, priced
with hocc's planner (no torch).

Each collective of `Strategy.schedule()` is priced as paro_shard runs it
(hocc/paro/moves.py): one call per stage, each `predict_all` + `choose`
(auto's pick) on the topology of its group (a host, a rail, or the world,
renumbered by `Topology.restrict`). A move between scopes N and G is two
calls, a rail stage and a host stage; an all-reduce over the world is one
world call. All hosts
run their host collectives at once on separate links; all G rails run theirs
at once through the same host NICs, so a rail is priced on its own topology
with the NIC (and trunk, and the emulation's machine) bandwidth divided by G.

Bytes and rounds per rank per tier are the hierarchical ring volumes (what
HO-Ring moves; a flat native ring over the world moves more across hosts):
reduce-scatter / all-gather over n members of c elements each way: (n-1) c
per rank in n-1 rounds; all-reduce of S: 2 (n-1)/n S in 2 (n-1) rounds; a
world collective is an intra-host stage plus a rail stage.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from hocc.paro.memory import scope_elems
from hocc.paro.strategy import Collective, Strategy, parse
from hocc.plan.cost import CostParams
from hocc.plan.planner import PlannerConfig, choose, predict_all
from hocc.plan.policy import device_of, planner_settings
from hocc.plan.volumes import ring_volume
from hocc.topology import Topology

BACKENDS = ("gloo", "nccl")


@dataclass(frozen=True)
class Priced:
    """One collective of the schedule: the planner's count (elements per rank,
    as hocc's calls take it), its pick and predicted seconds, and per-rank
    bytes and rounds on the intra- (host) and inter-group (NIC) tiers."""

    coll: Collective
    count: int
    algo: str
    seconds: float
    intra_bytes: float
    inter_bytes: float
    intra_rounds: int
    inter_rounds: int


@dataclass
class StepComm:
    strategy: str
    accum: int
    items: list[Priced] = field(default_factory=list)

    def _sum(self, when: str, attr: str) -> float:
        return float(sum(getattr(p, attr) for p in self.items if p.coll.when == when))

    def per(self, when: str) -> dict[str, float]:
        """Totals of one micro-step ('micro') or of the once-per-step part ('step')."""
        return {k: self._sum(when, k) for k in ("seconds", "intra_bytes", "inter_bytes", "intra_rounds",
                                               "inter_rounds")} | {"calls": float(sum(
                                                   1 for p in self.items if p.coll.when == when))}

    def total(self, key: str = "seconds") -> float:
        """Per optimizer step: accum micro-steps plus the step's own part."""
        return self.accum * self.per("micro")[key] + self.per("step")[key]


def planner_config(topo: Topology, backend: str) -> PlannerConfig:
    """What hocc's engine plans with on this backend (hocc.plan.policy), with
    the topology file's calibrated costs where it has them."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {list(BACKENDS)}, got {backend!r}")
    params = CostParams.from_dict(topo.cost) if topo.cost else CostParams()
    return planner_settings(PlannerConfig(params=params), device_of(backend), topo)


def _shared(topo: Topology, ways: int, cfg: PlannerConfig) -> tuple[Topology, PlannerConfig]:
    """`topo` with the NIC, trunk and machine bandwidth split `ways` ways."""
    links = topo.links
    for tier in ("nic", "trunk"):
        old = links.tier(tier)
        links = links.with_tier(tier, replace(old, bandwidth=old.bandwidth / ways, burst=old.burst / ways))
    shared = Topology(topo.host_infos(), links)
    shared.cost = topo.cost
    params = cfg.params
    if math.isfinite(params.machine_bandwidth):
        params = replace(params, machine_bandwidth=params.machine_bandwidth / ways)
    return shared, replace(cfg, params=params,
                           max_chunk_bytes=int(links.nic.bandwidth * 0.1) if cfg.max_chunk_bytes else None)


def _count(c: Collective, numel: int, world: int, group: int) -> int:
    """hocc's count for the call: all_reduce its tensor, reduce_scatter its
    output, all_gather its input."""
    return scope_elems(c.dst if c.op == "reduce_scatter" else c.src, numel, world, group)


def comm_per_step(strategy: str | Strategy, numel: int, topo: Topology, accum: int = 1, elem_size: int = 2,
                  backend: str = "gloo", units: int = 1) -> StepComm:
    """Every collective of one optimizer step of `strategy` on `topo` (the
    intra-group is the host), priced; elem_size: bytes of a parameter and a
    gradient element on the wire (2 for bf16). units: how many units the
    model is wrapped as: sharded parameters are gathered for forward and
    again for backward, except the root's, which stay gathered between the
    two, so a micro-step gathers (2 units - 1) / units times the model."""
    if accum < 1:
        raise ValueError(f"accum (micro-steps per optimizer step) must be at least 1, got {accum}")
    s = parse(strategy)
    hosts = topo.host_groups()
    if len({len(h) for h in hosts}) != 1:
        raise ValueError(f"PaRO's I scope needs hosts of equal size; topology {topo.shape()} is not")
    world, group, n_hosts = topo.world_size, len(hosts[0]), len(hosts)
    cfg = planner_config(topo, backend)
    rail_topo, rail_cfg = _shared(topo.restrict(topo.rails()[0]), group, cfg)
    where = {"host": (topo.restrict(hosts[0]), cfg), "rail": (rail_topo, rail_cfg), "world": (topo, cfg)}
    out = StepComm(s.name, accum)
    def priced(op: str, tier: str, n: int) -> tuple[str, float]:
        sub, scfg = where[tier]
        preds = predict_all(op, n, elem_size, sub, scfg)
        pick = choose(preds, scfg, op)
        return pick, preds[pick].seconds

    for c in s.schedule():
        count = _count(c, numel, world, group)
        if c.where == "world" and c.op != "all_reduce":
            # as Moves runs it (hocc/paro/moves.py): a rail stage and a host stage, one call each, in the
            # rail-major layout's order (a gather: rail first; a reduce-scatter: host first)
            stages = [("rail", count), ("host", count * n_hosts)]
            if c.op == "reduce_scatter":
                stages.reverse()
            picks = [(tier, *priced(c.op, tier, n)) for tier, n in stages]
            pick, seconds = "+".join(f"{tier}:{a}" for tier, a, _ in picks), sum(t for *_, t in picks)
        else:
            pick, seconds = priced(c.op, c.where, count)
        if c.where == "host":
            intra, ir = ring_volume(c.op, group, count)
            inter, er = 0.0, 0
        elif c.where == "rail":
            intra, ir = 0.0, 0
            inter, er = ring_volume(c.op, n_hosts, count)
        else:  # hierarchical: host stage on the whole buffer, rail stage on a host's share
            if c.op == "all_reduce":
                intra, ir = ring_volume("reduce_scatter", group, count // group)
                intra, ir = 2 * intra, 2 * ir
                inter, er = ring_volume("all_reduce", n_hosts, count // group)
            else:
                intra, ir = ring_volume(c.op, group, count * n_hosts)
                inter, er = ring_volume(c.op, n_hosts, count)
        k = (2 * units - 1) / units if (c.when, c.state) == ("micro", "params") else 1.0
        out.items.append(Priced(c, count, pick, k * seconds, k * intra * elem_size, k * inter * elem_size,
                                round(k * ir), round(k * er)))
    return out
