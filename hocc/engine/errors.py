"""What a failed collective raises. Both are RuntimeErrors, as torch.distributed's
own failures are, and carry what the message says as attributes too."""

from __future__ import annotations


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
