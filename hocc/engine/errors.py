"""What a failed collective raises. Both are RuntimeErrors, as torch.distributed's
own failures are, and carry what the message says as attributes too."""

from __future__ import annotations

import traceback
from dataclasses import dataclass

from hocc.executor import load


class CollectiveError(RuntimeError):
    """A collective failed on this rank: a peer died, stopped or timed out, the
    network failed, or the ranks' calls did not match. The group is unusable
    from then on: every later call on it raises this at once; destroy it and
    create it again (dist.destroy_process_group() then init_process_group(), or
    dist.new_group() again for a sub-group)."""

    def __init__(self, message: str, *, collective: str = "", group: str = "", at: FailedStep | None = None) -> None:
        super().__init__(message)
        self.collective = collective
        self.group = group
        self.at = at  # the step of the plan that failed, None where the failure was outside every step

    # the failed step's fields, for code that handles failures (None outside every step)
    @property
    def stage(self) -> int | None:
        return None if self.at is None else self.at.stage

    @property
    def tier(self) -> str | None:
        return None if self.at is None else self.at.tier

    @property
    def chunk(self) -> int | None:
        return None if self.at is None else self.at.chunk

    @property
    def peers(self) -> tuple[int, ...]:
        return () if self.at is None else self.at.ranks

    @property
    def cause(self) -> str:
        return str(self) if self.at is None else self.at.cause


@dataclass(frozen=True)
class FailedStep:
    """Where in its plan a call failed, from the executor's error fields (csrc/core/types.h's Where): the
    step's stage, the tier it crosses, the chunk, its kind ('shm reduce_scatter'), its group's ranks, and the
    failure in the transport's own words."""

    stage: int
    tier: str
    chunk: int
    step: str
    ranks: tuple[int, ...]
    cause: str
    where: str  # the executor's wording of the step (Where::text): "at stage 1 (net), chunk 0, ... over ranks [0,4]"

    def describe(self) -> str:
        return f"{self.where}: {self.cause}"


def failed_step(e: BaseException | None) -> FailedStep | None:
    """The step `e` (hocc._C's HoccNativeError, or an error it caused) failed at; None for a failure
    outside every step (set-up, a Python error)."""
    native = load().HoccNativeError
    while e is not None:
        if isinstance(e, CollectiveError):  # named already
            return e.at
        f = vars(e)  # the fields hocc._C sets on its errors (csrc/python/bindings.cc, error_object)
        if isinstance(e, native) and "stage" in f:
            if f["stage"] < 0:
                return None
            return FailedStep(f["stage"], f["tier"], f["chunk"], f["step"], tuple(f["ranks"]), f["cause"],
                              f["where"])
        e = e.__cause__
    return None


class CallMismatchError(CollectiveError):
    """The ranks of a group made different calls (collective, count, dtype,
    reduction op, algo or order), found before any byte of the call moved."""


def drop_frame_locals(exc: BaseException | None) -> None:
    """Clear the variables of the finished frames on the tracebacks of `exc` and
    of its causes (the lines stay, for printing). A call's error is kept by its
    Work and by torch's futures, which the garbage collector cannot see into:
    frames left whole would keep the failed group's engine and communicators
    (their threads and sockets) for as long as the error lives."""
    seen: set[int] = set()
    todo = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        traceback.clear_frames(e.__traceback__)  # a frame still running is left as it is
        todo += [e.__cause__, e.__context__]
