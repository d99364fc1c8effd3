"""Every runnable script in examples/ runs under torchrun on CPU, exits 0 and
prints what it promises (each example checks its own results and exits
non-zero where they are wrong)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


class Case(NamedTuple):
    ranks: int
    topology: str  # HOCC_TOPOLOGY
    args: tuple[str, ...]
    expect: tuple[str, ...]  # lines (or their beginnings) the output must hold


CASES = {
    "drop_in_calls.py": Case(4, "2x2", ("--backend", "hocc"), ("all_reduce             algo=ho_ring matches gloo",
                                                               "all calls match gloo")),
    "ddp.py": Case(4, "2x2", (), ("step 4  loss", "parameters match the single-process reference on every rank")),
    "fsdp.py": Case(4, "2x2", (), ("HSDP step 3  loss",
                                   "FSDP and HSDP parameters match the single-process reference on every rank")),
    # a small model: the point is that the script runs, not what it measures
    "paro_train.py": Case(2, "2x1", ("--strategy", "IIG", "--steps", "2", "--accum", "2", "--layers", "2", "--dim",
                                     "32", "--heads", "2", "--batch", "2", "--seq", "16", "--vocab", "64"),
                          ("step   1  loss", "# peak memory of the model states per rank")),
}
TIMEOUT_S = 120


def _runnable() -> set[str]:
    return {p.name for p in EXAMPLES.glob("*.py") if 'if __name__ == "__main__":' in p.read_text()}


def test_every_example_has_a_case() -> None:
    assert _runnable() == set(CASES), "give each runnable example in examples/ a case in CASES (and drop stale ones)"


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CASES))
def test_example_runs(name: str) -> None:
    case = CASES[name]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(case.ranks),
           str(EXAMPLES / name), *case.args]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HOCC_TOPOLOGY": case.topology}
    # a session of its own, so that a timeout ends torchrun's ranks too
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"{name} ran past {TIMEOUT_S} s:\n{out[-8000:]}")
    assert proc.returncode == 0, f"{' '.join(cmd)} exited {proc.returncode}:\n{out[-8000:]}"
    lines = out.splitlines()
    for want in case.expect:
        assert any(line.startswith(want) for line in lines), f"{name}: no line starting {want!r} in:\n{out[-8000:]}"
