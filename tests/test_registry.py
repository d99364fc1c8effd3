"""The algorithm registry (hocc.plan.registry): a new algorithm is one module
and one registration, and then the planner, auto, config, hocc-bench's CLI,
the call check and the engine all know it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace

import pytest
import torch
import torch.distributed as dist

import hocc
from hocc.bench.cli import build_parser, spec_from_args
from hocc.config import algo_choices
from hocc.plan import Algorithm, PlannerConfig, Prediction, make_plan, names, register
from hocc.plan import registry as reg
from hocc.plan.calibrate import price as calibrate_price
from hocc.plan.planner import predict_all
from hocc.plan.ring import build_ring
from hocc.plan.types import Plan
from hocc.tools.cli import main as hocc_main
from hocc.tools.draw import first_chunk_plan
from hocc.topology import Topology, parse_spec
from tests.worlds import run_world


def _build(collective: str, topo: Topology, count: int, cfg: PlannerConfig, chunks: int) -> Plan:
    """The flat ring (host by host) under another name."""
    return replace(build_ring(collective, topo.restrict(range(topo.world_size)), count), algo="rank_ring")


def _predict(collective: str, topo: Topology, count: int, elem_size: int, cfg: PlannerConfig) -> Prediction:
    return Prediction("rank_ring", 1e-9)  # claims to beat everything, so auto must pick it


RANK_RING = Algorithm("rank_ring", "a test algorithm", _build, _predict)


@contextmanager
def registered(algo: Algorithm) -> Iterator[None]:
    register(algo)
    try:
        yield
    finally:
        reg._REGISTRY.pop(algo.name)


def test_the_built_ins_are_registered_in_order() -> None:
    assert names() == ("native", "ring", "ho_ring", "host_rails", "leaders")
    assert reg.algorithm("ho_ring").chunked and reg.algorithm("ho_ring").fallback == "ring"
    assert reg.algorithm("host_rails").fallback == "ho_ring"
    with pytest.raises(ValueError, match="registered already"):
        register(Algorithm("ring", "again", _build, _predict))
    with pytest.raises(ValueError, match=r"unknown algo 'tree'.*native.*ring.*ho_ring"):
        make_plan("all_reduce", 8, 4, parse_spec("2x2"), "tree")


def _hocc_plan(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    capsys.readouterr()
    hocc_main(["plan", *argv])
    out = capsys.readouterr().out
    return out[out.index("{"):]


def test_one_registration_reaches_every_reader(capsys: pytest.CaptureFixture[str]) -> None:
    topo = parse_spec("2x2")
    with registered(RANK_RING):
        assert names()[-1] == "rank_ring" and "rank_ring" in algo_choices()
        with pytest.raises(ValueError, match="first 8 characters"):  # the call check tells algos apart by them
            register(Algorithm("rank_ringer", "an 8-character twin", _build, _predict))
        assert "rank_ring" in predict_all("all_reduce", 1000, 4, topo)
        assert make_plan("all_reduce", 1000, 4, topo, "auto").algo == "rank_ring"  # auto weighs it too
        plan = make_plan("reduce_scatter", 10, 4, topo, "rank_ring")
        assert plan.algo == "rank_ring" and plan.predicted_s == pytest.approx(1e-9)
        args = build_parser().parse_args(["--algo", "native,rank_ring"])
        assert spec_from_args(args).algos == ("native", "rank_ring")
        # hocc plan's table has its column and names it auto's pick; --draw draws its plan
        report = json.loads(_hocc_plan(capsys, "2x2", "--op", "all_reduce", "-b", "1K", "-e", "1K", "--json", "-"))
        row = report["ops"]["all_reduce"]["rows"][0]
        assert row["auto"] == "rank_ring" and set(row["algos"]) == set(names())
        assert first_chunk_plan(topo, "all_gather", 10, 4, PlannerConfig()).algo == "rank_ring"
        cost, k = calibrate_price("all_gather", "rank_ring", 10, 4, topo, PlannerConfig())  # calibration prices it
        assert k == 1 and cost.evaluate(topo.links, PlannerConfig().params) > 0
        with pytest.raises(ValueError, match="role 'backend'"):  # auto's default is one algorithm's role
            register(Algorithm("rank_own", "a second backend", _build, _predict, role="backend"))
    assert "rank_ring" not in algo_choices()
    with pytest.raises(SystemExit, match="unknown algo 'rank_ring'"):
        spec_from_args(build_parser().parse_args(["--algo", "rank_ring"]))


def _body(rank: int, world: int) -> None:
    register(RANK_RING)  # every rank registers the same algorithms, in the same order
    for coll in ("all_reduce", "reduce_scatter", "all_gather"):
        t = torch.arange(12, dtype=torch.float32) + rank
        if coll == "all_reduce":
            want = t.clone()
            dist.all_reduce(want)
            hocc.all_reduce(t, algo="rank_ring")
            got = t
        elif coll == "reduce_scatter":
            got, want = torch.empty(6), torch.empty(6)
            dist.reduce_scatter_tensor(want, t)
            hocc.reduce_scatter_tensor(got, t, algo="rank_ring")
        else:
            got, want = torch.empty(12 * world), torch.empty(12 * world)
            dist.all_gather_into_tensor(want, t)
            hocc.all_gather_into_tensor(got, t, algo="rank_ring")
        assert torch.equal(got, want), (coll, got, want)
        last = hocc.last_plan()
        assert last is not None and last.algo == "rank_ring", last
    planned = hocc.plan_for("all_reduce", torch.empty(8), algo="auto")  # what auto would run, and why
    assert planned.algo == "rank_ring" and planned.reason.startswith("auto, model: "), planned.reason


def test_a_registered_algorithm_runs_through_the_engine() -> None:
    run_world(2, _body, timeout_s=120)
