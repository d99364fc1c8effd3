"""An engine's queue of calls: every call is one of its items, a plan run,
run in the order the calls were made (csrc/executor/call_queue.h). A sync call
runs its item on the caller's own thread when nothing is queued or running
(run_here: no hand-off); otherwise, and for every async call, one C++ worker
thread runs it (push_run).

A plain run goes from the caller to the executor with no Python in between:
an async call through a Python worker thread paid a handoff under the GIL on
every call, about 100 us on one rank where the call itself costs 25 us. What
a call needs of Python around its run (a plan's first set-up, a tuning trial,
HOCC_CHECK=all, trace, a GPU call's stream and event) is the run's `around`:
around(run, queued) calls run() (the executor's run, without the GIL) once,
so every call is the same run, in the same order, failing the same way. Each
pushed item has a Ticket: the future its Work waits on. Exit and fork:
hocc/executor/lifecycle.py."""

from __future__ import annotations

import logging
import threading
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any

from hocc.engine.errors import CollectiveError, drop_frame_locals
from hocc.executor import load
from hocc.executor.lifecycle import held_here, track

log = logging.getLogger("hocc")

_DONE, _DROPPED, _TIMED_OUT = 0, 1, 2  # CallQueue::Wait

# around(run, queued): a call's Python around its plan run (see above); queued: on the worker, its value the
# ticket's result
Around = Callable[[Callable[[], None], bool], Any]


class Ticket:
    """One queued item's outcome: the part of concurrent.futures.Future that
    hocc.engine.work.Work uses (result, done, exception, add_done_callback)."""

    __slots__ = ("_exc", "_queue", "_result", "context", "n")

    def __init__(self, queue: CallQueue, context: Any) -> None:
        self._queue = queue
        self.n = -1  # the item's ticket number, once pushed
        self.context = context  # what the run reads (tensors, plan) and what a failure names: kept until done
        self._result: Any = None
        self._exc: BaseException | None = None

    def done(self) -> bool:
        c = self._queue.cpp
        if self._exc is not None or c.completed > self.n or c.dropped(self.n):
            self.context = None  # the run has ended: its tensors go with the caller's last reference
            return True
        return False

    def run_if_next(self) -> None:
        """Run the item on this thread if it is next and the worker has not begun it: a caller that waits
        at once (a sync call made through an async API) pays no hand-off to the worker and back."""
        if self._exc is None and self.n >= 0:
            self._queue.cpp.run_queued_here(self.n)

    def _wait(self, timeout: float | None) -> None:
        if self._exc is None:
            if timeout is None:  # a wait with a bound returns at it: it never takes the call on itself
                self.run_if_next()
            state = self._queue.cpp.wait(self.n, -1.0 if timeout is None else timeout)
            if state == _TIMED_OUT:
                raise TimeoutError(f"hocc: the call did not end within {timeout} s")
            if state == _DROPPED and self._exc is None:
                self._exc = self._queue.dropped_error(self)
        self.context = None  # ended: nothing of the run needs to stay
        drop_frame_locals(self._exc)  # the worker's frames have ended by now

    def result(self, timeout: float | None = None) -> Any:
        self._wait(timeout)
        if self._exc is not None:
            raise self._exc
        return self._result

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """The call's error, without raising it: a raise would add this caller's frames to its traceback,
        and a torch Future given the error (Work.get_future) would then keep those frames, and through
        them itself, where the garbage collector cannot see (a failed group's comms never freed)."""
        self._wait(timeout)
        return self._exc

    def add_done_callback(self, fn: Callable[[Ticket], None]) -> None:
        """fn(self) once done: at once if it is, else on the worker right after the item."""
        if self._queue.later(self, fn):
            return
        fn(self)


def _weakly(method: Callable[..., Any]) -> Callable[..., Any]:
    """A function calling `method` while its object lives: the C++ queue holds its callbacks
    where the garbage collector cannot see them, so they must not keep the engine alive."""
    ref = weakref.WeakMethod(method)

    def call(*args: Any) -> Any:
        m = ref()
        return m(*args) if m is not None else None

    return call


class CallQueue:
    """on_failed(ticket, error) -> the exception a failed plan run raises, from
    hocc._C's (HoccNativeError or HoccMismatchError, with the failure's fields;
    called on the worker, holding the GIL); dropped_error(ticket) ->
    the exception of an item cancel() dropped.

    A collection can start wherever a thread holds self._lock and run a
    finalizer that closes this queue's engine; joining the worker there could
    wait for the worker waiting for that lock, so Engine.close hands off to a
    thread when held_here()."""

    def __init__(self, on_failed: Callable[[Ticket, Exception], BaseException],
                 dropped_error: Callable[[Ticket], BaseException]) -> None:
        self._on_failed = on_failed
        self.dropped_error = dropped_error
        self.cpp = load().CallQueue(_weakly(self._failed), _weakly(self._done))
        self._pending: deque[Ticket] = deque()  # pushed and maybe not done, oldest first
        self._callbacks: dict[int, list[tuple[Ticket, Callable[[Ticket], None]]]] = {}
        self._lock = threading.RLock()  # entered in C: Ctrl-C cannot leave it held
        track(self)

    @property
    def on_worker(self) -> bool:
        return bool(self.cpp.on_worker)

    def held_here(self) -> bool:
        """Whether this thread holds the queue's lock: a collection that started under it (a finalizer
        closing this engine) must not wait for the worker, which may be waiting for that lock."""
        return held_here(self._lock)

    def busy_for(self) -> float:
        return float(self.cpp.busy_for())

    def push_run(self, executor: Any, plan: Any, inp: Any, out: Any, dtype: str, op: str,
                 call: tuple[int, int, int, str, str] | None, seq: int, context: Any,
                 around: Around | None = None) -> Ticket:
        """Executor.run of `plan` on the worker, within around(run, True) if given (its value is the
        ticket's result); `context` (which must hold the tensors and the plan) is kept until it is done."""
        def push(t: Ticket) -> int:
            wrapped = None
            if around is not None:
                def wrapped(run: Callable[[], None]) -> None:
                    t._result = around(run, True)

            return int(self.cpp.push_run(executor, plan, inp.data_ptr(), out.data_ptr(), dtype, op, call, seq,
                                         wrapped))

        return self._pushed(context, push)

    def push_prepared(self, run: Any, inp: Any, out: Any, seq: int, context: Any) -> Ticket:
        """A prepared call's run (hocc._C.PreparedRun) on the worker, as push_run's."""
        return self._pushed(context, lambda _: int(run.push(inp.data_ptr(), out.data_ptr(), seq)))

    def _pushed(self, context: Any, push: Callable[[Ticket], int]) -> Ticket:
        """The Ticket of the item push(ticket) queues (returning its number), kept until it is done."""
        t = Ticket(self, context)
        with self._lock:
            self._forget_done()
            t.n = push(t)
            self._pending.append(t)
        return t

    def run_here(self, executor: Any, plan: Any, inp: Any, out: Any, dtype: str, op: str,
                 call: tuple[int, int, int, str, str] | None, seq: int, around: Around | None = None) -> bool:
        """A sync call's Executor.run of `plan` on this thread, without the GIL (within around(run, False)
        if given), if the queue is idle: True once it ran (a failure raises hocc._C's HoccNativeError or
        HoccMismatchError, or what `around` raised); False if not (nothing done: push_run it)."""
        wrapped = None if around is None else (lambda run: around(run, False))
        return bool(self.cpp.run_here(executor, plan, inp.data_ptr(), out.data_ptr(), dtype, op, call, seq, wrapped))

    def _forget_done(self) -> None:
        done = self.cpp.completed
        while self._pending and self._pending[0].n < done:
            self._pending.popleft().context = None

    # -- on the worker, holding the GIL --------------------------------------------
    def _failed(self, n: int, error: Exception) -> None:
        t = None
        with self._lock:
            for p in self._pending:  # not done, so still here
                if p.n == n:
                    t = p
                    break
        if t is None:
            return
        try:
            t._exc = self._on_failed(t, error)
        except BaseException as e:  # noqa: BLE001 - the run failed whatever went wrong in naming it
            self.cpp.mark_failed()
            t._exc = CollectiveError(f"hocc: a queued call failed: {error} (and reporting it raised: {e!r})")

    def _done(self, completed: int) -> None:
        self._run_callbacks(lambda n: n < completed)

    def _run_callbacks(self, ready: Callable[[int], bool]) -> None:
        calls: list[tuple[Ticket, Callable[[Ticket], None]]] = []
        with self._lock:  # on the worker: a collection here closes other engines' queues, never this one
            for n in sorted(self._callbacks):
                if ready(n):
                    calls.extend(self._callbacks.pop(n))
            while self._callbacks:  # re-arm for the lowest ticket still awaited
                n = min(self._callbacks)
                if self.cpp.watch(n):
                    break
                calls.extend(self._callbacks.pop(n))  # done meanwhile
        for t, fn in calls:
            try:
                fn(t)
            except Exception:
                log.exception("hocc: a callback of a finished call raised")

    def later(self, t: Ticket, fn: Callable[[Ticket], None]) -> bool:
        """Keep fn for when t is done; False if t already is (the caller runs fn)."""
        entry = (t, fn)
        fresh = [entry]  # made before the lock: no collection can start while it is held
        with self._lock:
            if t._exc is not None or not self.cpp.watch(t.n):
                return False
            held = self._callbacks.get(t.n)
            if held is None:
                self._callbacks[t.n] = fresh
            else:
                held.append(entry)
            return True

    # -- teardown ---------------------------------------------------------------------
    def close(self) -> None:
        """Run what is queued, then stop the worker (not from the worker itself)."""
        self.cpp.close()
        with self._lock:
            self._forget_done()

    def wait_queued(self) -> None:
        """Wait for every call queued so far, in slices (Ctrl-C ends the wait)."""
        last = self.cpp.pushed - 1
        if last >= 0 and not self.on_worker:
            self.cpp.wait(last, -1.0)

    def drain(self) -> None:
        """close(), waiting for the queued calls first."""
        self.wait_queued()
        self.close()

    def cancel(self, why: str) -> None:
        """Drop what has not begun (each raises dropped_error()); the worker stops after its item."""
        first = self.cpp.cancel(why)
        with self._lock:
            dropped = [t for t in self._pending if t.n >= first]
            while self._pending and self._pending[-1].n >= first:  # never run: nothing of theirs stays
                self._pending.pop()
        for t in dropped:
            if t._exc is None:
                t._exc = self.dropped_error(t)
            t.context = None
        self._run_callbacks(lambda n: n >= first)

    def join(self) -> None:
        """Wait for the worker to stop (after close or cancel); not from the worker itself."""
        self.cpp.join()

    def mark_failed(self) -> None:
        """Plan runs not yet begun fail without running (on_failed answers for them)."""
        self.cpp.mark_failed()
