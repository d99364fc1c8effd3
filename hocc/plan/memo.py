"""Derived facts about a topology that pricing needs again and again (where
ranks sit, step shapes, HO-Ring's one-chunk plans), kept beside the
topology rather than on it: topologies are shared, immutable inputs. Keyed
by identity (a topology's own hash serializes it) and dropped with it."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any, TypeVar

from hocc.topology import Topology

T = TypeVar("T")
_memos: dict[int, dict[str, Any]] = {}


def memo(topo: Topology, name: str, make: Callable[[], T]) -> T:
    """`make()` computed once per topology object and name."""
    key = id(topo)
    table = _memos.get(key)
    if table is None:
        table = _memos[key] = {}
        weakref.finalize(topo, _memos.pop, key, None)
    if name not in table:
        table[name] = make()
    value: T = table[name]
    return value
