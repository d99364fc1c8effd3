"""The flight recorder: each engine keeps its last N calls, as they ran.

A call's record is made when the call is made (enqueue), marked when this rank
begins it (its arrival at the collective) and when it ends, and holds the C++
executor's RunRecord (csrc/core/record.h): when this rank began and ended each
of its steps and ring exchanges. Nothing is serialized or converted on the
call's path; a dump (hocc.record.dump) turns records into JSON.

All times are wall-clock nanoseconds (time.time_ns(), CLOCK_REALTIME in C++),
so that dumps of ranks on several hosts merge into one timeline where the
hosts' clocks are synchronized (NTP or PTP; on one machine they are one clock).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from hocc.plan.types import Plan

FORMAT = "hocc-record"
VERSION = 1

# The step's bytes sent per member, in elements of its segment (ring accounting:
# what each member puts on its link whatever the transport does inside).
_SENT_PER_SEG = {"all_reduce": lambda n: 2 * (n - 1) / n, "reduce_scatter": lambda n: n - 1,
                 "all_gather": lambda n: n - 1}


def step_bytes(collective: str, members: int, seg: int, elem_size: int) -> int:
    """Bytes one member of a step's group sends (0 alone)."""
    if members < 2:
        return 0
    return int(_SENT_PER_SEG[collective](members) * seg * elem_size)


class CallRecord:
    """One call on one rank. `run` is the executor's RunRecord (or None where
    nothing ran in C++, e.g. a zero-size call); `plan` resolves its steps."""

    __slots__ = (
        "algo",
        "collective",
        "count",
        "dtype",
        "elem_size",
        "end_ns",
        "enqueue_ns",
        "error",
        "op",
        "plan",
        "run",
        "seq",
        "start_ns",
        "state",
    )

    def __init__(self, seq: int, collective: str, count: int, dtype: str, elem_size: int, op: str, plan: Plan) -> None:
        self.seq = seq
        self.collective = collective
        self.count = count
        self.dtype = dtype
        self.elem_size = elem_size
        self.op = op
        self.algo = plan.algo
        self.plan = plan
        self.enqueue_ns = time.time_ns()
        self.start_ns = 0
        self.end_ns = 0
        self.state = "queued"  # queued -> running -> ok | failed
        self.error = ""
        self.run: Any = None

    def to_dict(self, live_run: Any = None) -> dict[str, Any]:
        """JSON-ready. `live_run`: the executor's record of this call while it
        is still running (the call's own `run` is set only once it ends)."""
        run = self.run if self.run is not None else live_run
        steps: list[dict[str, Any]] = []
        if run is not None:
            plan_steps = self.plan.steps
            for step_i, group_i, begin, end in run.steps():
                st = plan_steps[step_i]
                g = st.groups[group_i]
                steps.append({"stage": st.stage, "chunk": st.chunk, "op": st.collective, "impl": st.impl,
                              "tier": st.tier, "ranks": list(g.ranks),
                              "bytes": step_bytes(st.collective, len(g.ranks), g.seg, self.elem_size),
                              "begin_ns": begin, "end_ns": end, "exchanges": []})
            for i, to, frm, post, done, end, sent, received in run.exchanges():
                steps[i]["exchanges"].append([to, frm, post, done, end, sent, received])
        return {"seq": self.seq, "collective": self.collective, "count": self.count, "dtype": self.dtype,
                "op": self.op, "algo": self.algo, "plan": self.plan.summary(), "stages": self.plan.stages,
                "chunks": self.plan.layout.chunks, "state": self.state, "error": self.error,
                "enqueue_ns": self.enqueue_ns, "start_ns": self.start_ns, "end_ns": self.end_ns, "steps": steps}


@dataclass
class TierTotals:
    """Running sums for live stats: bytes this rank sent and the seconds its steps took, per tier."""

    bytes: int = 0
    seconds: float = 0.0
    steps: int = 0


@dataclass(eq=False)  # hashable by identity: dump.py keeps live recorders in a WeakSet
class Recorder:
    """One engine's ring buffer of its latest `capacity` calls (0: records
    nothing). `describe` gives the dump header: who this rank is, in which
    group, on which hosts. `executor` gives the RunRecord of a call in flight."""

    capacity: int
    describe: Any  # () -> dict for the dump header
    executor: Any = None  # has last_record(), or None
    calls: deque[CallRecord] = field(init=False)
    lock: threading.Lock = field(default_factory=threading.Lock, init=False)
    tiers: dict[str, TierTotals] = field(default_factory=dict, init=False)
    arrivals: deque[tuple[int, int]] = field(default_factory=lambda: deque(maxlen=256), init=False)
    counted: int = field(default=0, init=False)  # records folded into `tiers` (a call counts once)

    def __post_init__(self) -> None:
        self.calls = deque(maxlen=max(self.capacity, 1))

    @property
    def on(self) -> bool:
        return self.capacity > 0

    def made(self, rec: CallRecord) -> None:
        if self.capacity:
            with self.lock:  # a dump may be copying the deque from another thread
                self.calls.append(rec)  # the oldest falls out

    def began(self, rec: CallRecord) -> None:
        rec.start_ns = time.time_ns()
        rec.state = "running"
        with self.lock:
            self.arrivals.append((rec.seq, rec.start_ns))

    def ended(self, rec: CallRecord, error: str = "") -> None:
        rec.end_ns = time.time_ns()
        rec.state = "failed" if error else "ok"
        rec.error = error
        ex = self.executor
        if ex is not None:
            run = ex.last_record()
            # the executor's latest run is this call's only if it began after this call did
            rec.run = run if run is not None and run.begin_ns >= rec.start_ns else None

    def snapshot(self) -> list[dict[str, Any]]:
        """Every kept call as JSON-ready dicts, oldest first (also while a call runs)."""
        with self.lock:
            calls = list(self.calls)
        live = self.executor.last_record() if self.executor is not None else None
        out = []
        for rec in calls:
            own_live = live if rec.state == "running" and live is not None and live.begin_ns >= rec.start_ns else None
            out.append(rec.to_dict(own_live))
        return out

    def header(self) -> dict[str, Any]:
        return {"format": FORMAT, "version": VERSION, "capacity": self.capacity, **self.describe()}

    def stats_totals(self) -> dict[str, TierTotals]:
        """Per-tier totals over every ended call kept since the last look
        (folded in lazily, so the call path pays nothing for them)."""
        with self.lock:
            fresh = [r for r in list(self.calls) if r.state in ("ok", "failed") and r.seq >= self.counted]
            for rec in fresh:
                self.counted = max(self.counted, rec.seq + 1)
                if rec.run is None:
                    continue
                steps = rec.plan.steps
                for step_i, group_i, begin, end in rec.run.steps():
                    if not end:
                        continue
                    st = steps[step_i]
                    g = st.groups[group_i]
                    t = self.tiers.setdefault(st.tier, TierTotals())
                    t.bytes += step_bytes(st.collective, len(g.ranks), g.seg, rec.elem_size)
                    t.seconds += (end - begin) / 1e9
                    t.steps += 1
            return dict(self.tiers)
