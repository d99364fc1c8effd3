"""torch's own tests on the hocc backend, in torch's own harness (a subprocess
each: the harness spawns its ranks and reports through unittest). Each must
pass, not be skipped: a skip would prove nothing."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

SUITE = Path(__file__).parent / "torch_suite"


@pytest.mark.parametrize(("world", "test"), [
    (4, "test_barrier_timeout_global"),
    (4, "test_barrier_timeout_full_group"),
    (8, "test_barrier_timeout_group"),  # torch skips it below 8 ranks
])
def test_torch_barrier_timeout(world: int, test: str, tmp_path: Path) -> None:
    env = dict(os.environ, WORLD_SIZE=str(world), TEMP_DIR=str(tmp_path))
    done = subprocess.run([sys.executable, str(SUITE / "barrier_timeout.py"), "-v", "-k", test], env=env,
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    ran = f"{test} (" in out and "Ran 1 test" in out
    assert ran and re.search(r"^OK$", out, re.M), out[-4000:]  # a skip ends "OK (skipped=1)"
