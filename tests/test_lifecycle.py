"""hocc/executor/lifecycle.py: exit, fork and the queue lock's owner, with Python's public API only.
(A main process that exits with calls queued: tests/test_queue.py::test_calls_queued_at_exit_still_run.)"""

from __future__ import annotations

import ast
import multiprocessing as mp
import os
import re
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest

from hocc.bench.launch import free_port
from hocc.executor import lifecycle

ROOT = Path(__file__).resolve().parent.parent


def test_the_queue_lock_knows_its_owner() -> None:
    lock = threading.RLock()
    assert not lifecycle.held_here(lock)
    seen: list[bool] = []
    with lock:
        with lock:  # re-entrant
            assert lifecycle.held_here(lock)
        assert lifecycle.held_here(lock)
        t = threading.Thread(target=lambda: seen.append(lifecycle.held_here(lock)))
        t.start()
        t.join()
    assert seen == [False] and not lifecycle.held_here(lock)
    with lock:  # held_here takes nothing away: the lock is still held once, and then free
        lifecycle.held_here(lock)
    assert lock.acquire(blocking=False)
    lock.release()


def test_a_forked_child_forgets_its_parents_threads() -> None:
    """In a forked child the registered resets run and no queue or hand-off of the parent is left."""
    ran: list[int] = []
    lifecycle.at_fork_in_child(lambda: ran.append(os.getpid()))
    lifecycle.hand_off(lambda: time.sleep(0.5))  # a parent's thread, alive across the fork
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report, then leave without the parent's exit hooks
        ok = ran == [os.getpid()] and not lifecycle._handoffs and not lifecycle._live
        os.write(w, b"1" if ok else b"0")
        os._exit(0)
    os.close(w)
    got = os.read(r, 1)
    os.waitpid(pid, 0)
    os.close(r)
    lifecycle._child_resets.pop()
    assert got == b"1" and not ran


_KEPT: list[object] = []


def _child_rank(rank: int, port: int, out: mp.Queue) -> None:
    """A multiprocessing child's rank. Rank 0 returns with async calls queued: multiprocessing ends it
    with os._exit, without atexit; its exit finalizer must run them first, or rank 1 waits for ever."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), HOCC_TOPOLOGY="2", HOCC_ALGO="ring")
    import torch
    import torch.distributed as dist

    import hocc

    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=timedelta(seconds=30))
    hocc.all_reduce(torch.ones(1 << 12))
    dist.barrier()
    if rank == 0:
        ts = [torch.full((1 << 12,), float(i)) for i in range(8)]
        _KEPT.extend(hocc.all_reduce(t, async_op=True) for t in ts)  # kept: a collected Work would wait here
        out.put(("queued", [w is not None for w in _KEPT]))
        from multiprocessing import util  # its registry, as it stands after this child's start cleared it

        out.put(("hooked", any(f._callback is lifecycle._wait_in_child for f in util._finalizer_registry.values())))
        return  # not waited for, not destroyed
    time.sleep(0.5)
    sums = []
    for i in range(8):
        t = torch.full((1 << 12,), float(i))
        hocc.all_reduce(t)
        sums.append(float(t[0]))
    out.put(("sums", sums))


def test_a_multiprocessing_child_runs_its_queued_calls() -> None:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_child_rank, args=(r, port, out)) for r in range(2)]
    for p in procs:
        p.start()
    got = dict(out.get(timeout=120) for _ in range(3))
    for p in procs:
        p.join(timeout=60)
    assert [p.exitcode for p in procs] == [0, 0]
    assert got["queued"] == [True] * 8 and got["sums"] == [2.0 * i for i in range(8)], got
    assert got["hooked"], "the exit wait is not among the child's multiprocessing finalizers"


def test_no_private_python_api() -> None:
    """Exit, fork and lock ownership through public API: no threading._*, RLock._is_owned, or _Py_* C calls."""
    for path in (ROOT / "hocc").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
                base = node.value
                if isinstance(base, ast.Name) and base.id == "threading":
                    pytest.fail(f"{path.relative_to(ROOT)}:{node.lineno}: {base.id}.{node.attr} is private")
                if node.attr in ("_is_owned", "_register_atexit"):
                    pytest.fail(f"{path.relative_to(ROOT)}:{node.lineno}: .{node.attr} is private")
    for path in (ROOT / "csrc").rglob("*.[ch]*"):
        hit = re.search(r"\b_Py[A-Z]\w*", path.read_text())
        assert hit is None, f"{path.relative_to(ROOT)}: {hit.group(0)} is CPython's private API"
