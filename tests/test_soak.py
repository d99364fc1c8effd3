"""A short soak (bench/soak.py): 300 mixed collectives up to 1 MiB on 4 ranks
(2x2, shared memory on the host stage), every op x algo, sync and async, the
world and its host and rail sub-groups; results checked against
torch.distributed every 10 calls; fds and threads must not grow after the
warm-up, and RSS must stay within a loose bound (the full 10,000-call soak
with its 5% bound is bench/results/soak/)."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]


def test_short_soak(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "soak.py"), "--calls", "300", "--max-bytes", "1M",
                           "--sample-every", "20", "--check-every", "10", "--rss-tol", "0.25", "--out",
                           str(tmp_path)], env=env, capture_output=True, text=True, timeout=600)
    summary = json.loads((tmp_path / "soak.json").read_text())
    assert summary["failures"] == [], summary["failures"]
    for rank, s in summary["ranks"].items():
        assert s["fds_max"] == s["fds_warm"], f"rank {rank}: fds grew after warm-up: {s}"
        assert s["threads_max"] == s["threads_warm"], f"rank {rank}: threads grew after warm-up: {s}"
        assert s["rss_spread"] <= 0.25, f"rank {rank}: RSS moved {100 * s['rss_spread']:.0f}% after warm-up"
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    with open(tmp_path / "soak.csv") as f:
        rows = list(csv.DictReader(f))
    assert {int(r["rank"]) for r in rows} == {0, 1, 2, 3}
    assert max(int(r["call"]) for r in rows) == 300
    assert (tmp_path / "soak.png").stat().st_size > 0 and "Verdict: flat" in (tmp_path / "soak.md").read_text()
