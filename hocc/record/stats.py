"""Live figures from an engine's recorder, for a training loop to log.

hocc.stats(group) returns, on the calling rank:
- per tier (host, rail, trunk...): the bytes this rank sent in steps of that
  tier, the seconds those steps took, and their ratio (bytes/s), summed over
  the calls recorded so far;
- arrival skew: how much later than the earliest member each member began
  the recent calls that both it and this rank have published.

Arrival times travel through the group's store, not a collective: each call
to stats() publishes this rank's latest arrivals (one key, overwritten) and
reads those the other members have published, so it never waits for another
rank and may be called on one rank only. Members that never called stats()
are missing from the skew. Cost: one store write and a read per member.
"""

from __future__ import annotations

import json
from typing import Any

ARRIVALS_KEPT = 64


def engine_stats(engine: Any) -> dict[str, Any]:
    rec = engine.recorder
    tiers = {name: {"bytes": t.bytes, "seconds": t.seconds, "steps": t.steps,
                    "bytes_per_s": t.bytes / t.seconds if t.seconds > 0 else 0.0}
             for name, t in sorted(rec.stats_totals().items())}
    out: dict[str, Any] = {"group": engine.info.name, "rank": engine.rank, "size": engine.size,
                           "calls": engine.calls_made, "recorded": len(rec.calls), "failed": len(rec.failures),
                           "tiers": tiers}
    out["skew"] = _arrival_skew(engine, rec.arrivals(ARRIVALS_KEPT))
    return out


def _arrival_skew(engine: Any, mine: list[tuple[int, int]]) -> dict[str, Any]:
    store, prefix, rank, size = engine.info.store, engine.prefix, engine.rank, engine.size
    key = f"{prefix}/arrivals/"
    store.set(key + str(rank), json.dumps(mine))
    seen: dict[int, dict[int, int]] = {rank: dict(mine)}
    for r in range(size):
        if r != rank and store.check([key + str(r)]):
            seen[r] = {int(s): int(t) for s, t in json.loads(store.get(key + str(r)))}
    common = set.intersection(*(set(v) for v in seen.values())) if seen else set()
    late: dict[int, list[float]] = {r: [] for r in seen}
    for seq in common:
        first = min(v[seq] for v in seen.values())
        for r, v in seen.items():
            late[r].append((v[seq] - first) / 1e9)
    mean = {r: sum(v) / len(v) for r, v in late.items() if v}
    worst = max(mean, key=lambda r: mean[r]) if mean else None
    return {"members": sorted(seen), "calls": len(common), "mean_late_s": mean,
            "max_late_s": {r: max(v) for r, v in late.items() if v}, "latest": worst}
