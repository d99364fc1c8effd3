"""`hocc calibrate`: the fit recovers known parameters from synthetic
measurements, reads hocc-bench JSON, and writes a topology file that
HOCC_TOPOLOGY (hocc.Config) and `hocc plan` accept."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from hocc.config import Config
from hocc.plan import CostParams
from hocc.plan.calibrate import Fit, Sample, calibrate, load_samples, planner_for, price
from hocc.tools.cli import main
from hocc.topology import parse_spec

SCENARIOS = ["2x4@nic=200mbit", "4x2@nic=200mbit", "2x2x2@nic=200mbit,trunk=100mbit", "8",
             "2x4@nic=1gbit", "2x4:scattered@nic=200mbit"]
TRUTH = Fit({"host": 4.0, "nic": 0.8, "trunk": 0.7}, {"host": 1e-3, "nic": 1.5e-3, "trunk": 2e-3},
            CostParams(launch=2e-3, ring_step=3e-4, copy_bandwidth=1e9).with_factors(
                {"native:reduce_scatter": 2.0, "native:all_gather": 1.2, "native:all_reduce": 0.9}))


def synthetic(truth: Fit) -> list[Sample]:
    out = []
    cfg = planner_for("cpu")
    for spec in SCENARIOS:
        topo = parse_spec(spec)
        for op in ("all_reduce", "reduce_scatter", "all_gather"):
            for size in (1 << 16, 1 << 18, 1 << 20, 1 << 22, 1 << 24, 1 << 26):
                count = size // 4 if op == "all_reduce" else size // 4 // topo.world_size
                for algo in ("native", "ring", "ho_ring"):
                    cost, k = price(op, algo, count, 4, topo, cfg)
                    s = Sample(spec, topo, op, size, algo, 1.0, cost, k)
                    s.seconds = truth.predict(s)
                    out.append(s)
    return out


def test_fit_recovers_known_parameters() -> None:
    fit = calibrate(synthetic(TRUTH), prior=1e-4, iterations=100)
    assert fit.rms_log < 0.01
    for t in ("host", "nic", "trunk"):
        assert fit.efficiency[t] == pytest.approx(TRUTH.efficiency[t], rel=0.05), t
        assert fit.latency[t] == pytest.approx(TRUTH.latency[t], rel=0.1), t
    for c in ("native:reduce_scatter", "native:all_gather", "native:all_reduce"):
        assert fit.params.factor(c) == pytest.approx(TRUTH.params.factor(c), rel=0.05), c
    assert fit.params.launch == pytest.approx(TRUTH.params.launch, rel=0.1)
    assert fit.params.copy_bandwidth == pytest.approx(TRUTH.params.copy_bandwidth, rel=0.1)


def test_fit_recovers_the_machine_bandwidth() -> None:
    truth = replace(TRUTH, params=replace(TRUTH.params, machine_bandwidth=1.3e8))
    fit = calibrate(synthetic(truth), prior=1e-4, iterations=100, one_machine=True)
    assert fit.params.machine_bandwidth == pytest.approx(1.3e8, rel=0.05)
    assert fit.efficiency["nic"] == pytest.approx(0.8, rel=0.05)


def _bench_json(path: Path, spec: str, truth: Fit) -> None:
    topo = parse_spec(spec)
    rows = []
    for s in synthetic(truth):
        if s.scenario == spec:
            rows.append({"op": s.op, "size": s.size, "count": s.size // 4, "dtype": "float32", "redop": "sum",
                         "algo": s.algo, "ran": s.algo, "time_us": s.seconds * 1e6, "algbw": 0, "busbw": 0,
                         "wrong": 0, "spread": 0})
    rows.append({**rows[0], "algo": "auto", "ran": "native"})
    meta = {"topology": spec, "world": topo.world_size, "device": "cpu"}
    path.write_text(json.dumps({"schema": "hocc-bench/1", "meta": meta, "results": rows}))


def test_cli_writes_a_topology_file_that_plans_read(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    files = []
    for i, spec in enumerate(SCENARIOS[:3]):
        files.append(tmp_path / f"s{i}.json")
        _bench_json(files[-1], spec, TRUTH)
    samples = load_samples(files)
    assert len(samples) == 3 * 3 * 6 * 3 and not any(s.algo == "auto" for s in samples)
    out = tmp_path / "cal.json"
    assert main(["calibrate", *map(str, files), "-o", str(out), "--topology", "2x4@nic=200mbit"]) == 0
    text = capsys.readouterr().out
    assert "within 25%" in text and "wrote" in text
    topo = parse_spec(str(out))
    assert topo.shape() == "2x4" and topo.cost is not None
    assert topo.links.nic.bandwidth == pytest.approx(0.8 * 25e6, rel=0.05)
    cfg = Config.from_env({"HOCC_TOPOLOGY": str(out)})
    assert cfg.planner.params.factor("native:reduce_scatter") == pytest.approx(2.0, rel=0.05)
    assert main(["plan", str(out), "--op", "reduce_scatter", "-b", "16M", "-e", "16M"]) == 0
    assert "calibrated cost" in capsys.readouterr().out
