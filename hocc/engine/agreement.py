"""What the ranks of a group must agree on for one call, and HOCC_CHECK's
comparison of it across ranks.

Every call carries a `Call` into the executor, whose communicators compare it
with their peers' at the call's first message (csrc/core/call.h): a mismatch
raises on every rank instead of crashing a process or returning a wrong
result. HOCC_CHECK=1 adds a comparison over the whole group before anything
runs (one all-gather of every rank's 64-byte CallId on a gloo group of the
engine's own), in the spirit of TORCH_DISTRIBUTED_DEBUG=DETAIL, and names
every rank that differs. What a call is, how it is told and how two are
compared live in C++ alone (csrc/core/call.{h,cc}); this module builds a
call's fields and asks."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from typing import Any

import torch

from hocc.engine.errors import CallMismatchError
from hocc.executor import load
from hocc.plan.types import Plan


def plan_hash(plan: Plan) -> int:
    """64 bits of the plan's structure (not its prediction or reason, which
    may differ between ranks with different cost settings for the same plan)."""
    d = asdict(plan)
    shape = {k: d[k] for k in ("collective", "algo", "world", "count", "layout", "steps", "stages", "work_at",
                               "pack")}
    digest = hashlib.blake2b(json.dumps(shape, sort_keys=True).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


@dataclass(slots=True)  # not frozen: a frozen dataclass's __init__ costs a small call 0.6 us more; never changed
class Call:
    seq: int  # the engine's call number
    collective: str
    count: int  # as the plan counts: the all_reduce tensor, the all_gather input, the reduce_scatter output
    dtype: str
    op: str
    algo: str  # the plan's algo (what runs, after auto)
    plan: int  # plan_hash

    def cpp(self) -> tuple[int, int, int, str, str]:
        """The executor's form (csrc/core/call.h)."""
        return self.seq, self.plan, self.count, self.collective, self.algo

    def id(self) -> bytes:
        """The 64-byte CallId the communicators trade (csrc/core/call.h: the one definition)."""
        return bytes(load().call_id(self.cpp(), self.dtype, self.op))

    def describe(self) -> str:
        return str(load().describe_call(self.id()))


def check_all(pg: Any, call: Call, rank: int, size: int, group: str) -> None:
    """HOCC_CHECK: compare `call` with every rank's (C++'s comparison of the
    gathered CallIds); raise the same error on all of them on a mismatch."""
    mine = torch.frombuffer(bytearray(call.id()), dtype=torch.uint8)
    rows = torch.empty(size * mine.numel(), dtype=torch.uint8)
    pg._allgather_base(rows, mine).wait()
    diff = load().call_group_differences(rows.numpy().tobytes())
    if diff:
        raise CallMismatchError(
            f"hocc (HOCC_CHECK): the ranks of group {group!r} disagree on call {call.seq}: " + diff
            + f". This rank (rank {rank}) called {call.describe()}. Every rank must make the same collective "
            "calls in the same order, with the same sizes, dtypes, reduction ops and algos; nothing was sent",
            collective=call.collective, group=group)
