"""nccl-tests' size arguments: '64K', '1M', '2G' (powers of 1024) and sweeps."""

from __future__ import annotations

import re

_SIZE = re.compile(r"^\s*(\d+)\s*([kmgt]?)b?\s*$", re.I)
_MULT = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(text: str | int) -> int:
    if isinstance(text, int):
        return text
    m = _SIZE.match(text)
    if not m:
        raise ValueError(f"cannot parse size {text!r}; write bytes with an optional K, M or G suffix, e.g. 64K")
    return int(m.group(1)) * _MULT[m.group(2).lower()]


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
