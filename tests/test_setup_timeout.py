"""A rank that never comes to a group's first hocc call, on a group whose
store the caller made (a FileStore, whose own timeout is minutes): its peer
raises a CollectiveError naming it within the group's timeout, not the
store's. Found by bench/gpu_check.sh on a GPU (a 2-rank NCCL group, rank 1
absent: hocc.all_reduce hung until killed); the same path on gloo here."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

RANK = r'''
import os, sys, time
from datetime import timedelta
import torch, torch.distributed as dist
import hocc
rank, path = int(sys.argv[1]), sys.argv[2]
dist.init_process_group("gloo", store=dist.FileStore(path, 2), rank=rank, world_size=2,
                        timeout=timedelta(seconds=3))
if rank == 1:  # in the group, but never makes the call
    time.sleep(60)
    os._exit(0)
x = torch.ones(4)
try:
    hocc.all_reduce(x)
    print("RETURNED")
except hocc.CollectiveError as e:
    print("RAISED", "rank(s) [1]" in str(e), bool((x == 1).all()))
sys.stdout.flush()
os._exit(0)
'''


@pytest.mark.slow
def test_absent_rank_raises_within_the_group_timeout_on_a_caller_store(tmp_path: Path) -> None:
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    store = str(tmp_path / "store")
    absent = subprocess.Popen([sys.executable, str(script), "1", store])
    try:
        start = time.monotonic()
        out = subprocess.run([sys.executable, str(script), "0", store], capture_output=True, text=True,
                             timeout=50, check=False)
        secs = time.monotonic() - start
    finally:
        absent.kill()
        absent.wait()
    assert "RAISED True True" in out.stdout, out.stdout + out.stderr  # named, and the tensor untouched
    assert secs < 40, f"rank 0 took {secs:.0f} s (group timeout 3 s; the store's own is 300 s)"
