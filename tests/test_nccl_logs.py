"""nccl-tests logs: the parser on fixture logs in both layouts nccl-tests
prints, and `hocc calibrate --nccl-tests` recovering the parameters the
fixture logs were made with (tests/fixtures/make_nccl_logs.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from hocc.plan.nccl_native import options
from hocc.tools import plan_cli
from hocc.tools.calibrate_nccl import fit, points_of
from hocc.tools.cli import main
from hocc.tools.nccl_tests_log import parse_log, read_logs
from hocc.topology import parse_spec

FIX = Path(__file__).parent / "fixtures"
AR, AG = FIX / "nccl_tests_all_reduce_2x8.log", FIX / "nccl_tests_all_gather_2x8.log"
SPEC = "2x8@nics=8,fabric=nvswitch,nic=400gbit,host=450GB"


def test_parse_srun_log() -> None:
    (run,) = read_logs([AR])
    assert run.op == "all_reduce" and run.world == 16 and run.shape == (2, 8)
    assert run.hostnames[8] == "node01" and run.devices[:8] == list(range(8))
    assert len(run.rows) == 16 and run.rows[0].size == 8 and run.rows[-1].size == 1 << 33
    big = run.rows[-1]
    assert big.busbw == pytest.approx(big.algbw * 2 * 15 / 16, rel=0.01)
    assert big.time_s == pytest.approx(big.size / big.algbw / 1e9, rel=0.01)


def test_parse_old_layout_and_infer_the_op() -> None:
    (run,) = parse_log(AG.read_text())
    assert run.op == "all_gather" and len(run.rows) == 16  # no root column, op read from the rows
    (rs,) = parse_log(AG.read_text().replace(" none ", "  sum "))
    assert rs.op == "reduce_scatter"
    assert parse_log(AG.read_text(), op="reduce_scatter")[0].op == "reduce_scatter"
    both = parse_log(AR.read_text() + AG.read_text())
    assert [r.op for r in both] == ["all_reduce", "all_gather"]
    headless = "\n".join(ln for ln in AG.read_text().splitlines() if "Rank" not in ln)
    with pytest.raises(ValueError, match="Using devices"):
        parse_log(headless)


def test_calibrate_recovers_the_logs_parameters() -> None:
    points, topo = points_of(read_logs([AR, AG]), SPEC)
    assert topo.world_size == 16 and len(points) == 30  # all_gather's 8 and 32 B rows have no element per rank
    result = fit(points)
    assert result.rms_log < 0.01
    assert result.params.nic_efficiency == pytest.approx(0.9, rel=0.03)
    assert result.params.nvls_efficiency == pytest.approx(0.58, rel=0.03)
    assert result.params.launch == pytest.approx(12e-6, rel=0.2)
    assert result.links.nic.latency == pytest.approx(14e-6, rel=0.2)
    with pytest.raises(ValueError, match="has 32 ranks but the log ran 16"):
        points_of(read_logs([AR]), "4x8")


def test_calibrate_cli_writes_what_plan_reads(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "gpu.json"
    assert main(["calibrate", "--nccl-tests", str(AR), str(AG), "--topology", SPEC, "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "rms log error: defaults" in text and "fitted 0.00" in text
    topo = parse_spec(str(out))
    cfg = plan_cli.planner_config(topo, "nccl")
    assert cfg.params.native == "nccl" and cfg.params.nic_efficiency == pytest.approx(0.9, rel=0.03)
    (run,) = read_logs([AR])
    row = run.rows[-4]  # 512 MiB
    pred = min(options("all_reduce", topo, row.size // 4, 4, cfg.params).values())
    assert pred == pytest.approx(row.time_s, rel=0.02)
    args = argparse.Namespace(topology=str(out), hosts=None, host=None, nic=None, trunk=None, host_latency=None,
                              nic_latency=None, trunk_latency=None, backend="nccl", nics_per_host=None, fabric=None)
    assert plan_cli.build_topology(args).host_infos()[0].nics == 8
