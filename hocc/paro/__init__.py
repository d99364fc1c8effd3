"""PaRO-DP: partial-redundancy sharding strategies (parameters, gradients,
optimizer states each N, I or G), a data-parallel wrapper that runs them over
hocc's collectives, and the guideline that picks one (memory and
communication models priced by hocc's planner). See ../shared/design/PARO.md.

The strategy and the models import no torch; `ParoDP` is loaded on first use."""

from __future__ import annotations

from typing import Any

from hocc.paro.strategy import PAPER_STRATEGIES, Collective, Strategy, all_strategies, parse, rejection

__all__ = ["PAPER_STRATEGIES", "Collective", "ParoDP", "Strategy", "all_strategies", "parse", "rejection"]


def __getattr__(name: str) -> Any:
    if name == "ParoDP":
        from hocc.paro.wrapper import ParoDP
        return ParoDP
    raise AttributeError(f"module 'hocc.paro' has no attribute {name!r}")
