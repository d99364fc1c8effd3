"""Host stages through shared memory, for CPU ranks of one host (issue 7).

The data path is C++ (hocc._C.ShmComm, csrc/transport/shm.h): pieces stream
through one segment per host group, reductions are vectorized loops, and
waiting ranks sleep in the kernel (futex) instead of spinning, as 8 ranks may
share 2 cores. This module sets the segment up.

Hygiene: member 0 creates the file under /dev/shm with a name nobody can
guess (uuid4) behind its own pid (so a file left by a crash during set-up says
whose it was), publishes it through the store, and unlinks it as soon as every
member has mapped it, so nothing is left behind on exit or crash after set-up.
Two groups, or two jobs, on one host never share a segment.
"""

from __future__ import annotations

import os
import time
import uuid
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from hocc.executor import load

SHM_DIR = "/dev/shm"


def attach_shm(store: dist.Store, key: str, me: int, n: int, timeout: timedelta, piece_bytes: int,
               wait: str) -> Any:
    """Map one host group's segment (collective over its n members) and return
    its ShmComm."""
    c = load()
    secs = timeout.total_seconds()
    size = c.ShmComm.segment_bytes(n, piece_bytes)
    if me == 0:
        path = os.path.join(SHM_DIR, f"hocc-{os.getpid()}-{uuid.uuid4().hex}")
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            os.ftruncate(fd, size)
        finally:
            os.close(fd)
        store.set(key, path)
    else:
        store.wait([key], timeout)  # the group's timeout, not the store's own
        path = store.get(key).decode()
    try:
        comm = c.ShmComm(path, me, n, piece_bytes, secs, wait)
    finally:
        attached = store.add(f"{key}/attached", 1)
        if me == 0:
            _unlink_when_attached(store, key, path, attached, n, secs)
    return comm


def _unlink_when_attached(store: dist.Store, key: str, path: str, attached: int, n: int, secs: float) -> None:
    deadline = time.monotonic() + secs
    try:
        while attached < n:
            if time.monotonic() > deadline:
                raise RuntimeError(f"hocc shm: only {attached} of {n} host peers attached within "
                                   f"{secs:.0f} s (did a rank die?)")
            time.sleep(0.001)
            attached = store.add(f"{key}/attached", 0)
    finally:
        os.unlink(path)  # everyone has it mapped (or gave up): nothing stays in /dev/shm
