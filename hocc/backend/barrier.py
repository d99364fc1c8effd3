"""The hocc backend's barrier: the inner backend's (gloo's or NCCL's), with a
failure that says what happened. gloo alone says "Wait timeout" (the inner
group was still being set up) or "Timed out waiting 2000ms for recv"; neither
names the group or the member that never came. So each member notes, on the
group's store, the number of the last barrier it entered (one key per
member, overwritten: nothing accumulates), and a failed barrier reads those
keys to name who did not arrive."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from hocc.engine.errors import CollectiveError


class BarrierLog:
    """Who entered which barrier of one group (its keys live on the group's store)."""

    def __init__(self, store: dist.Store, rank: int, size: int) -> None:
        self.store, self.rank, self.size = store, rank, size
        self.count = 0

    def enter(self) -> int:
        """Note that this member entered its next barrier; returns the barrier's number."""
        self.count += 1
        self.store.set(self._key(self.rank), str(self.count))
        return self.count

    def absent(self, number: int) -> list[int] | None:
        """The members that have not entered barrier `number` (None: the store did not answer)."""
        try:
            return [r for r in range(self.size) if r != self.rank and self._entered(r) < number]
        except Exception:  # noqa: BLE001 - a store gone with a dead rank 0: who arrived is unknown
            return None

    def _entered(self, r: int) -> int:
        key = self._key(r)
        return int(self.store.get(key)) if self.store.check([key]) else 0

    @staticmethod
    def _key(r: int) -> str:
        return f"hocc-barrier/{r}"


def barrier_error(where: str, global_ranks: list[int], log: BarrierLog, number: int, started: float,
                  timeout: timedelta, cause: Exception) -> CollectiveError:
    """What a failed barrier raises: the group, how long it waited against its
    timeout, who never arrived, the inner backend's own words, and what to do."""
    absent = log.absent(number)
    if absent is None:
        who = "who arrived is unknown (the group's store did not answer: the rank hosting it may be gone)"
    elif absent:
        names = ", ".join(str(r) if global_ranks[r] == r else f"{r} (global rank {global_ranks[r]})" for r in absent)
        who = (f"rank{'s' if len(absent) > 1 else ''} {names} never arrived (stopped, gone, or not calling "
               "this barrier)")
    else:
        who = "every member arrived, so the connection between them failed"
    return CollectiveError(
        f"hocc: barrier on {where} failed after {time.monotonic() - started:.1f} s (the group's timeout is "
        f"{timeout.total_seconds():.1f} s): {who}. The inner backend said: {cause}. The group is no longer "
        "usable: destroy it and create it again (dist.destroy_process_group() and init_process_group(), or "
        "dist.new_group() again for a sub-group)", collective="barrier", group=where)


class BarrierWork(dist.Work):
    """The inner barrier's Work, whose wait() raises hocc's error in place of the inner one."""

    def __init__(self, work: dist.Work, on_error: Callable[[Exception], CollectiveError]) -> None:
        super().__init__()
        self._work, self._on_error = work, on_error

    def wait(self, timeout: timedelta | None = None) -> bool:
        try:
            return bool(self._work.wait(timeout) if timeout is not None else self._work.wait())
        except CollectiveError:
            raise
        except Exception as e:
            raise self._on_error(e) from e

    def is_completed(self) -> bool:
        return bool(self._work.is_completed())

    def is_success(self) -> bool:
        return bool(self._work.is_success())

    def get_future(self) -> Any:
        return self._work.get_future()
