"""Host stages through shared memory, for CPU ranks of one host (issue 7).

The data path is C++ (hocc._C.ShmComm, csrc/transport/shm.h): pieces stream
through one segment per host group, reductions are vectorized loops, and
waiting ranks sleep in the kernel (futex) instead of spinning, as 8 ranks may
share 2 cores. This module sets the segment up and orders the ops:

Hygiene: member 0 creates the file under /dev/shm with a name nobody can
guess (uuid4), publishes it through the store, and unlinks it as soon as every
member has mapped it, so nothing is left behind on exit or crash after set-up.
Two groups, or two jobs, on one host never share a segment. Ops of one
(stage, group) run on one thread, in the order they were issued.
"""

from __future__ import annotations

import os
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from hocc.native import load

SHM_DIR = "/dev/shm"


class ShmGroup:
    """One host group's shared segment and its ordered worker."""

    def __init__(self, store: dist.Store, prefix: str, members: tuple[int, ...], me: int, timeout: timedelta,
                 piece_bytes: int, wait: str) -> None:
        self.store, self.prefix, self.members, self.me = store, prefix, members, me
        self.n = len(members)
        self.timeout = timeout.total_seconds()
        self.piece_bytes, self.wait = piece_bytes, wait
        self.comm: Any = None
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hocc-shm")

    def _attach(self) -> None:
        """Map the group's segment (collective over the members, on first use)."""
        c = load()
        size = c.ShmComm.segment_bytes(self.n, self.piece_bytes)
        key = f"{self.prefix}/shm"
        if self.me == 0:
            path = os.path.join(SHM_DIR, f"hocc-{uuid.uuid4().hex}")
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
            try:
                os.ftruncate(fd, size)
            finally:
                os.close(fd)
            self.store.set(key, path)
        else:
            path = self.store.get(key).decode()
        try:
            self.comm = c.ShmComm(path, self.me, self.n, self.piece_bytes, self.timeout, self.wait)
        finally:
            attached = self.store.add(f"{key}/attached", 1)
            if self.me == 0:
                self._unlink_when_attached(path, attached)

    def _unlink_when_attached(self, path: str, attached: int) -> None:
        deadline = time.monotonic() + self.timeout
        try:
            while attached < self.n:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"hocc shm: only {attached} of {self.n} host peers attached within "
                                       f"{self.timeout:.0f} s (did a rank die?)")
                time.sleep(0.001)
                attached = self.store.add(f"{self.prefix}/shm/attached", 0)
        finally:
            os.unlink(path)  # everyone has it mapped (or gave up): nothing stays in /dev/shm

    def submit(self, op: str, work: torch.Tensor, offset: int, seg: int, reduce_op: str,
               source: torch.Tensor | None = None) -> Future[None]:
        """Run `op` on work's region at `offset` (segments of `seg` elements);
        an all-reduce may read its input from `source` (same offsets) instead."""
        return self._worker.submit(self._run, op, work, offset, seg, reduce_op, source)

    def _run(self, op: str, work: torch.Tensor, offset: int, seg: int, reduce_op: str,
             source: torch.Tensor | None) -> None:
        if self.comm is None:
            self._attach()
        ptr = work.data_ptr() + offset * work.element_size()
        dtype = str(work.dtype).removeprefix("torch.")
        if op == "all_reduce":
            src = source.data_ptr() + offset * source.element_size() if source is not None else 0
            self.comm.all_reduce(ptr, seg, dtype, reduce_op, src)
        elif op == "reduce_scatter":
            self.comm.reduce_scatter(ptr, seg, dtype, reduce_op)
        elif op == "all_gather":
            self.comm.all_gather(ptr, seg, dtype)
        else:
            raise ValueError(f"hocc shm: no {op}")

    def close(self) -> None:
        # wait for an op in flight (a stuck one ends within the group's timeout):
        # dropping the comm unmaps the segment it is using
        self._worker.shutdown(wait=True)
        self.comm = None
