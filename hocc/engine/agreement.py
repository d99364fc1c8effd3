"""What the ranks of a group must agree on for one call, and HOCC_CHECK's
comparison of it across ranks.

Every call carries a `Call` into the executor, whose communicators compare it
with their peers' at the call's first message (csrc/core/call.h): a mismatch
raises on every rank instead of crashing a process or returning a wrong
result. HOCC_CHECK=1 adds a comparison over the whole group before anything
runs (one all-gather of 8 integers on a gloo group of the engine's own), in
the spirit of TORCH_DISTRIBUTED_DEBUG=DETAIL, and names every rank that
differs."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from typing import Any

import torch

from hocc.engine.errors import CallMismatchError
from hocc.executor import load
from hocc.plan.registry import names
from hocc.plan.types import Plan

# by code, as the executor's call check encodes them (csrc/core/call.cc, types.h): read from it, not copied
COLLECTIVES: tuple[str, ...] = tuple(load().COLLECTIVES)
OPS: tuple[str, ...] = tuple(load().OPS)
DTYPE_NAMES: tuple[str, ...] = tuple(load().DTYPES)


def plan_hash(plan: Plan) -> int:
    """64 bits of the plan's structure (not its prediction or reason, which
    may differ between ranks with different cost settings for the same plan)."""
    d = asdict(plan)
    shape = {k: d[k] for k in ("collective", "algo", "world", "count", "layout", "steps", "stages", "work_at",
                               "pack")}
    digest = hashlib.blake2b(json.dumps(shape, sort_keys=True).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


@dataclass(frozen=True)
class Call:
    seq: int  # the engine's call number
    collective: str
    count: int  # as the plan counts: the all_reduce tensor, the all_gather input, the reduce_scatter output
    dtype: str
    op: str
    algo: str  # the plan's algo (what runs, after auto)
    plan: int  # plan_hash

    def native(self) -> tuple[int, int, int, str, str]:
        """The executor's form (csrc/core/call.h)."""
        return self.seq, self.plan, self.count, self.collective, self.algo

    def describe(self) -> str:
        op = "" if self.collective == "all_gather" else f"{self.op}, "
        return f"{self.collective} of {self.count} {self.dtype} ({op}{self.algo}, call {self.seq})"

    def encode(self) -> list[int]:
        op = 0 if self.collective == "all_gather" else OPS.index(self.op)  # all_gather has no op to agree on
        return [self.seq, COLLECTIVES.index(self.collective), self.count, DTYPE_NAMES.index(self.dtype), op,
                _algo_code(self.algo), self.plan >> 1]


def _algo_code(algo: str) -> int:
    """The algorithm's index in the registry (hocc.plan.registry: the same on every rank), one past for others."""
    known = names()
    return known.index(algo) if algo in known else len(known)


_FIELDS = ("call number", "collective", "count", "dtype", "reduction op", "algo", "plan")


def _name(field: int, value: int) -> str:
    tables: dict[int, tuple[str, ...]] = {1: COLLECTIVES, 3: DTYPE_NAMES, 4: OPS, 5: (*names(), "?")}
    if field in tables and 0 <= value < len(tables[field]):
        return tables[field][value]
    return hex(value) if field == 6 else str(value)


def _ranks(rs: list[int]) -> str:
    return ("rank " if len(rs) == 1 else "ranks ") + ",".join(map(str, rs))


def mismatches(rows: list[list[int]]) -> list[str]:
    """For each field the rows disagree on: which ranks have which value."""
    out: list[str] = []
    for f, field in enumerate(_FIELDS):
        by: dict[int, list[int]] = {}
        for r, row in enumerate(rows):
            by.setdefault(row[f], []).append(r)
        if len(by) > 1:
            if field == "plan" and out:
                continue  # a different plan follows from the differences already named
            parts = "; ".join(f"{_ranks(rs)}: {_name(f, v)}" for v, rs in sorted(by.items(), key=lambda x: x[1]))
            out.append(f"{field} ({parts})")
    return out


def check_all(pg: Any, call: Call, rank: int, size: int, group: str) -> None:
    """HOCC_CHECK: compare `call` with every rank's; raise the same error on all of them on a mismatch."""
    mine = torch.tensor(call.encode(), dtype=torch.int64)
    rows = torch.empty(size * mine.numel(), dtype=torch.int64)
    pg._allgather_base(rows, mine).wait()
    table = rows.view(size, -1).tolist()
    diff = mismatches(table)
    if diff:
        raise CallMismatchError(
            f"hocc (HOCC_CHECK): the ranks of group {group!r} disagree on call {call.seq}: " + "; ".join(diff)
            + f". This rank (rank {rank}) called {call.describe()}. Every rank must make the same collective "
            "calls in the same order, with the same sizes, dtypes, reduction ops and algos; nothing was sent",
            collective=call.collective, group=group)
