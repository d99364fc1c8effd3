"""The fault matrix (bench/faults.py): a rank killed, stopped, raising, or its
emulated host's link cut, during a host or a rail stage, with shm or net host
stages. In every cell every surviving rank raises within timeout + 10 s, a
later call raises at once, the caller's tensor is unchanged, no survivor
crashes and /dev/shm is clean."""

from __future__ import annotations

import fcntl
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from hocc.bench import faults

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent

TIMEOUT_S = 3.0


def _explain(results: list[dict[str, Any]]) -> str:
    bad = [r for r in results if not r["passed"]]
    return faults.table(results, TIMEOUT_S) + "".join(
        f"\n{r['cell']}: {json.dumps(r['ranks'])[:1500]}"
        + "".join(f"\n{r['cell']} rank {k} stderr: {v}" for k, v in r["stderr"].items()) for r in bad)


def test_local_faults() -> None:
    results = faults.run_matrix(TIMEOUT_S, 65536, with_cut=False)
    assert len(results) == 12
    assert all(r["passed"] for r in results), _explain(results)
    for r in results:  # a survivor's message says what failed, where, and how to recover
        assert "all_reduce of 65536 float32" in r["example"] and "create it again" in r["example"], r["example"]


@contextmanager
def _bench_lock() -> Iterator[None]:
    """One emulated cluster at a time on this machine (bench scripts take the same lock)."""
    with open("/tmp/hocc-bench.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


@pytest.mark.root
def test_link_cut_on_the_emulated_cluster() -> None:
    with _bench_lock():
        # two of the four cells (bench/faults.py runs all): a cut during the host stage with shm,
        # and during the rail stage with net host stages
        cut = [c for c in faults.cells(with_cut=True) if c.fault == "cut"
               and (c.where, c.transport) in (("host", "shm"), ("rail", "net"))]
        results = [faults.run_cell(c, TIMEOUT_S, 65536) for c in cut]
    assert len(results) == 2
    assert all(r["passed"] for r in results), _explain(results)
