"""Reading nccl-tests output (all_reduce_perf, all_gather_perf,
reduce_scatter_perf), as users have it: the '# Using devices' lines give the
ranks and their hosts, each result row a size and its time and bandwidths.
Lines may carry a launcher's prefix ('0: ' from srun, '[1,0]<stdout>:' or
'[0] ' from mpirun); several runs in one file are read one by one.

The op is read from the file ('# Collective test starting: all_gather_perf',
the command line) when it says, else from the rows: busbw / algbw is
2(W-1)/W for all_reduce and (W-1)/W for the others, and all_gather has no
reduction ('none'). Sizes are nccl-tests' (the full buffer S, as hocc-bench's).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from hocc.plan.types import COLLECTIVES
from hocc.plan.volumes import bus_factor

_PREFIX = re.compile(r"^\s*(?:\[[\d,]+\](?:<\w+>)?:?|\d+:)\s?")
_RANK = re.compile(r"#\s*Rank\s+(\d+)\b.*?\bon\s+(\S+)\s+device\s+(\d+)")
_OP = re.compile(rf"\b({'|'.join(COLLECTIVES)})_perf")  # nccl-tests names its binaries after hocc's collectives
ELEM = {"float": 4, "double": 8, "half": 2, "bfloat16": 2, "int8": 1, "uint8": 1, "int32": 4, "uint32": 4,
        "int64": 8, "uint64": 8, "float32": 4, "float16": 2, "float64": 8, "fp8_e4m3": 1, "fp8_e5m2": 1}


@dataclass(frozen=True)
class Row:
    size: int  # bytes, the full buffer
    count: int
    dtype: str
    redop: str
    time_s: float  # out-of-place
    algbw: float  # GB/s
    busbw: float  # GB/s
    time_in_place_s: float | None = None


@dataclass
class Run:
    """One nccl-tests run: its ranks' hosts and devices, its op, its rows."""

    hostnames: list[str] = field(default_factory=list)  # per rank
    devices: list[int] = field(default_factory=list)  # per rank, the CUDA device
    op: str | None = None
    rows: list[Row] = field(default_factory=list)

    @property
    def world(self) -> int:
        return len(self.hostnames)

    @property
    def shape(self) -> tuple[int, int]:
        """(hosts, ranks on the largest host)."""
        per = Counter(self.hostnames)
        return len(per), max(per.values(), default=0)


def _number(tok: str) -> float | None:
    try:
        return float(tok)
    except ValueError:
        return None


def _row(line: str) -> Row | None:
    toks = line.split()
    if len(toks) < 11 or not toks[0].isdigit() or not toks[1].isdigit() or toks[2] not in ELEM:
        return None
    rest = toks[4:]
    if len(rest) == 9:  # with a root column
        rest = rest[1:]
    if len(rest) != 8:
        return None
    t, alg, bus = (_number(x) for x in rest[:3])
    t2 = _number(rest[4])
    if t is None or alg is None or bus is None:
        return None
    return Row(int(toks[0]), int(toks[1]), toks[2], toks[3], t * 1e-6, alg, bus, t2 * 1e-6 if t2 else None)


def parse_log(text: str, op: str | None = None) -> list[Run]:
    """Every run in an nccl-tests output (`op` when the caller knows it)."""
    runs: list[Run] = []
    cur: Run | None = None
    named: str | None = None  # an op the lines before the next run named
    for raw in text.splitlines():
        line = _PREFIX.sub("", raw, count=1)
        m = _OP.search(line)
        if m and not _row(line):
            named = m.group(1)
        if line.lstrip().startswith("# nThread"):
            cur = Run(op=op or named)
            named = None
            runs.append(cur)
            continue
        if cur is None:
            if _RANK.search(line) or _row(line):
                cur = Run(op=op or named)
                named = None
                runs.append(cur)
            else:
                continue
        r = _RANK.search(line)
        if r:
            rank = int(r.group(1))
            while len(cur.hostnames) <= rank:
                cur.hostnames.append("")
                cur.devices.append(0)
            cur.hostnames[rank], cur.devices[rank] = r.group(2), int(r.group(3))
            continue
        row = _row(line)
        if row is not None:
            cur.rows.append(row)
    runs = [r for r in runs if r.rows]
    for run in runs:
        if not run.hostnames:
            raise ValueError("an nccl-tests run without its '# Using devices' lines: cannot tell its ranks; "
                             "keep the header nccl-tests prints")
        if "" in run.hostnames:
            raise ValueError(f"the '# Using devices' lines list {sum(1 for h in run.hostnames if h)} of "
                             f"{len(run.hostnames)} ranks; keep every line of the log")
        run.op = run.op or infer_op(run)
    return runs


def infer_op(run: Run) -> str:
    """all_reduce if busbw / algbw is 2(W-1)/W, else all_gather ('none'
    reduction) or reduce_scatter."""
    w = run.world
    ratios = [r.busbw / r.algbw for r in run.rows if r.algbw > 0.05]
    if not ratios or w < 2:
        raise ValueError("cannot tell which collective this nccl-tests run is; pass the op")
    ratio = sorted(ratios)[len(ratios) // 2]
    if abs(ratio - bus_factor("all_reduce", w)) < abs(ratio - bus_factor("all_gather", w)):
        return "all_reduce"
    return "all_gather" if run.rows[0].redop == "none" else "reduce_scatter"


def read_logs(paths: list[str] | list[Path], op: str | None = None) -> list[Run]:
    out: list[Run] = []
    for p in paths:
        runs = parse_log(Path(p).read_text(), op)
        if not runs:
            raise ValueError(f"{p}: no nccl-tests result rows found (size count type redop ... busbw)")
        out += runs
    return out
