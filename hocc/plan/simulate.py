"""Symbolic execution of a plan on every rank at once, without communication.

Each element carries two channels: a value modulo a prime (rank r's inputs are
random) and a count of contributions. A correct reduction ends with count == W
and the modular sum of all ranks' inputs; a region that a step leaves
undefined is poisoned, so a plan that reads it is caught. Steps run in a
random order that respects only the plan's declared dependencies, and steps
that may overlap must touch disjoint regions: a plan that relies on the
executor's incidental ordering fails here. A rank may sit in several groups
of a step (types.py) if their regions are disjoint on it; 'shm' groups stay
one per rank per step.
"""

from __future__ import annotations

import random

import numpy as np

from hocc.plan.types import PAD_BLOCK, Plan, Step

PRIME = 2_147_483_647
POISON = -1


class PlanError(AssertionError):
    pass


def check_structure(plan: Plan) -> None:
    size = plan.layout.size
    if plan.collective != "all_reduce" and (
            sorted(b for b in plan.layout.order if b != PAD_BLOCK) != list(range(plan.world))
            or len(plan.layout.order) != plan.layout.blocks):
        raise PlanError(f"layout order {plan.layout.order}: every rank's block once, pad slots {PAD_BLOCK}")
    for s in plan.steps:
        held: dict[int, list[tuple[int, int]]] = {}  # rank -> regions of its groups in this step
        for g in s.groups:
            if len(set(g.ranks)) != len(g.ranks):
                raise PlanError(f"a rank listed twice in one group: {s}")
            lo, hi = s.region(g)
            if g.offset < 0 or hi > size:
                raise PlanError(f"region out of the work buffer ({size}): {s}")
            if s.impl == "native" and list(g.ranks) != sorted(g.ranks):
                raise PlanError(f"native step with members out of rank order: {s}")
            for r in g.ranks:
                mine = held.setdefault(r, [])
                if mine and s.impl == "shm":
                    raise PlanError(f"rank {r} in two shared-memory groups of one step: {s}")
                if any(lo < e and b < hi for b, e in mine):
                    raise PlanError(f"rank {r} in two groups of one step whose regions overlap: {s}")
                mine.append((lo, hi))
        if not 0 <= s.stage < plan.stages:
            raise PlanError(f"stage {s.stage} outside 0..{plan.stages - 1}")


def _regions(s: Step) -> list[tuple[int, int, int]]:
    """(rank, start, end) touched by a step."""
    return [(r, *s.region(g)) for g in s.groups for r in g.ranks]


def check_races(plan: Plan) -> None:
    """Steps not ordered by the dependency chain (same chunk, consecutive
    stages) must touch disjoint regions on each rank."""
    for i, a in enumerate(plan.steps):
        ra = _regions(a)
        for b in plan.steps[i + 1:]:
            if a.chunk == b.chunk:
                continue  # same chunk: ordered by its stage chain
            for r1, s1, e1 in ra:
                for r2, s2, e2 in _regions(b):
                    if r1 == r2 and s1 < e2 and s2 < e1 and e1 > s1 and e2 > s2:
                        raise PlanError(f"steps may overlap on rank {r1}: {a} / {b}")


def _apply(step: Step, vals: list[np.ndarray], cnts: list[np.ndarray]) -> None:
    for g in step.groups:
        n = len(g.ranks)
        if step.collective == "all_reduce":
            sl = slice(g.offset, g.offset + g.seg)
            v = sum(vals[r][sl] for r in g.ranks) % PRIME
            c = sum(cnts[r][sl] for r in g.ranks)
            for r in g.ranks:
                vals[r][sl], cnts[r][sl] = v, c
        elif step.collective == "reduce_scatter":
            region = slice(g.offset, g.offset + n * g.seg)
            segs = [slice(g.offset + i * g.seg, g.offset + (i + 1) * g.seg) for i in range(n)]
            sums = [(sum(vals[r][sl] for r in g.ranks) % PRIME, sum(cnts[r][sl] for r in g.ranks)) for sl in segs]
            for i, r in enumerate(g.ranks):
                vals[r][region], cnts[r][region] = POISON, POISON
                vals[r][segs[i]], cnts[r][segs[i]] = sums[i]
        elif step.collective == "all_gather":
            segs = [slice(g.offset + i * g.seg, g.offset + (i + 1) * g.seg) for i in range(n)]
            own = [(vals[r][segs[i]].copy(), cnts[r][segs[i]].copy()) for i, r in enumerate(g.ranks)]
            for r in g.ranks:
                for i in range(n):
                    vals[r][segs[i]], cnts[r][segs[i]] = own[i]
        elif step.collective == "broadcast":
            sl = slice(g.offset, g.offset + g.seg)
            v, c = vals[g.ranks[0]][sl].copy(), cnts[g.ranks[0]][sl].copy()
            for r in g.ranks:
                vals[r][sl], cnts[r][sl] = v, c
        else:
            raise PlanError(f"unknown op {step.collective}")


def _schedule(plan: Plan, rng: random.Random) -> list[Step]:
    """A random order respecting only (stage-1, chunk) -> (stage, chunk)."""
    by_chunk: dict[int, list[Step]] = {}
    for s in plan.steps:
        by_chunk.setdefault(s.chunk, []).append(s)
    queues = [sorted(v, key=lambda s: s.stage) for v in by_chunk.values()]
    out = []
    while queues:
        q = rng.choice(queues)
        out.append(q.pop(0))
        queues = [q for q in queues if q]
    return out


def simulate(plan: Plan, seed: int = 0) -> None:
    """Run `plan` symbolically for all ranks; raise PlanError if any rank ends
    with a result other than the collective's definition."""
    check_structure(plan)
    check_races(plan)
    rng = random.Random(seed)
    nprng = np.random.default_rng(seed)
    lay, w, c = plan.layout, plan.world, plan.count
    # caller inputs: all_reduce c elems; reduce_scatter w*c; all_gather c
    in_len = w * c if plan.collective == "reduce_scatter" else c
    inputs = [nprng.integers(0, PRIME, size=in_len, dtype=np.int64) for _ in range(w)]
    vals, cnts = [], []
    for r in range(w):
        v = np.full(lay.size, POISON, dtype=np.int64)
        n = np.full(lay.size, POISON, dtype=np.int64)
        work_v = v.reshape(lay.chunks, lay.blocks, lay.piece) if lay.size else v
        work_n = n.reshape(lay.chunks, lay.blocks, lay.piece) if lay.size else n
        for i, blk in enumerate(lay.order if lay.size else ()):
            if plan.collective == "all_gather" and blk != r:
                continue  # pad slots too: what an all-gather moves there is never read
            if blk == PAD_BLOCK:  # reduce_scatter's pad slots: zeros that nobody counts
                work_v[:, i, :], work_n[:, i, :] = 0, 0
                continue
            src = inputs[r][blk * c:(blk + 1) * c] if plan.collective == "reduce_scatter" else inputs[r]
            for k in range(lay.chunks):
                part = src[k * lay.piece:(k + 1) * lay.piece]
                work_v[k, i, :] = 0
                work_n[k, i, :] = 1
                work_v[k, i, :len(part)] = part
        vals.append(v)
        cnts.append(n)
    for step in _schedule(plan, rng):
        _apply(step, vals, cnts)
    for r in range(w):
        wv = vals[r].reshape(lay.chunks, lay.blocks, lay.piece) if lay.size else vals[r]
        wn = cnts[r].reshape(lay.chunks, lay.blocks, lay.piece) if lay.size else cnts[r]

        def block(i: int, wv: np.ndarray = wv, wn: np.ndarray = wn) -> tuple[np.ndarray, np.ndarray]:
            if not lay.size:
                return np.zeros(0, np.int64), np.zeros(0, np.int64)
            return wv[:, i, :].reshape(-1)[:c], wn[:, i, :].reshape(-1)[:c]

        if plan.collective == "all_reduce":
            got, n = block(0)
            want = sum(inputs) % PRIME if w else np.zeros(0)
            expect_n = w
        elif plan.collective == "reduce_scatter":
            got, n = block(lay.order.index(r))
            want = sum(x[r * c:(r + 1) * c] for x in inputs) % PRIME
            expect_n = w
        else:
            for i, blk in enumerate(lay.order):
                if blk == PAD_BLOCK:
                    continue
                got, n = block(i)
                if not np.array_equal(got, inputs[blk]) or not np.all(n == 1):
                    raise PlanError(f"all_gather: rank {r} has a wrong block {blk}\n{plan.describe()}")
            continue
        if not np.all(n == expect_n) or not np.array_equal(got, want):
            raise PlanError(f"{plan.collective}: rank {r} ends with a wrong result "
                            f"(contribution counts {sorted(set(n.tolist()))})\n{plan.describe()}")


def nic_traffic(plan: Plan, host_of: dict[int, str], switch_of: dict[str, str] | None = None,
                ) -> tuple[dict[str, int], dict[str, int]]:
    """Elements each host sends out of its NIC, and each switch out of its
    trunk, when every group of the plan runs as a ring over its members in the
    listed order (what 'ring' steps do, and gloo / NCCL rings for 'native'
    ones): reduce-scatter and all-gather members send (n-1) segments, an
    all-reduce member the region less the two parts it does not send (the
    region split as ring_p2p.split_even does), a broadcast member but the last
    the region (a chain). 'shm' steps stay inside a host."""
    nic: dict[str, int] = dict.fromkeys(host_of.values(), 0)
    trunk: dict[str, int] = dict.fromkeys((switch_of or {}).values(), 0)
    for s in plan.steps:
        if s.impl == "shm":
            continue
        for g in s.groups:
            n = len(g.ranks)
            if n < 2:
                continue
            q, rem = divmod(g.seg, n)
            part = [q + (1 if i < rem else 0) for i in range(n)]
            for i, a in enumerate(g.ranks):
                b = g.ranks[(i + 1) % n]
                if host_of[a] == host_of[b]:
                    continue
                if s.collective == "broadcast":  # the chain from the first member: the last sends nothing
                    sent = g.seg if i < n - 1 else 0
                elif s.collective == "all_reduce":
                    sent = 2 * g.seg - part[i] - part[(i + 1) % n]
                else:
                    sent = (n - 1) * g.seg
                nic[host_of[a]] += sent
                if switch_of and switch_of[host_of[a]] != switch_of[host_of[b]]:
                    trunk[switch_of[host_of[a]]] += sent
    return nic, trunk
