"""The sanitizer runs the planner's own plans: tests/fixtures/plans/*.json hold what make_plan emits for
several topologies, every registered algorithm, sizes and K, and `make sanitize` runs every one under
ASan + UBSan and TSan (csrc/tests/sanitize_main.cc, planner_plans), read through plan_from_json as the
bindings read every plan. Here: the files are what the planner emits now, and each plan crosses into
hocc._C whole. After a planner change:

    HOCC_WRITE_FIXTURES=1 .venv/bin/python -m pytest -q tests/test_plan_fixtures.py
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from hocc.executor import available
from hocc.executor.cpp_form import to_cpp
from hocc.plan.planner import PlannerConfig, make_plan
from hocc.plan.policy import CPU_RING_OPS
from hocc.plan.registry import algorithm, names
from hocc.plan.types import COLLECTIVES, Plan
from hocc.topology.spec import parse_spec

DIR = Path(__file__).parent / "fixtures" / "plans"
TOPOLOGIES = ("2x2", "2x3", "3+2", "2x2x2")  # uniform, uneven (rails overlap), and two switches: at most 8 ranks
COUNTS = (1, 13, 1000)  # per rank: one element, a prime, and one that K chunks split unevenly
SETTINGS = {"backend steps": {}, "point-to-point rings for RS and AG": {"ring_ops": CPU_RING_OPS}}
NOT_KEPT = ("reason", "predicted_s", "meta")  # the model's words and figures: they change with its prices


def plans_for(spec: str) -> list[dict[str, Any]]:
    topo = parse_spec(spec)
    out = []
    for collective in COLLECTIVES:
        for algo in names():
            for count in COUNTS:
                for settings in SETTINGS.values():
                    for chunks in (None, 2) if algorithm(algo).chunked else (None,):
                        plan = make_plan(collective, count, 4, topo, algo, PlannerConfig(chunks=chunks, **settings))
                        if plan.algo != algo:  # fell back: that algorithm's own plans are there already
                            continue
                        d = {k: v for k, v in plan.to_dict().items() if k not in NOT_KEPT}
                        if d not in out:
                            out.append(d)
    return out


def fixture_text(spec: str) -> str:
    plans = plans_for(spec)
    rows = ",\n".join(json.dumps(p, separators=(",", ":")) for p in plans)
    return (f'{{"topology":{json.dumps(spec)},"world":{parse_spec(spec).world_size},'
            f'"written_by":"tests/test_plan_fixtures.py","plans":[\n{rows}\n]}}\n')


@pytest.mark.parametrize("spec", TOPOLOGIES)
def test_the_fixtures_are_what_the_planner_emits(spec: str) -> None:
    path = DIR / f"{spec}.json"
    want = fixture_text(spec)
    if os.environ.get("HOCC_WRITE_FIXTURES") == "1":
        DIR.mkdir(parents=True, exist_ok=True)
        path.write_text(want)
    assert path.exists() and path.read_text() == want, (
        f"{path} is not what the planner emits now: HOCC_WRITE_FIXTURES=1 pytest {__file__}")
    doc = json.loads(want)
    algos = {p["algo"] for p in doc["plans"]}
    assert algos >= {"native", "ring", "ho_ring"} and (spec == "3+2" or algos == set(names())), algos  # 3+2: uneven
    assert {p["collective"] for p in doc["plans"]} == set(COLLECTIVES)


@pytest.mark.skipif(not available(), reason="hocc._C is not built")
@pytest.mark.parametrize("spec", TOPOLOGIES)
def test_every_fixture_crosses_into_cpp_whole(spec: str) -> None:
    for d in plans_for(spec):
        plan = Plan.from_dict(d)
        cpp = to_cpp(plan)
        assert (cpp.world, cpp.stages, cpp.chunks, cpp.num_steps, cpp.work_elems) == \
            (plan.world, plan.stages, plan.chunks, len(plan.steps), plan.layout.size), d


@pytest.mark.skipif(not available(), reason="hocc._C is not built")
def test_a_bad_plan_is_refused_with_its_reason() -> None:
    from hocc.executor import load

    good = make_plan("all_reduce", 13, 4, parse_spec("2x2"), "ho_ring").to_dict()
    step = good["steps"][0]
    bad_offset = {**step, "groups": [{**step["groups"][0], "offset": -1}, *step["groups"][1:]]}
    for broken, why in (("{", "bad plan JSON"), (json.dumps({**good, "world": 1}), "names rank"),
                        (json.dumps({k: v for k, v in good.items() if k != "steps"}), "no 'steps'"),
                        (json.dumps({**good, "collective": "all_to_all"}), "all_to_all"),
                        (json.dumps({**good, "steps": [bad_offset, *good["steps"][1:]]}), "out of range: -1"),
                        (json.dumps({**good, "layout": {**good["layout"], "block_elems": -3}}), "out of range"),
                        (json.dumps({**good, "world": 2**40}), "out of range"),
                        (json.dumps(good).replace('"stages": 3', '"stages": nan'), "bad plan JSON")):
        with pytest.raises(RuntimeError, match=why):
            load().Plan(broken)
    # what to_cpp sends in full: the model's figures (floats, exponents) and text with escapes cross too
    full = {**good, "reason": "priced \u00e9 \"here\"\n", "predicted_s": 1.5e-05, "meta": {"x": [-1, 0.25, None]}}
    cpp = load().Plan(json.dumps(full))
    assert (cpp.world, cpp.stages, cpp.num_steps) == (4, good["stages"], len(good["steps"]))
