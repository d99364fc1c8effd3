"""Rounds: a step's groups put in rounds so that no two groups of a round share
a rank (a graph colouring). A rank in several groups of a step runs them one
after another, in the order listed (hocc.plan.types), so listing the groups
round by round lets each round's rings run at once while every rank meets its
groups in the same order as its peers (no deadlock).

Two colourings, for the two callers:
  by_offset         HO-Ring's builders: the fewest rounds for groups that are
                    intervals of a chunk (the lowest free round, in offset order)
  in_listed_order   types.one_group_per_rank: each group after the earlier-listed
                    groups it shares a rank with, so the listed order survives
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

G = TypeVar("G", bound=tuple[Any, ...])  # (start, ..., members): members last


def by_offset(groups: Sequence[G]) -> list[G]:
    """`groups` (tuples whose first field orders them and whose last is the
    members) listed round by round, rounds by greedy colouring in that order.
    On intervals where each rank's are contiguous this is optimal: as many
    rounds as the most groups one rank is in."""
    ordered = sorted(groups)
    rounds: list[int] = []
    busy: dict[int, set[int]] = {}  # rank -> rounds it is in
    for g in ordered:
        members = g[-1]
        taken = set().union(*(busy.get(r, set()) for r in members))
        c = next(i for i in range(len(ordered) + 1) if i not in taken)
        rounds.append(c)
        for r in members:
            busy.setdefault(r, set()).add(c)
    return [g for _, g in sorted(zip(rounds, ordered, strict=True), key=lambda x: x[0])]


def in_listed_order(members: Sequence[Sequence[int]]) -> list[int]:
    """Per group, its round: one after the latest round of an earlier-listed
    group that shares a rank with it."""
    last: dict[int, int] = {}
    out = []
    for ranks in members:
        at = max((last[r] + 1 for r in ranks if r in last), default=0)
        out.append(at)
        for r in ranks:
            last[r] = at
    return out
