"""`hocc plan`: tables, auto's picks, crossovers, JSON, synthetic topologies,
--draw, and errors that say what to write instead."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from hocc.tools.cli import main


def test_table_picks_and_crossovers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "p.json"
    assert main(["plan", "2x4@nic=200mbit", "--op", "all", "-b", "64K", "-e", "64M", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    for op in ("all_reduce", "reduce_scatter", "all_gather"):
        assert f"# {op}" in text
    assert text.count("# crossovers:") == 3
    doc = json.loads(out.read_text())
    rows = doc["ops"]["all_reduce"]["rows"]
    assert [r["size"] for r in rows] == [1 << s for s in range(16, 27, 2)]
    assert rows[-1]["auto"] == "ho_ring" and rows[-1]["algos"]["ho_ring"]["chunks"] >= 1
    for op in doc["ops"].values():  # a crossover lies between two sizes whose picks differ
        for c in op["crossovers"]:
            assert 1 << 16 <= c["size"] <= 1 << 26 and c["from"] != c["to"]


def test_crossover_between_native_and_ho_ring(capsys: pytest.CaptureFixture[str]) -> None:
    """2x4 on the testbed defaults: HO-Ring at large sizes, and every change of
    pick in the sweep is reported as a crossover."""
    assert main(["plan", "2x4", "--op", "all_reduce", "-b", "4K", "-e", "64M", "--json", "-"]) == 0
    text = capsys.readouterr().out
    doc = json.loads(text[text.index("{"):])
    picks = [r["auto"] for r in doc["ops"]["all_reduce"]["rows"]]
    assert picks[-1] == "ho_ring"
    if len(set(picks)) > 1:
        assert doc["ops"]["all_reduce"]["crossovers"]


def test_synthetic_thousands_of_ranks(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    t0 = time.perf_counter()
    png = tmp_path / "big.png"
    assert main(["plan", "--hosts", "512", "--ranks-per-host", "8", "--switches", "8", "--nic", "400gbit",
                 "--trunk", "1600gbit", "--host", "2400gbit", "--backend", "nccl", "--op", "all_reduce",
                 "-b", "1M", "-e", "1G", "--draw", str(png)]) == 0
    assert time.perf_counter() - t0 < 30  # about 3 s on an idle 2-core machine
    text = capsys.readouterr().out
    assert "4096 ranks, 512 hosts, 8 switch(es)" in text and "of 512 hosts" in text
    assert png.stat().st_size > 10_000


def test_draw_small(tmp_path: Path) -> None:
    png = tmp_path / "t.png"
    assert main(["plan", "2x2x2", "-b", "64M", "-e", "64M", "--draw", str(png)]) == 0
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_errors(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit, match="give a topology"):
        main(["plan"])
    with pytest.raises(SystemExit, match="not both"):
        main(["plan", "2x4", "--hosts", "2"])
    assert main(["plan", "2x4x4x4"]) == 2
    assert "more than three levels" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="unknown op"):
        main(["plan", "2x4", "--op", "broadcast"])
