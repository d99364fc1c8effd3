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

pytestmark = pytest.mark.slow

SUITE = Path(__file__).parent / "torch_suite"


# torch's test_barrier_timeout_group needs 8 ranks (it skips below) and 36 s here: it passes, but is
# left out of make test for time (`WORLD_SIZE=8 .venv/bin/python tests/torch_suite/dist_suite.py
# -k test_barrier_timeout_group`); tests/test_barrier.py checks a sub-group's barrier in 3 ranks.
@pytest.mark.parametrize(("world", "test"), [
    (4, "test_barrier_timeout_global"),
    (4, "test_barrier_timeout_full_group"),
])
def test_torch_barrier_timeout(world: int, test: str, tmp_path: Path) -> None:
    env = dict(os.environ, WORLD_SIZE=str(world), TEMP_DIR=str(tmp_path), SUITE_BACKEND="hocc")
    done = subprocess.run([sys.executable, str(SUITE / "dist_suite.py"), "-v", "-k", test], env=env,
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    ran = f"{test} (" in out and "Ran 1 test" in out
    assert ran and re.search(r"^OK$", out, re.M), out[-4000:]  # a skip ends "OK (skipped=1)"
