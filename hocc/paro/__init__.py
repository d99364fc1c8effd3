"""PaRO-DP: partial-redundancy sharding strategies (parameters, gradients,
optimizer states each N, I or G), applied to a model unit by unit with
`paro_shard` over hocc's collectives, and the guideline that picks one
(memory and communication models priced by hocc's planner). See docs/paro.md.

The strategy and the models import no torch; `paro_shard` is loaded on first use."""

from __future__ import annotations

from typing import Any

from hocc.paro.strategy import PAPER_STRATEGIES, Collective, Strategy, all_strategies, parse, rejection

__all__ = ["PAPER_STRATEGIES", "Collective", "Strategy", "all_strategies", "paro_shard", "parse", "rejection"]


def __getattr__(name: str) -> Any:
    if name == "paro_shard":
        from hocc.paro.shard import paro_shard
        return paro_shard
    raise AttributeError(f"module 'hocc.paro' has no attribute {name!r}")
