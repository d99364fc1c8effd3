"""auto's choice per message size, worked out ahead of calls: for one
(collective, element size), a table over power-of-two size buckets of which
algorithm (and HO-Ring pipeline depth) the cost model picks. A call then looks
its size up instead of running the planner, so a new size on the caller's
path costs a dictionary lookup and the one plan it runs; measured choices
(hocc.engine.tuning) overwrite the model's, bucket by bucket.

A bucket b holds per-rank sizes in (2^(b-1), 2^b] bytes; the model prices it
at its geometric middle."""

from __future__ import annotations

from dataclasses import dataclass, replace

from hocc.plan.planner import PlannerConfig, choose, predict_all
from hocc.plan.registry import algorithm
from hocc.topology import Topology

# buckets 0..MAX_BUCKET: up to 2^47 bytes (128 TiB) per rank
MAX_BUCKET = 47


def bucket_of(nbytes: int) -> int:
    """The bucket of a per-rank size in bytes (0 and 1 byte: bucket 0)."""
    return min(MAX_BUCKET, max(0, nbytes - 1).bit_length())


def bucket_count(bucket: int, elem_size: int) -> int:
    """The element count the model prices a bucket at (its geometric middle)."""
    if not bucket:
        return 1
    return max(1, max((1 << (bucket - 1)) + 1, int(2 ** (bucket - 0.5))) // elem_size)


def bucket_range(bucket: int) -> str:
    """'(2 KiB, 4 KiB]': the sizes a bucket holds, for tables."""
    if bucket == 0:
        return "<= 1 B"
    return f"({human(1 << (bucket - 1))}, {human(1 << bucket)}]"


def human(nbytes: float) -> str:
    """'4 KiB', '1.5 MiB', '100 B': sizes as hocc's tables print them."""
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= div:
            return f"{nbytes / div:.4g} {unit}"
    return f"{int(nbytes)} B"


@dataclass(frozen=True)
class Pick:
    """What auto runs for a bucket: the algo, HO-Ring's K (None: not ho_ring),
    and why (the model's predictions, or the measured times)."""

    algo: str
    chunks: int | None
    why: str

    def settings(self, base: PlannerConfig) -> PlannerConfig:
        """The planner settings that build this pick's plan (kept for the last `base`:
        auto asks on every call, and the same object keeps the plan cache's lookup an `is`)."""
        if self.chunks is None:
            return base
        last = self.__dict__.get("_settings")
        if last is None or last[0] is not base:
            last = (base, replace(base, chunks=self.chunks))
            object.__setattr__(self, "_settings", last)
        return last[1]


def model_pick(collective: str, count: int, elem_size: int, topo: Topology, cfg: PlannerConfig) -> Pick:
    """The cost model's choice for one size (choose() over predict_all())."""
    preds = predict_all(collective, count, elem_size, topo, cfg)
    algo = choose(preds, cfg, collective)
    why = "model: " + ", ".join(f"{p.algo}{f'@{p.chunks}' if algorithm(p.algo).chunked else ''} "
                                f"{p.seconds * 1e3:.3f} ms" for p in preds.values())
    return Pick(algo, preds[algo].chunks if algorithm(algo).chunked else None, why)


class Crossover:
    """The table for one (collective, element size): every bucket priced once
    when made, with the topology's links and `cfg`'s cost parameters."""

    def __init__(self, collective: str, elem_size: int, topo: Topology, cfg: PlannerConfig) -> None:
        self.collective, self.elem_size = collective, elem_size
        self.picks = [model_pick(collective, bucket_count(b, elem_size), elem_size, topo, cfg)
                      for b in range(MAX_BUCKET + 1)]

    def pick(self, nbytes: int) -> Pick:
        return self.picks[bucket_of(nbytes)]

    def crossovers(self) -> list[tuple[int, str]]:
        """(first bucket, algo) where the model's pick changes."""
        out: list[tuple[int, str]] = []
        for b, p in enumerate(self.picks):
            if not out or out[-1][1] != p.algo:
                out.append((b, p.algo))
        return out
