"""Host stages through shared memory, for CPU ranks of one host.

gloo moves even same-host bytes through loopback TCP, which on these machines
costs more CPU than the inter-host stage it should hide behind. Here the
members of a host group map one segment ([flags][slot per member]) and:
  reduce-scatter: each member copies its region into its slot; barrier; each
    reduces its own segment across all slots into place; barrier.
  all-gather: each member copies its segment into its slot; barrier; each
    copies every other member's segment out; barrier.
The barriers are monotonically increasing counters in the segment, polled
with a short sleep that backs off (8 ranks share 2 cores: spinning would
starve the very peers being waited for), and bounded by the group's timeout.

Hygiene: member 0 creates the file under /dev/shm with a name nobody can
guess (uuid4), publishes it through the store, and unlinks it as soon as every
member has mapped it, so nothing is left behind on exit or crash after set-up.
Ops of one (stage, group) run on one thread, in the order they were issued.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import timedelta

import torch
import torch.distributed as dist

from hocc.engine.reduce import reduce_into

SHM_DIR = "/dev/shm"
FLAGS_BYTES = 4096
ALIGN = 4096


class ShmGroup:
    """One host group's shared segment and its ordered worker."""

    def __init__(self, store: dist.Store, prefix: str, members: tuple[int, ...], me: int, timeout: timedelta) -> None:
        self.store, self.prefix, self.members, self.me = store, prefix, members, me
        self.n = len(members)
        self.timeout = timeout.total_seconds()
        self.gen = 0
        self.seq = 0
        self.broken: str | None = None  # after a failed op the segment's counters are out of step: fail fast
        self.capacity = 0
        self.mm: mmap.mmap | None = None
        self.buf: torch.Tensor | None = None
        self.flags: torch.Tensor | None = None
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hocc-shm")

    # -- segment -------------------------------------------------------------
    def _map(self, slot_bytes: int) -> None:
        """(Re)create the segment with slots of at least slot_bytes (collective over members)."""
        slot = -(-slot_bytes // ALIGN) * ALIGN
        size = FLAGS_BYTES + self.n * slot
        key = f"{self.prefix}/shm/{self.gen}"
        if self.me == 0:
            path = os.path.join(SHM_DIR, f"hocc-{uuid.uuid4().hex}")
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
            os.ftruncate(fd, size)
            self.store.set(key, path)
        else:
            path = self.store.get(key).decode()
            fd = os.open(path, os.O_RDWR)
        try:
            mm = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        attached = self.store.add(f"{key}/attached", 1)
        if self.me == 0:
            deadline = time.monotonic() + self.timeout
            while attached < self.n:
                if time.monotonic() > deadline:
                    os.unlink(path)
                    raise RuntimeError(f"hocc shm: only {attached} of {self.n} host peers attached within "
                                       f"{self.timeout:.0f} s")
                time.sleep(0.001)
                attached = self.store.add(f"{key}/attached", 0)
            os.unlink(path)  # everyone has it mapped: nothing stays in /dev/shm
        if self.mm is not None:
            self.mm.close()
        self.mm = mm
        self.buf = torch.frombuffer(mm, dtype=torch.uint8)
        self.flags = self.buf[:FLAGS_BYTES].view(torch.int64)
        self.capacity = slot
        self.gen += 1
        self.seq = 0
        # every member starts from zeroed flags (a fresh file is zero-filled)

    def _slot(self, i: int, nbytes: int) -> torch.Tensor:
        assert self.buf is not None
        start = FLAGS_BYTES + i * self.capacity
        return self.buf[start:start + nbytes]

    def _barrier(self) -> None:
        assert self.flags is not None
        self.seq += 1
        self.flags[self.me] = self.seq
        deadline = time.monotonic() + self.timeout
        pause = 20e-6
        while int(self.flags[: self.n].min()) < self.seq:
            if time.monotonic() > deadline:
                self.broken = f"a host peer did not reach the barrier within {self.timeout:.0f} s"
                raise RuntimeError(f"hocc shm: {self.broken} (did a rank die?)")
            time.sleep(pause)
            pause = min(pause * 2, 1e-3)

    # -- ops -----------------------------------------------------------------
    def submit(self, op: str, segs: list[torch.Tensor], reduce_op: str) -> Future[None]:
        return self._worker.submit(self._run, op, segs, reduce_op)

    def _run(self, op: str, segs: list[torch.Tensor], reduce_op: str) -> None:
        if self.broken:
            raise RuntimeError(f"hocc shm: this host group failed earlier ({self.broken}); not waiting again")
        seg_bytes = segs[0].numel() * segs[0].element_size()
        need = seg_bytes * (self.n if op == "reduce_scatter" else 1)
        if need > self.capacity:
            self._map(max(need, 2 * self.capacity))
        dtype = segs[0].dtype
        numel = segs[0].numel()
        if op == "reduce_scatter":
            mine = self._slot(self.me, need).view(dtype)
            for i, s in enumerate(segs):
                mine[i * numel:(i + 1) * numel].copy_(s)
            self._barrier()
            out = segs[self.me]
            for j in range(self.n):
                if j != self.me:
                    reduce_into(out, self._slot(j, need).view(dtype)[self.me * numel:(self.me + 1) * numel],
                                reduce_op)
            self._barrier()
        elif op == "all_gather":
            self._slot(self.me, seg_bytes).view(dtype).copy_(segs[self.me])
            self._barrier()
            for j in range(self.n):
                if j != self.me:
                    segs[j].copy_(self._slot(j, seg_bytes).view(dtype))
            self._barrier()
        else:
            raise ValueError(f"hocc shm: no {op}")

    def close(self) -> None:
        self._worker.shutdown(wait=False)
        if self.mm is not None:
            self.buf = self.flags = None
            with contextlib.suppress(BufferError):  # a tensor view is still alive; freed at exit
                self.mm.close()
            self.mm = None
