"""Rounds: a step's groups put in rounds so that no two groups of a round share
a rank (a graph colouring). A rank in several groups of a step runs them one
after another, in the order listed (hocc.plan.types), so listing the groups
round by round lets each round's rings run at once while every rank meets its
groups in the same order as its peers (no deadlock).

HO-Ring's builders colour with `by_offset`: the fewest rounds for groups that
are intervals of a chunk (the lowest free round, in offset order).
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

