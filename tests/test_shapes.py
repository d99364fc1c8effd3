"""Size-generic plans (hocc.plan.shapes, hocc.engine.plan_cache): a unit scaled to
any size is the plan the builders make for that size, its C++ form runs to
torch's results, and a new size builds no plan."""

from __future__ import annotations

import itertools

import pytest
import torch

import hocc.engine.plan_cache as plans_mod
from hocc.engine.plan_cache import PlanCache
from hocc.executor.inproc import InProcWorld
from hocc.plan.planner import PlannerConfig, make_plan
from hocc.plan.types import Plan
from hocc.topology import parse_spec
from tests.test_executor_matrix import expected

TOPOLOGIES = ("8", "2x4", "4x2", "2x2x2", "2x4:scattered", "3+5", "1+7", "2+3+3", "2x3", "5")
COUNTS = (1, 2, 3, 7, 8, 31, 64, 1000, 4099, 65537)
VARIANTS = (("native", None), ("ring", None), ("ho_ring", None), ("ho_ring", 1), ("ho_ring", 2), ("ho_ring", 4),
            ("ho_ring", 8))


def structure(p: Plan) -> tuple[object, ...]:
    """What runs: everything but the prediction, the reason and the notes."""
    return p.collective, p.algo, p.world, p.count, p.layout, p.steps, p.stages, p.work_at, p.pack


@pytest.mark.parametrize("spec", TOPOLOGIES)
def test_a_scaled_unit_is_the_builders_plan(spec: str) -> None:
    topo = parse_spec(spec)
    cache = PlanCache(topo)
    scaled = 0
    for coll, (algo, k), ring_ops in itertools.product(("all_reduce", "reduce_scatter", "all_gather"), VARIANTS,
                                                       ((), ("all_reduce",))):
        cfg = PlannerConfig(chunks=k, ring_ops=ring_ops, host_impl="shm" if ring_ops else "", min_chunk_bytes=1024)
        for n in COUNTS:
            want = make_plan(coll, n, 4, topo, algo, cfg)
            got = cache.get(coll, n, 4, algo, cfg)
            assert structure(got.plan) == structure(want), f"{spec} {coll} {algo} K={k} n={n}"
            assert got.plan.predicted_s == pytest.approx(want.predicted_s), f"{spec} {coll} {algo} K={k} n={n}"
            assert got.cpp.work_elems == want.layout.size and got.cpp.chunks == want.chunks
            scaled += got.cpp.scale > 1
    assert scaled > 100  # the sizes really went through scaling


def test_ho_ring_with_or_without_k_hashes_alike() -> None:
    """The model's K for a size goes through that K's unit: the same plan, the same call-check hash."""
    topo = parse_spec("2x4")
    cache = PlanCache(topo)
    n = 4 << 20
    free = cache.get("all_reduce", n, 4, "ho_ring", PlannerConfig())
    k = free.plan.chunks
    fixed = cache.get("all_reduce", n, 4, "ho_ring", PlannerConfig(chunks=k))
    assert k > 1 and free.hash == fixed.hash and structure(free.plan) == structure(fixed.plan)


@pytest.mark.parametrize("spec", ("2x4", "3+5", "2x2x2"))
def test_scaled_plans_run_to_torchs_results(spec: str) -> None:
    """The C++ form of a scaled unit (shared steps, offsets times the scale) on the in-process executor."""
    topo = parse_spec(spec)
    world = InProcWorld(topo.world_size, timeout_s=30)
    cache = PlanCache(topo)
    gen = torch.Generator().manual_seed(7)
    for coll, (algo, k), n in itertools.product(("all_reduce", "reduce_scatter", "all_gather"),
                                                (("ring", None), ("ho_ring", 1), ("ho_ring", 4)), (1, 31, 4099)):
        entry = cache.get(coll, n, 4, algo, PlannerConfig(chunks=k))
        w = topo.world_size
        size_in = n * w if coll == "reduce_scatter" else n
        xs = [torch.randint(-4, 5, (size_in,), generator=gen).float() for _ in range(w)]
        outs = [torch.empty(n * w if coll == "all_gather" else n) for _ in range(w)]
        world.run(entry.plan, xs, outs, cpp=entry.cpp)
        if coll == "all_gather":
            want = [torch.cat(xs)] * w
        else:
            total = expected("sum", xs).float()
            want = [total] * w if coll == "all_reduce" else list(total.view(w, n))
        for r in range(w):
            assert torch.equal(outs[r], want[r]), f"{spec} {coll} {algo} K={k} n={n} rank {r}"


def test_a_new_size_builds_no_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    """Once a unit exists, new sizes neither build nor plan: only reading the plan does."""
    topo = parse_spec("64x8")
    cache = PlanCache(topo)
    cfg = PlannerConfig(chunks=4)
    cache.get("all_reduce", 1 << 20, 4, "ho_ring", cfg)
    cache.get("all_reduce", 1000001, 4, "ho_ring", cfg)  # both routings exist (padded, and not)

    def refuse(*a: object, **k: object) -> None:
        raise AssertionError("a plan was built for a new size")

    monkeypatch.setattr(plans_mod, "make_plan", refuse)
    monkeypatch.setattr(plans_mod, "build_unit", refuse)
    monkeypatch.setattr(plans_mod, "to_cpp", refuse)
    entries = [cache.get("all_reduce", n, 4, "ho_ring", cfg) for n in (1000003, 2 << 20, 77777, 4 << 20)]
    assert len({e.hash for e in entries}) == 4
    monkeypatch.undo()
    assert entries[1].plan.count == 2 << 20 and entries[1].plan.layout.block_elems == 2 << 20
