"""Handing the memory glibc holds free back to the OS, as jemalloc and
tcmalloc do by themselves (jemalloc's default: dirty pages decay over 10 s).

glibc's malloc gives back only the top of its heap. A freed block between
live ones stays resident. CPU tensors of changing sizes leave such holes, and
RSS climbs though nothing more is held. bench/soak.py shows it under a fixed
MALLOC_MMAP_THRESHOLD_: over 4,500 calls the main heap grew 130 -> 183 MiB
while its blocks in use stayed at 93-95 MiB, the rest free holes of
0.5-4.5 MiB (--malloc-info); malloc_trim(0) returns them.

So one thread per process calls malloc_trim(0), at most once every
HOCC_MALLOC_TRIM_S seconds (0: never), and only after hocc CPU calls ran
since the last trim. A trim takes 1.5-4 ms of madvise here, during which it
holds each arena's lock in turn. It runs beside the calls, never inside one."""

from __future__ import annotations

import ctypes
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from hocc.executor.lifecycle import at_fork_in_child


def _malloc_trim() -> Callable[[], Any] | None:
    """glibc's malloc_trim(0), or None where the C library has none (musl, macOS)."""
    try:
        fn = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    fn.argtypes, fn.restype = [ctypes.c_size_t], ctypes.c_int
    return lambda: fn(0)


def _tell_table(noted: bool) -> None:
    """hocc.api.repeat's table (C++) calls note_cpu_call only while the trimmer needs a note."""
    cpp = sys.modules.get("hocc._C")  # not loaded: no table yet
    if cpp is not None:
        cpp.set_heap_noted(noted)


class HeapTrimmer:
    """The thread that trims: it sleeps until a call is noted, waits the
    interval (calls noted meanwhile ride along), trims, and sleeps again."""

    def __init__(self, trim: Callable[[], Any], interval_s: float) -> None:
        self.trim, self.interval_s = trim, interval_s
        self.trims = 0
        self.noted = False  # a call since the last trim was noted (a plain flag: every call reads it)
        self._called = threading.Event()  # the same, for the thread to wait on
        self._thread = threading.Thread(target=self._loop, name="hocc-malloc-trim", daemon=True)
        self._thread.start()

    def note_call(self, interval_s: float) -> None:
        self.interval_s = interval_s
        if not self.noted:  # set() takes a lock: the calls between two trims but the first skip it
            self.noted = True
            _tell_table(True)
            self._called.set()

    def _loop(self) -> None:
        while True:
            self._called.wait()  # idle: no wake-ups while no hocc call runs
            time.sleep(self.interval_s)
            self._called.clear()
            _tell_table(False)  # first: a call between the two finds noted still set, and the next sets both
            self.noted = False  # after the clear: a call noted between the two sets it again
            self.trim()
            self.trims += 1


_trimmer: HeapTrimmer | None = None
_no_trim = False  # this C library has no malloc_trim
_lock = threading.Lock()


def note_cpu_call(interval_s: float) -> None:
    """A hocc CPU call is made: the heap is trimmed within `interval_s` seconds of it (<= 0: not at all)."""
    global _trimmer, _no_trim
    t = _trimmer
    if t is not None and t.noted and interval_s > 0:  # most calls: one read
        t.interval_s = interval_s
        return
    if interval_s <= 0 or _no_trim:
        _tell_table(True)  # nothing to note (a change of settings makes the table ask again)
        return
    if t is None:  # first call, or a forked child's (the thread stayed in the parent: _forked)
        with _lock:
            t = _trimmer
            if t is None:
                trim = _malloc_trim()
                if trim is None:
                    _no_trim = True
                    _tell_table(True)
                    return
                t = _trimmer = HeapTrimmer(trim, interval_s)
    t.note_call(interval_s)


def _forked() -> None:
    global _trimmer, _lock
    _trimmer, _lock = None, threading.Lock()  # the parent's thread is not in the child; its lock may be held
    _tell_table(False)


at_fork_in_child(_forked)  # hocc's one place for fork and exit (hocc/executor/lifecycle.py)


def trims() -> int:
    """How many trims this process has made (for tests and diagnosis)."""
    t = _trimmer
    return t.trims if t is not None else 0
