"""hocc/engine/heap.py: after hocc CPU calls, the memory glibc holds free
goes back to the OS within HOCC_MALLOC_TRIM_S; with no calls, nothing runs."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

import pytest

from hocc.config import Config
from hocc.engine import heap


def _rss_mib() -> float:
    return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _wait_for(cond: Callable[[], bool], seconds: float) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.02)
    return False


def test_setting() -> None:
    assert Config().malloc_trim_s == 1.0
    assert Config.from_env({"HOCC_MALLOC_TRIM_S": "0"}).malloc_trim_s == 0.0
    assert Config.from_env({"HOCC_MALLOC_TRIM_S": "2.5"}).malloc_trim_s == 2.5
    for bad in ("soon", "-1", "nan", "inf"):
        with pytest.raises(ValueError, match="HOCC_MALLOC_TRIM_S"):
            Config.from_env({"HOCC_MALLOC_TRIM_S": bad})


def test_free_holes_go_back_after_calls_and_nothing_runs_without_calls() -> None:
    heap.note_cpu_call(0)  # off: no thread, no trim
    assert heap.trims() == 0 and not any(t.name == "hocc-malloc-trim" for t in threading.enumerate())
    # holes in glibc's heap: 100 KB blocks (below its mmap threshold), every other one freed, so no
    # two free blocks touch and none is at the top: glibc keeps them resident by itself
    blocks = [b"\x01" * 100_000 for _ in range(600)]
    del blocks[::2]
    time.sleep(0.3)
    before = _rss_mib()
    heap.note_cpu_call(0.05)
    assert _wait_for(lambda: heap.trims() >= 1, 5.0), "no trim within 5 s of a call"
    assert before - _rss_mib() > 15, f"RSS {before:.0f} -> {_rss_mib():.0f} MiB: ~29 MiB of holes not given back"
    done = heap.trims()
    time.sleep(0.3)
    assert heap.trims() == done, "the trimmer ran again with no call since"
    assert len(blocks) == 300
