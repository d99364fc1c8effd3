"""What a failed collective raises. Both are RuntimeErrors, as torch.distributed's
own failures are, and carry what the message says as attributes too."""

from __future__ import annotations

import traceback


class CollectiveError(RuntimeError):
    """A collective failed on this rank: a peer died, stopped or timed out, the
    network failed, or the ranks' calls did not match. The group is unusable
    from then on: every later call on it raises this at once; destroy it and
    create it again (dist.destroy_process_group() then init_process_group(), or
    dist.new_group() again for a sub-group)."""

    def __init__(self, message: str, *, collective: str = "", group: str = "") -> None:
        super().__init__(message)
        self.collective = collective
        self.group = group


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
