"""One watchdog per engine: it spreads a failure to the whole group at once.

A transport notices a failure only where it waits: a rank whose peer died or
stopped times out on that peer, but a rank waiting on *another* healthy rank
would wait out its own timeout too. So a rank that fails publishes why on the
group's store, and every rank's watchdog, while a call of its engine has run
for a moment, looks there and aborts its transport (Transport::abort wakes
its point-to-point and shared-memory waits), so the call ends with the first
rank's reason, not a second timeout. Like ProcessGroupNCCL's watchdog, it is
a thread beside the caller; it never blocks a call (the store may be gone
with a dead rank 0: publishing happens on this thread, not the failing one)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


class Watchdog:
    def __init__(self, store: Any, key: str, rank: int, abort: Callable[[str], None],
                 busy_for: Callable[[], float], poll_s: float = 0.2) -> None:
        self.store, self.key, self.rank, self.abort = store, key, rank, abort
        self.poll_s = poll_s
        self._busy_for = busy_for  # seconds the engine's running call has run (0: none; every call is a queue item)
        self._publish: str | None = None
        self._fired = False
        self._wake = threading.Event()
        self._stop = False
        self._thread = threading.Thread(target=self._loop, name="hocc-watchdog", daemon=True)
        self._thread.start()

    def publish(self, why: str) -> None:
        """This rank failed: tell the group (from the watchdog's thread)."""
        self._publish = f"rank {self.rank}: {why}"
        self._fired = True  # our own failure: nothing to abort for
        self._wake.set()

    def close(self) -> None:
        self._stop = True
        self._wake.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def _loop(self) -> None:
        while not self._stop:
            self._wake.wait(self.poll_s)
            self._wake.clear()
            if self._stop:
                return
            if self._publish is not None:
                msg, self._publish = self._publish, None
                try:
                    if not self.store.check([self.key]):
                        self.store.set(self.key, msg)
                except Exception:  # noqa: BLE001 - the store went with a dead rank: peers time out instead
                    pass
                continue
            if self._fired or self._busy_for() < self.poll_s:
                continue
            try:
                if not self.store.check([self.key]):
                    continue
                why = self.store.get(self.key).decode(errors="replace")
            except Exception:  # noqa: BLE001 - no store, no news: the transports' own timeouts still hold
                continue
            self._fired = True
            self.abort(f"{why} (reported on the store; this rank stopped waiting)")
