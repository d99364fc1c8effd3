"""nccl-tests' size arguments: '64K', '1M', '2G' (powers of 1024), sweeps, and sizes as the tables print them."""

from __future__ import annotations

from hocc.topology.links import parse_size  # one parser for sizes, the spec's burst included

__all__ = ["format_size", "parse_size", "sweep"]

_UNITS = (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10))


def sweep(minbytes: int, maxbytes: int, stepfactor: float = 2.0, stepbytes: int = 0) -> list[int]:
    """Sizes from minbytes to maxbytes: multiplied by stepfactor, or increased by
    stepbytes when that is given (nccl-tests' -f / -i)."""
    if minbytes < 0 or maxbytes < minbytes:
        raise ValueError(f"need 0 <= minbytes <= maxbytes, got {minbytes} and {maxbytes}")
    if stepbytes < 0 or (not stepbytes and stepfactor <= 1 and maxbytes > minbytes):
        raise ValueError("stepfactor must be > 1 (or give a positive stepbytes)")
    out, size = [], minbytes
    while size <= maxbytes:
        out.append(size)
        nxt = size + stepbytes if stepbytes else int(size * stepfactor)
        if nxt <= size:
            if maxbytes == minbytes:
                break
            nxt = size + 1 if size else 1
        size = nxt
    return out


def format_size(n: int, approx: bool = False) -> str:
    """'64 MiB', '4 KiB', '1536 B': n in the largest unit that divides it. approx: in the largest unit it
    reaches to within 1%, rounded, with '~' where that is not exact: a size rounded down to a multiple of the
    ranks (64 MiB over 11 ranks, 67108844 B) reads '~64 MiB'."""
    for unit, div in _UNITS:
        if approx and n >= 0.99 * div:
            whole = round(n / div)
            return f"{'' if n == whole * div else '~'}{whole} {unit}"
        if not approx and n >= div and n % div == 0:
            return f"{n // div} {unit}"
    return f"{n} B"
