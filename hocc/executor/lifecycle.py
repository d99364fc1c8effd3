"""Where hocc meets the process's life: exit, fork and threads that must not be waited on from where
they started. Everything here uses Python's public API only.

- **Exit.** Each live call queue runs what was queued, as the peers expect, while Python can still
  serve its worker (`atexit`, and in a multiprocessing child, which ends with `os._exit` and no
  `atexit`, multiprocessing's own exit finalizers). Then the C++ side is told that Python is ending
  (`hocc._C.mark_python_ending`): a worker that took the GIL after that would be ended on the spot,
  so it skips its Python callbacks instead.
- **Fork.** A forked child has none of its parent's threads: nothing of theirs to drain or join
  (`at_fork_in_child` runs the registered resets there).
- **Hand-offs.** An engine closed where its worker may be waiting for the caller (a finalizer run by a
  collection inside the queue's lock) closes on a thread of its own (`hand_off`), joined at exit.
- **held_here**: whether this thread holds a re-entrant lock."""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
import weakref
from collections.abc import Callable
from multiprocessing import util as mp_util
from typing import Protocol

log = logging.getLogger("hocc")


class Drainable(Protocol):
    def wait_queued(self) -> None: ...  # wait for what was queued so far; the queue stays open
    def drain(self) -> None: ...  # run what was queued, then end the worker
    def cancel(self, why: str) -> None: ...  # drop what was queued
    def join(self) -> None: ...


_live: weakref.WeakSet[Drainable] = weakref.WeakSet()
_handoffs: set[threading.Thread] = set()  # threads closing engines (Engine.close's hand-off), joined at exit
_child_resets: list[Callable[[], None]] = []


def track(queue: Drainable) -> None:
    """Drain `queue` at exit (it is forgotten once collected)."""
    _live.add(queue)


def hand_off(target: Callable[[], None]) -> None:
    """Run target (an engine's close or release) on a thread of its own, which the exit hook joins:
    a thread still inside a call into C++ when the interpreter ends is ended on the spot."""

    def run() -> None:
        try:
            target()
        finally:
            _handoffs.discard(threading.current_thread())

    t = threading.Thread(target=run, name="hocc-release", daemon=True)
    _handoffs.add(t)
    t.start()


def at_fork_in_child(reset: Callable[[], None]) -> None:
    """Run `reset` in a forked child (module state that named the parent's threads or sockets)."""
    _child_resets.append(reset)


def held_here(lock: threading.RLock) -> bool:
    """Whether this thread holds `lock` (an RLock, entered with `with`, whose enter and exit are C's: Ctrl-C
    cannot leave it held). Public API only: a thread of its own tries it first (it gets it only if it is
    free), then this thread (it gets it again only if it is its own). A holder that lets go between the two
    reads as this thread: the answer errs toward True, which only makes a close hand off to a thread."""
    free: list[bool] = []

    def probe() -> None:
        if lock.acquire(blocking=False):
            free.append(True)
            lock.release()

    t = threading.Thread(target=probe, name="hocc-lock-probe")
    t.start()
    t.join()
    if free:
        return False
    if lock.acquire(blocking=False):  # held, and this thread may take it again: it is this thread's
        lock.release()
        return True
    return False


def _drain_at_exit() -> None:
    """At exit (atexit: after the program's threads have ended, before the interpreter starts
    to go): every queue runs what was queued and its worker ends while Python can still serve
    it; then the hand-off threads end. Ctrl-C drops what is left."""
    interrupted = False
    while _live or _handoffs:
        for q in list(_live):
            try:
                if interrupted:
                    q.cancel("interrupted at exit")
                    q.join()
                else:
                    q.drain()
            except KeyboardInterrupt:
                interrupted = True
            except Exception:
                log.exception("hocc: a call queue did not close at exit")
            _live.discard(q)
        for t in list(_handoffs):
            t.join(timeout=None if not interrupted else 1.0)
            _handoffs.discard(t)


def _wait_in_child() -> None:
    """A multiprocessing child's end (its exit finalizers run after its target returns, then it
    leaves with os._exit, without atexit): wait for the calls queued so far, which the peers expect.
    In the parent this runs after _drain_at_exit, with nothing left to wait for."""
    for q in list(_live):
        try:
            q.wait_queued()
        except KeyboardInterrupt:
            return
        except Exception:
            log.exception("hocc: waiting for a call queue at exit failed")


def _python_ending() -> None:
    cpp = sys.modules.get("hocc._C")  # not loaded: no worker of it to tell (and nothing to import at exit)
    if cpp is not None:
        cpp.mark_python_ending()


def _forget_parent() -> None:
    _live.clear()
    _handoffs.clear()
    for reset in _child_resets:
        try:
            reset()
        except Exception:  # one reset's failure does not keep the others from running
            log.exception("hocc: a reset after fork failed")


def _wait_at_child_exit(_: object = None) -> None:
    mp_util.Finalize(None, _wait_in_child, exitpriority=100)


class _Anchor:
    """What multiprocessing's after-fork registry keys our hook on (it holds its keys weakly)."""


_ANCHOR = _Anchor()

# atexit runs its hooks last-registered first: the C++ side hears that Python is ending after the drain
atexit.register(_python_ending)
atexit.register(_drain_at_exit)
_wait_at_child_exit()
# a multiprocessing child clears the exit finalizers it inherited or made while unpickling its target,
# then runs the after-fork hooks: there the wait is registered again
mp_util.register_after_fork(_ANCHOR, _wait_at_child_exit)
os.register_at_fork(after_in_child=_forget_parent)
