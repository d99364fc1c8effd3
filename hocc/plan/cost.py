"""Alpha-beta cost model with link sharing, read off plan data.

Every group of a step is modelled as a ring over its members in the listed
order (what gloo runs for native steps, and what hocc's ring steps are; the
whole group's native collective under NCCL is priced by hocc.plan.nccl_native,
as NCCL runs it). Each ring edge loads the links it crosses: inside a host,
the host's one shared link (loopback, PCIe: fabric 'shared') or, through an
NVSwitch, the sender's own out-link and the receiver's in-link; between hosts
the NIC of the sending rank and the NIC of the receiving rank (a host has one
NIC on the CPU testbed, one per GPU on rail-optimized machines: eight rails
on eight NICs then run in parallel, eight rails on one NIC share it), and
across switches the trunk out of and into the switches. All flows of concurrent steps share those links: a link carrying
`B` bytes at bandwidth `b` is busy `B / b`, whoever the flows are. The
executor runs a plan as a wavefront (tick t runs stage s of chunk t-s), so a
tick costs its busiest link or its longest latency chain, whichever is larger,
plus one launch.

A step's bytes are multiplied by its class factor (`CostParams.op_factors`,
keyed 'impl:op', e.g. 'native:reduce_scatter'): how much slower than a plain
ring the backend's own implementation of that op moves data (gloo's CPU
reduce-scatter is about 2x). `hocc calibrate` fits them with the tiers.

Under NCCL (`CostParams.native` 'nccl') each group of a native step is one
NCCL call on a sub-communicator, and pays what hocc.plan.nccl_native charges
NCCL's own call on that communicator (its pick of algorithm and protocol, the
transport's hop latency, the simple protocol's handshakes, its pipeline fill
for that call's bytes), so HO-Ring and NCCL are priced by the same rules. The
call's time, as if alone, takes the place of the ring's latency chain: a tick
lasts at least its busiest link and at least its slowest call. Assumed: calls
of one tick run on different communicators (streams) and overlap fully, so a
call's fill may hide under another call's traffic but never under its own; a
chunk's stage is a call of its own, so every chunk pays its own fill (NCCL
drains one call's pipeline before the next on a communicator starts).

A native step of the whole group small enough for the CPU transport's tiny
path (`tiny_bytes`) pays 2 ceil(log2 n) hops (a tree of frames) instead of its
ring's chain; a sub-group's native all_reduce or all_gather of a few KiB
(`net_tiny_bytes`: UCX carries sub-groups between hosts) is one Bruck
all-gather, ceil(log2 n) hops.

Speed: a plan is compiled once into per-tick link loads (`PlanCost`), identical
steps and ticks once (all chunks of an HO-Ring plan load the same links);
evaluating it under other parameters is a few numpy operations (the fit).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from hocc.plan.memo import memo
from hocc.plan.nccl_native import Summary, call_seconds
from hocc.plan.types import Plan, Step
from hocc.plan.volumes import ring_volume
from hocc.topology import TIERS, Topology
from hocc.topology.links import LinkModel

TIER_RANK = {t: i for i, t in enumerate(TIERS)}
# the shared-memory all_reduce that takes one barrier, not two (ShmComm::kWholeReduceBytes; hocc._C exports it)
SHM_WHOLE_REDUCE_BYTES = 2048
# a sub-group's all_reduce or all_gather whose gathered inputs fit this runs Bruck's all-gather over UCX
# (csrc/transport/ucx.h kTinyGather): its hops (CostParams.net_tiny_bytes) and its bytes per link (_sent_as)
NET_TINY_BYTES = 16 << 10
LINK_KINDS = (*TIERS, "shm", "machine")
MACHINE = ("machine", "all")


@dataclass(frozen=True)
class CostParams:
    """Software costs that are not links: per-step launch, per Python ring
    hop, local copies (packing the work buffer), the shared-memory host
    transport (memory bandwidth a host's ranks share, seconds per barrier), and
    per-class byte factors ('impl:op' -> factor, absent = 1), and
    machine_bandwidth: when every host of the job runs on one machine (the
    emulated cluster), the bytes that cross any host NIC (veth, tc, bridge)
    are all forwarded by its CPUs at this total rate (inf: real hosts). Defaults are the
    CPU testbed's (8 ranks on 2 cores); `hocc calibrate` fits them.

    GPU clusters (hocc.plan.nccl_defaults): host_efficiency / nic_efficiency
    are the share of a host-tier / NIC (and trunk) link's stated rate that
    traffic gets (protocol overhead); native 'nccl' prices the whole group's
    native collective as NCCL runs it (rings over all channels and NICs,
    trees, NVLS: hocc.plan.nccl_native) instead of one ring in rank order
    ('ring', gloo); nvls_efficiency is NVLink SHARP's all-reduce algorithm
    bandwidth over the host-tier rate; pipeline_window is the bytes NCCL's
    simple protocol keeps in flight per pipeline stage (its fill time,
    hocc.plan.nccl_native.pipeline_fill; 0: no fill).

    host_message: a host's seconds per message its ranks send or receive
    across hosts in one step, added to the step's latency for its busiest
    host: where a host's ranks outnumber its cores, each message's trip
    through the kernel takes CPU time the host's other ranks wait for (the
    CPU testbed: 4 ranks to a core). Where every rank has a core (or a NIC's
    proxy thread: NCCL_PARAMS sets 0), a host's messages go out side by side.

    The small-call terms (launch, shm_barrier, host_message) are fitted to
    hocc-bench on the emulated 2x4 and 4x2 (200 Mbit/s, 32 B-32 KiB, host_rails,
    ho_ring and leaders: bench/results/leaders): 10, 10 and 15 us. The earlier
    launch of 0.2 ms and barrier of 0.18 ms were fitted when a step went
    through gloo's threads, and priced hocc's small calls at 3-5x their time."""

    launch: float = 10e-6
    ring_step: float = 0.5e-6
    copy_bandwidth: float = 20e9
    shm_bandwidth: float = 16e9
    shm_barrier: float = 10e-6
    op_factors: tuple[tuple[str, float], ...] = ()
    machine_bandwidth: float = math.inf
    host_efficiency: float = 1.0
    nic_efficiency: float = 1.0
    native: str = "ring"
    nvls_efficiency: float = 0.61
    pipeline_window: float = 0.0
    tiny_bytes: float = 448  # a native step whose members' inputs fit this runs as a tree of frames (c10d.cc)
    net_tiny_bytes: float = NET_TINY_BYTES  # a sub-group's all_reduce/all_gather this small: Bruck's
    host_message: float = 15e-6

    def factor(self, cls: str) -> float:
        for k, v in self.op_factors:
            if k == cls:
                return v
        return 1.0

    def with_factors(self, factors: dict[str, float]) -> CostParams:
        merged = dict(self.op_factors)
        merged.update(factors)
        return replace(self, op_factors=tuple(sorted(merged.items())))

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"launch": self.launch, "ring_step": self.ring_step,
                             "copy_bandwidth": self.copy_bandwidth, "shm_bandwidth": self.shm_bandwidth,
                             "shm_barrier": self.shm_barrier, "op_factors": dict(self.op_factors)}
        if math.isfinite(self.machine_bandwidth):
            d["machine_bandwidth"] = self.machine_bandwidth
        base = CostParams()
        if self.host_message != base.host_message:
            d["host_message"] = self.host_message
        for k in _GPU_KEYS:  # only where set: CPU testbed files stay as they were
            if getattr(self, k) != getattr(base, k):
                d[k] = getattr(self, k)
        return d

    @staticmethod
    def from_dict(d: dict[str, Any]) -> CostParams:
        """Reads a topology file's 'cost' section; missing keys keep their defaults."""
        known = {"launch", "ring_step", "copy_bandwidth", "shm_bandwidth", "shm_barrier", "op_factors",
                 "machine_bandwidth", "host_message", *_GPU_KEYS}
        bad = sorted(set(d) - known)
        if bad:
            raise ValueError(f"unknown cost setting(s) {bad}; expected some of {sorted(known)}")
        native = str(d.get("native", "ring"))
        if native not in NATIVE_MODELS:
            raise ValueError(f"cost 'native' must be one of {NATIVE_MODELS}, got {native!r}")
        base = CostParams()
        vals = {k: float(d[k]) for k in known - {"op_factors", "native"} if k in d}
        params = replace(base, native=native, **vals)  # type: ignore[arg-type]
        factors = d.get("op_factors") or {}
        if not isinstance(factors, dict):
            raise ValueError("cost 'op_factors' must map 'impl:op' (e.g. 'native:reduce_scatter') to a number")
        return params.with_factors({str(k): float(v) for k, v in factors.items()})


_GPU_KEYS = ("host_efficiency", "nic_efficiency", "native", "nvls_efficiency", "pipeline_window")
NATIVE_MODELS = ("ring", "nccl")

Load = dict[tuple[str, str], float]


class _Places:
    """Per rank: its host, switch, the name of the NIC it sends through (the
    host's name when the host has one NIC) and, through an NVSwitch, the name
    of its own host-tier link (None on a shared fabric)."""

    def __init__(self, topo: Topology) -> None:
        self.host: dict[int, str] = {}
        self.switch: dict[int, str] = {}
        self.nic: dict[int, str] = {}
        self.own: dict[int, str | None] = {}
        self.host_nics: dict[str, int] = {}
        for info in topo.host_infos():
            self.host_nics[info.name] = info.nics
            for r, k in zip(info.ranks, info.nic_map(), strict=True):
                self.host[r], self.switch[r] = info.name, info.switch
                self.nic[r] = info.name if info.nics == 1 else f"{info.name}/nic{k}"
                self.own[r] = f"{info.name}/rank{r}" if info.fabric == "nvswitch" else None


def places_of(topo: Topology) -> _Places:
    """Where each rank sits, computed once per topology object."""
    return memo(topo, "places", lambda: _Places(topo))


def _edge_links(a: int, b: int, places: _Places) -> tuple[str, list[tuple[str, str]]]:
    ha, hb = places.host[a], places.host[b]
    if ha == hb:
        oa, ob = places.own[a], places.own[b]
        if oa is None or ob is None:
            return "host", [("host", ha)]
        return "host", [("host_out", oa), ("host_in", ob)]
    links = [("nic_out", places.nic[a]), ("nic_in", places.nic[b])]
    sa, sb = places.switch[a], places.switch[b]
    if sa != sb:
        return "trunk", [*links, ("trunk_out", sa), ("trunk_in", sb)]
    return "nic", links


@dataclass(frozen=True)
class _Shape:
    """A step's structure, independent of link parameters: bytes per link per
    element of segment, and its latency chain (hops, tiers crossed)."""

    cls: str
    unit: dict[tuple[str, str], float]
    hops: int
    tiers: frozenset[str]
    ring: bool
    shm: bool
    calls: tuple[tuple[tuple[Summary, float], ...], ...] = ()  # native steps: _calls
    crowded: frozenset[tuple[str, str]] = frozenset()  # links more than one of its groups load
    messages: int = 0  # messages across hosts its busiest host's ranks send and receive (CostParams.host_message)
    whole: bool = False  # one group of every rank (a native step then runs the group's own backend: gloo)
    widest: int = 0  # its largest group, where all its groups have one segment (0: unequal segments)
    # a sub-group's native all_reduce or all_gather on its tiny path (_tiny_hops): Bruck's bytes per link, per
    # element of segment (None: no tiny path); _sent_as picks them where the step's bytes fit
    bruck: dict[tuple[str, str], float] | None = None

    @property
    def values(self) -> np.ndarray:
        vals = self.__dict__.get("_values")
        if vals is None:
            vals = np.fromiter(self.unit.values(), dtype=float, count=len(self.unit))
            object.__setattr__(self, "_values", vals)
        return vals


def _chain(groups: list[tuple[tuple[int, ...], int]]) -> int:
    """Ring hops on the longest chain of a step: a rank in several groups runs
    them one after another (types.py), so its hops add up; the step ends with
    its slowest rank."""
    per: dict[int, int] = {}
    for ranks, h in groups:
        for r in ranks:
            per[r] = per.get(r, 0) + h
    return max(per.values(), default=0)


def _communicator(ranks: tuple[int, ...], places: _Places) -> Summary:
    """NCCL's view of a sub-group's communicator (hocc.plan.nccl_native.Summary)."""
    on: dict[str, list[int]] = {}
    for r in ranks:
        on.setdefault(places.host[r], []).append(r)
    nics = {h: len({places.nic[r] for r in rs}) for h, rs in on.items()}
    share = min(nics[h] / places.host_nics[h] for h in on) if len(on) > 1 else 1.0
    return Summary(len(ranks), len(on), max(len(rs) for rs in on.values()), min(nics.values()),
                   len({places.switch[r] for r in ranks}), all(places.own[r] is not None for r in ranks), share)


def _calls(groups: list[tuple[tuple[int, ...], float]],
           places: _Places) -> tuple[tuple[tuple[Summary, float], ...], ...]:
    """The distinct sequences of NCCL calls a rank makes in a native step, in
    order (a rank in several groups runs them one after another): per call its
    communicator and its segment as a multiple of the step's."""
    per: dict[int, list[tuple[Summary, float]]] = {}
    for ranks, mult in groups:
        if len(ranks) > 1:
            call = (_communicator(ranks, places), mult)
            for r in ranks:
                per.setdefault(r, []).append(call)
    return tuple(dict.fromkeys(tuple(seq) for seq in per.values()))


def _shape(op: str, impl: str, groups: tuple[tuple[int, ...], ...], places: _Places) -> _Shape:
    unit: dict[tuple[str, str], float] = {}
    tiers = set()
    chain: list[tuple[tuple[int, ...], int]] = []
    shm = impl == "shm"
    users: Counter[tuple[str, str]] = Counter()
    messages: Counter[str] = Counter()  # per host: messages across hosts its ranks send and receive
    for ranks in groups:
        n = len(ranks)
        if n < 2:
            continue
        if shm:  # memory traffic per member, in segments (csrc/transport/shm.h's copies and reductions)
            per_member = {"all_gather": 2 * n, "reduce_scatter": 3 * n - 1, "broadcast": 2}.get(op, 5 + 1 / n)
            key = ("shm", places.host[ranks[0]])
            unit[key] = unit.get(key, 0.0) + n * per_member
            continue
        sent, h = ring_volume(op, n, 1)  # per member, per element of segment; and its hops
        chain.append((ranks, h))
        mine = set()
        for i, a in enumerate(ranks):
            b = ranks[(i + 1) % n]
            tier, links = _edge_links(a, b, places)
            tiers.add(tier)
            if places.host[a] != places.host[b]:
                messages[places.host[a]] += h
                messages[places.host[b]] += h
            mine.update(links)
            for link in links:
                unit[link] = unit.get(link, 0.0) + sent
        users.update(mine)
    calls = _calls([(g, 1.0) for g in groups], places) if impl == "native" else ()
    bruck = _bruck_unit(groups, places) if impl == "native" and op in ("all_reduce", "all_gather") else None
    crowded = frozenset(k for k, c in users.items() if c > 1)
    whole = len(groups) == 1 and len(groups[0]) == len(places.host)
    return _Shape(f"{impl}:{op}", unit, _chain(chain), frozenset(tiers), impl == "ring", shm, calls, crowded,
                  max(messages.values(), default=0), whole, max(map(len, groups), default=0), bruck)


def _bruck_unit(groups: tuple[tuple[int, ...], ...], places: _Places) -> dict[tuple[str, str], float]:
    """Bruck's all-gather (csrc/transport/ring.h) per link, in blocks of the step's segment: at distance d
    member i sends min(d, n-d) blocks to member i+d. The ring's bytes in all, but not on the ring's edges:
    across switches (2+2 hosts) 5 blocks leave a switch where the ring's 3 do. A tiny all_reduce gathers
    whole buffers (blocks of its segment) and reduces them where they land."""
    unit: dict[tuple[str, str], float] = {}
    for ranks in groups:
        n, d = len(ranks), 1
        while d < n:
            for i, a in enumerate(ranks):
                for link in _edge_links(a, ranks[(i + d) % n], places)[1]:
                    unit[link] = unit.get(link, 0.0) + min(d, n - d)
            d *= 2
    return unit


def _sent_as(shape: _Shape, seg_bytes: float, cache: dict[Any, _Shape]) -> _Shape:
    """The shape whose bytes a step of seg_bytes puts on its links: Bruck's where its tiny path runs (the
    UCX sub-group's, _on_bruck, as _tiny_hops prices its hops), else its own."""
    if shape.bruck is None or not _on_bruck(shape, seg_bytes, NET_TINY_BYTES):
        return shape
    key = ("bruck", id(shape))
    if key not in cache:
        crowded = frozenset(k for k in shape.bruck if k in shape.crowded)
        cache[key] = replace(shape, unit=shape.bruck, crowded=crowded, bruck=None)
    return cache[key]


def _step_shape(step: Step, places: _Places, cache: dict[Any, _Shape]) -> tuple[_Shape, float]:
    """The step's shape (cached by structure) and the segment it scales by."""
    segs = {g.seg for g in step.groups}
    if len(segs) == 1:
        key: Any = (step.collective, step.impl, tuple(g.ranks for g in step.groups))
        if key not in cache:
            cache[key] = _shape(step.collective, step.impl, key[2], places)
        return cache[key], float(segs.pop())
    # unequal segments: fold each group's segment into its own shape
    unit: dict[tuple[str, str], float] = {}
    parts = [_shape(step.collective, step.impl, (g.ranks,), places) for g in step.groups]
    for g, p in zip(step.groups, parts, strict=True):
        for k, v in p.unit.items():
            unit[k] = unit.get(k, 0.0) + v * g.seg
    tiers = frozenset().union(*(p.tiers for p in parts)) if parts else frozenset()
    hops = _chain([(g.ranks, p.hops) for g, p in zip(step.groups, parts, strict=True)])
    calls = _calls([(g.ranks, float(g.seg)) for g in step.groups], places) if step.impl == "native" else ()
    crowded = frozenset(k for k, c in Counter(k for p in parts for k in p.unit).items() if c > 1)
    return _Shape(f"{step.impl}:{step.collective}", unit, hops, tiers, step.impl == "ring", step.impl == "shm",
                  calls, crowded, sum(p.messages for p in parts)), 1.0


def _shape_cache(topo: Topology) -> dict[Any, _Shape]:
    shapes: dict[Any, _Shape] = memo(topo, "shapes", dict)
    return shapes


def step_load(step: Step, elem_size: int, topo: Topology, places: _Places | None = None,
              params: CostParams | None = None) -> tuple[Load, float]:
    """Bytes per link (times the step's class factor), and the latency chain
    (seconds; under NCCL its slowest call's time, `_step_latency`), of one step on its own."""
    params = params or CostParams()
    cache = _shape_cache(topo)
    shape, seg = _step_shape(step, places or places_of(topo), cache)
    shape = _sent_as(shape, seg * elem_size, cache)
    f = params.factor(shape.cls) * seg * elem_size
    load: Load = {k: v * f for k, v in shape.unit.items()}
    return load, _step_latency(shape, seg * elem_size, topo.links, params)


def _step_latency(shape: _Shape, seg_bytes: float, links: LinkModel, params: CostParams) -> float:
    """What a step takes besides its links' loads: its ring's latency chain;
    under NCCL, a native step's slowest rank's calls as NCCL would run each
    alone (module docstring), less the one launch its tick pays."""
    if params.native != "nccl" or not shape.calls:
        return _latency(shape, links, params, seg_bytes)
    op = shape.cls.split(":")[1]
    return max(sum(call_seconds(op, sm, mult * seg_bytes, 1, params, links) for sm, mult in seq)
               for seq in shape.calls) - params.launch


def _latency(shape: _Shape, links: LinkModel, params: CostParams, seg_bytes: float) -> float:
    if shape.shm:  # a barrier per piece; all_reduce two, but one at most SHM_WHOLE_REDUCE_BYTES (shm.h)
        if not shape.unit:
            return 0.0
        two = shape.cls == "shm:all_reduce" and seg_bytes > SHM_WHOLE_REDUCE_BYTES
        return (2 if two else 1) * params.shm_barrier
    if not shape.hops:
        return 0.0
    worst = max(links.tier(t).latency for t in shape.tiers)
    tiny = _tiny_hops(shape, seg_bytes, params)
    # every message's trip through a host's kernel, on its shared cores (CostParams.host_message); a tiny
    # path sends fewer than its ring's
    messages = shape.messages * (tiny / shape.hops if tiny is not None else 1)
    if tiny is not None:
        return tiny * worst + messages * params.host_message
    return shape.hops * (worst + (params.ring_step if shape.ring else 0.0)) + messages * params.host_message


def _tiny_hops(shape: _Shape, seg_bytes: float, params: CostParams) -> int | None:
    """The hops of a native step on a transport's tiny path, or None where it takes its ring's. The whole
    group's (gloo's, csrc/transport/c10d.cc): every member's input (reduce_scatter's is n segments) in one
    frame, up a tree and down, two members swapping at once. A sub-group's all_reduce or all_gather (UCX
    between hosts, csrc/transport/ucx.cc) whose gathered inputs fit net_tiny_bytes: Bruck's all-gather,
    ceil(log2 n) hops. One group per rank (the ring's chain is one ring's hops)."""
    n = shape.widest
    if not _one_ring_per_rank(shape):
        return None
    if shape.whole:
        inputs = n * n * seg_bytes if shape.cls.endswith("reduce_scatter") else n * seg_bytes
        return (1 if n == 2 else 2 * math.ceil(math.log2(n))) if inputs <= params.tiny_bytes else None
    return math.ceil(math.log2(n)) if _on_bruck(shape, seg_bytes, params.net_tiny_bytes) else None


def _one_ring_per_rank(shape: _Shape) -> bool:
    """A native step whose latency chain is one ring's: every rank in one group (a transport's tiny path
    replaces that ring)."""
    n = shape.widest
    return not shape.ring and n >= 2 and shape.hops == (2 * (n - 1) if shape.cls.endswith("all_reduce") else n - 1)


def _on_bruck(shape: _Shape, seg_bytes: float, limit: float) -> bool:
    """A sub-group's all_reduce or all_gather that UCX runs as Bruck's all-gather: one ring per rank, its
    members' inputs together within limit (ucx.h kTinyGather)."""
    return (_one_ring_per_rank(shape) and not shape.whole and shape.cls.endswith(("all_reduce", "all_gather"))
            and shape.widest * seg_bytes <= limit)


@dataclass
class PlanCost:
    """A plan compiled for pricing: its distinct ticks, how often each occurs,
    and per tick the bytes each link carries per step class (before class
    factors and bandwidths). `loads[u]` has shape (links, classes)."""

    links: list[tuple[str, str]]
    classes: list[str]
    loads: np.ndarray  # (ticks, links, classes)
    mult: np.ndarray  # (ticks,)
    shapes: list[list[tuple[_Shape, float]]]  # per distinct tick, its active steps' shapes and segment bytes
    copy_bytes: float
    solo: np.ndarray | None = None  # (ticks, links): loaded by one NCCL call alone (_assemble)
    kinds: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        self.kinds = np.array([LINK_KINDS.index(link[0].split("_")[0]) for link in self.links], dtype=int)

    def evaluate(self, links: LinkModel, params: CostParams) -> float:
        """The call's seconds: its ticks in turn, and at least its busiest link's bytes at that link's rate.
        The second bound only binds where a link has a burst: one call may pass its first bytes
        faster than the rate, but calls that follow one another cannot average more than it."""
        weighted = self._weighted(params)
        ticks = float(self._ticks(weighted, links, params).sum() + self.copy_bytes / params.copy_bandwidth)
        return max(ticks, self._busiest_link(weighted, links, params))

    def _weighted(self, params: CostParams) -> np.ndarray:
        """Bytes per (tick, link), each step class's bytes times its factor."""
        weighted: np.ndarray = self.loads @ np.array([params.factor(c) for c in self.classes])
        return weighted

    def _busiest_link(self, weighted: np.ndarray, links: LinkModel, params: CostParams) -> float:
        if not self.links or not len(self.mult):
            return 0.0
        if params.native == "nccl" and self.solo is not None and self.solo.any():
            return 0.0  # NCCL's own call times price those links (breakdown)
        return float(((self.mult @ weighted) / self._rates(links, params)[self.kinds]).max())

    @staticmethod
    def _rates(links: LinkModel, params: CostParams) -> np.ndarray:
        return np.array([links.host.bandwidth * params.host_efficiency, links.nic.bandwidth * params.nic_efficiency,
                         links.trunk.bandwidth * params.nic_efficiency, params.shm_bandwidth,
                         params.machine_bandwidth])

    def breakdown(self, links: LinkModel, params: CostParams) -> np.ndarray:
        """Seconds of each distinct tick times its multiplicity (launch included)."""
        return self._ticks(self._weighted(params), links, params)

    def _ticks(self, weighted: np.ndarray, links: LinkModel, params: CostParams) -> np.ndarray:
        if not len(self.mult):
            return np.zeros(0)
        bw = self._rates(links, params)
        if self.links:
            loads = weighted
            burst = np.array([links.host.burst, links.nic.burst, links.trunk.burst, 0.0, 0.0])[self.kinds]
            if burst.any():  # a link's first `burst` bytes of the call are free: each tick pays its share of the rest
                total = self.mult @ loads
                loads = loads * np.clip(1 - burst / np.maximum(total, 1e-30), 0.0, 1.0)
            link_time = loads / bw[self.kinds]
            if params.native == "nccl" and self.solo is not None:  # that call's own time covers them
                link_time = np.where(self.solo, 0.0, link_time)
            busiest = link_time.max(axis=1)
        else:
            busiest = np.zeros(len(self.mult))
        seen: dict[tuple[int, float], float] = {}  # a step recurs in many ticks

        def step_latency(shape: _Shape, seg_bytes: float) -> float:
            key = (id(shape), seg_bytes)
            if key not in seen:
                seen[key] = _step_latency(shape, seg_bytes, links, params)
            return seen[key]

        lat = np.array([max((step_latency(*s) for s in tick), default=0.0) for tick in self.shapes])
        out: np.ndarray = self.mult * (np.maximum(busiest, lat) + params.launch)
        return out


def _assemble(ticks: list[tuple[tuple[int, ...], int]], shapes: list[tuple[_Shape, float]],
              elem_size: int, copy_bytes: float) -> PlanCost:
    """ticks: (indices into shapes of the active steps, multiplicity). A link
    one NCCL call loads alone in a tick is `solo`: under NCCL that call's own
    time (nccl_native, with its algorithm's bytes: NVLS moves fewer than a
    ring) prices it; only links that calls share bound the tick by their load."""
    link_ix: dict[tuple[str, str], int] = {}
    cls_ix: dict[str, int] = {}
    where: dict[int, np.ndarray] = {}
    own: dict[int, np.ndarray] = {}  # the links each shape's groups load alone
    for shape, _ in shapes:
        cls_ix.setdefault(shape.cls, len(cls_ix))
        if id(shape) not in where:
            where[id(shape)] = np.array([link_ix.setdefault(k, len(link_ix)) for k in shape.unit], dtype=int)
            own[id(shape)] = np.array([link_ix[k] for k in shape.unit if k not in shape.crowded], dtype=int)
    machine = link_ix.setdefault(MACHINE, len(link_ix)) if link_ix else -1
    sent = {k: v for k, v in link_ix.items() if k[0] == "nic_out"}  # each flow once
    loads = np.zeros((len(ticks), len(link_ix), len(cls_ix)))
    users = np.zeros((len(ticks), len(link_ix)), dtype=int)
    solo = np.zeros((len(ticks), len(link_ix)), dtype=bool)
    for u, (active, _) in enumerate(ticks):
        for i in active:
            shape, seg = shapes[i]
            np.add.at(loads[u, :, cls_ix[shape.cls]], where[id(shape)], shape.values * (seg * elem_size))
            np.add.at(users[u], where[id(shape)], 1)
        for i in active:
            shape = shapes[i][0]
            if shape.calls:
                ix = own[id(shape)]
                solo[u, ix[users[u, ix] == 1]] = True
    if machine >= 0 and sent:
        loads[:, machine, :] = loads[:, list(sent.values()), :].sum(axis=1)
    return PlanCost(list(link_ix), list(cls_ix), loads, np.array([m for _, m in ticks], dtype=float),
                    [[(shapes[i][0], shapes[i][1] * elem_size) for i in active] for active, _ in ticks], copy_bytes,
                    solo)


def compile_plan(plan: Plan, topo: Topology, elem_size: int) -> PlanCost:
    """Any plan: steps grouped into wavefront ticks, identical ticks merged."""
    places, cache = places_of(topo), _shape_cache(topo)
    shapes: list[tuple[_Shape, float]] = []
    index: dict[tuple[int, float], int] = {}
    at: dict[tuple[int, int], list[int]] = {}
    for s in plan.steps:
        shape, seg = _step_shape(s, places, cache)
        shape = _sent_as(shape, seg * elem_size, cache)
        key = (id(shape), seg)
        if key not in index:
            index[key] = len(shapes)
            shapes.append((shape, seg))
        at.setdefault((s.stage, s.chunk), []).append(index[key])
    counts: Counter[tuple[int, ...]] = Counter()
    for t in range(plan.chunks + plan.stages - 1):
        active = tuple(sorted(i for s in range(plan.stages) for i in at.get((s, t - s), ())))
        if active:
            counts[active] += 1
    copy = 0.0 if plan.work_at == "none" else 2.0 * plan.layout.size * elem_size  # packed in, unpacked out
    return _assemble(list(counts.items()), shapes, elem_size, copy)


def compile_pipeline(chunk_plan: Plan, chunks: int, topo: Topology, elem_size: int,
                     scale: float = 1.0) -> PlanCost:
    """A plan of `chunks` identical chunks, from the plan of its first chunk
    alone (built with one chunk): what `compile_plan` gives for the full plan,
    at a cost that does not grow with `chunks`. `scale` multiplies every
    segment (and the layout): one chunk plan then prices any chunk size."""
    places, cache = places_of(topo), _shape_cache(topo)
    stages = chunk_plan.stages
    per_stage: list[list[int]] = [[] for _ in range(stages)]
    shapes: list[tuple[_Shape, float]] = []
    for s in chunk_plan.steps:
        per_stage[s.stage].append(len(shapes))
        shape, seg = _step_shape(s, places, cache)
        shapes.append((_sent_as(shape, seg * scale * elem_size, cache), seg * scale))
    counts: Counter[tuple[int, ...]] = Counter()
    for t in range(chunks + stages - 1):
        lo, hi = max(0, t - chunks + 1), min(t, stages - 1)
        active = tuple(i for s in range(lo, hi + 1) for i in per_stage[s])
        if active:
            counts[active] += 1
    copy = 0.0 if chunk_plan.work_at == "none" else 2.0 * chunks * scale * chunk_plan.layout.size * elem_size
    return _assemble(list(counts.items()), shapes, elem_size, copy)


def predict(plan: Plan, topo: Topology, elem_size: int, params: CostParams | None = None) -> float:
    """Predicted seconds for `plan` on `topo` (the group's topology)."""
    return compile_plan(plan, topo, elem_size).evaluate(topo.links, params or CostParams())
