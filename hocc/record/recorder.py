"""The flight recorder: each engine keeps its last N calls, as they ran.

A call's record is made when the call is made (enqueue): what was called.
The C++ executor keeps, per run and under the same call number, when this
rank began it (its arrival at the collective) and ended it, and each of its
steps and ring exchanges (csrc/core/record.h). So the caller's path appends
one tuple; nothing is serialized or converted until a dump
(hocc.record.dump) turns the two into JSON.

All times are wall-clock nanoseconds (time.time_ns(), CLOCK_REALTIME in C++),
so that dumps of ranks on several hosts merge into one timeline where the
hosts' clocks are synchronized (NTP or PTP; on one machine they are one clock).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from hocc.plan.types import Plan
from hocc.plan.volumes import ring_volume

FORMAT = "hocc-record"
VERSION = 1


def step_bytes(collective: str, members: int, seg: int, elem_size: int) -> int:
    """Bytes one member of a step's group sends (ring accounting: what each
    member puts on its link whatever the transport does inside; 0 alone)."""
    return int(ring_volume(collective, members, seg)[0] * elem_size)


class PlanSource(Protocol):
    """Whatever hands out a call's plan (the engine's cache entry, hocc.engine.plan_cache.Compiled)."""

    @property
    def plan(self) -> Plan: ...


class CallRecord(NamedTuple):
    """What the caller's side knows of one call: made when the call is made.
    When this rank began and ended it, and its steps, are the executor's
    RunRecord of the same `seq` (csrc/core/record.h): the caller's path
    handles nothing more."""

    seq: int
    collective: str
    elems: int  # the call's count (tuple has a count())
    dtype: str
    elem_size: int
    op: str
    source: PlanSource  # the plan, read only when a record is (a scaled plan is built then)
    enqueue_ns: int

    @property
    def plan(self) -> Plan:
        return self.source.plan


def call_dict(c: CallRecord, run: Any, failure: tuple[str, int] | None, transport_of: Any = None) -> dict[str, Any]:
    """One call as JSON-ready data: the caller's record, the executor's (None if the run never began), and the
    failure (error, ns) if the call failed; each step's `transport` is what carried it here (transport_of)."""
    steps: list[dict[str, Any]] = []
    if run is not None:
        plan_steps = c.plan.steps
        for step_i, group_i, begin, end in run.steps():
            st = plan_steps[step_i]
            g = st.groups[group_i]
            steps.append({"stage": st.stage, "chunk": st.chunk, "op": st.collective, "impl": st.impl,
                          "transport": transport_of(st.stage, g.ranks, st.impl) if transport_of else "",
                          "tier": st.tier, "ranks": list(g.ranks),
                          "bytes": step_bytes(st.collective, len(g.ranks), g.seg, c.elem_size),
                          "begin_ns": begin, "end_ns": end, "exchanges": []})
        for i, to, frm, post, done, end, sent, received in run.exchanges():
            steps[i]["exchanges"].append([to, frm, post, done, end, sent, received])
    end_ns = run.end_ns if run is not None else 0
    if failure is not None:
        state = "failed"
    elif run is None:
        state = "queued"
    else:
        state = "ok" if end_ns else "running"
    return {"seq": c.seq, "collective": c.collective, "count": c.elems, "dtype": c.dtype, "op": c.op,
            "algo": c.plan.algo, "plan": c.plan.summary(), "stages": c.plan.stages, "chunks": c.plan.layout.chunks,
            "state": state, "error": failure[0] if failure else "", "enqueue_ns": c.enqueue_ns,
            "start_ns": run.begin_ns if run is not None else 0,
            "end_ns": end_ns or (failure[1] if failure else 0), "steps": steps}


@dataclass
class TierTotals:
    """Running sums for live stats: bytes this rank sent and the seconds its steps took, per tier."""

    bytes: int = 0
    seconds: float = 0.0
    steps: int = 0


@dataclass(eq=False)  # hashable by identity: dump.py keeps live recorders in a WeakSet
class Recorder:
    """One engine's record of its latest `capacity` calls (0: records
    nothing): the caller's CallRecords here, the runs in the executor (which
    keeps as many). `describe` gives the dump header: who this rank is, in
    which group, on which hosts."""

    capacity: int
    describe: Any  # () -> dict for the dump header
    executor: Any = None  # has records(), or None (then calls have no timings)
    transport_of: Any = None  # (stage, ranks, impl) -> what carried that comm ('shm', 'ucx', 'gloo', 'nccl')
    calls: deque[tuple[Any, ...]] = field(init=False)  # CallRecord fields, as plain tuples (see made)
    failures: dict[int, tuple[str, int]] = field(default_factory=dict, init=False)  # seq -> (error, ns)
    lock: threading.Lock = field(default_factory=threading.Lock, init=False)
    tiers: dict[str, TierTotals] = field(default_factory=dict, init=False)
    counted: int = field(default=0, init=False)  # calls folded into `tiers` (each counts once)
    kept: list[Any] = field(default_factory=list, init=False)  # the runs' records once detached

    def __post_init__(self) -> None:
        self.calls = deque(maxlen=max(self.capacity, 1))
        if self.executor is not None:
            self.executor.set_record(self.capacity)

    @property
    def on(self) -> bool:
        return self.capacity > 0

    # The call path: one tuple appended when the call is made, on the caller's
    # thread, in call order (deque.append and list(deque) each run under the
    # GIL without releasing it, so a dump's copy never sees half of one); a
    # failure adds an entry to `failures`. A call queued behind others is in
    # `calls` before it runs: its run record (the executor's) says whether it began.
    def made(self, seq: int, collective: str, count: int, dtype: str, elem_size: int, op: str, source: PlanSource,
             enqueue_ns: int) -> None:
        # a plain tuple (a CallRecord's fields, in order): half the cost of making the NamedTuple here; the
        # table of repeated calls appends the same tuple itself (hocc/api/repeat.py, Prepared.record_fields)
        self.calls.append((seq, collective, count, dtype, elem_size, op, source, enqueue_ns))

    def failed(self, seq: int, error: str) -> None:
        self.failures[seq] = (error, time.time_ns())

    def detach(self) -> None:
        """Keep the executor's records, and drop the executor: a closed engine's
        must go (it holds the transport, whose gloo groups hold threads and
        sockets until their last reference goes)."""
        if self.executor is not None:
            self.kept = list(self.executor.records())
            self.executor = None

    def _records(self) -> list[Any]:
        return list(self.executor.records()) if self.executor is not None else self.kept

    def _runs(self) -> dict[int, Any]:
        return {r.seq: r for r in self._records()}

    def snapshot(self) -> list[dict[str, Any]]:
        """Every kept call as JSON-ready dicts, oldest first (also while a call runs)."""
        calls = [CallRecord._make(c) for c in list(self.calls)]
        runs = self._runs()
        failures = dict(self.failures)
        return [call_dict(c, runs.get(c.seq), failures.get(c.seq), self.transport_of) for c in calls]

    def arrivals(self, last: int) -> list[tuple[int, int]]:
        """(seq, ns) of when this rank began each of its latest `last` runs."""
        return [(r.seq, r.begin_ns) for r in self._records()[-last:]]

    def header(self) -> dict[str, Any]:
        return {"format": FORMAT, "version": VERSION, "capacity": self.capacity, **self.describe()}

    def stats_totals(self) -> dict[str, TierTotals]:
        """Per-tier totals over every ended run kept since the last look
        (folded in lazily, so the call path pays nothing for them)."""
        with self.lock:
            plans = {c[0]: CallRecord._make(c) for c in list(self.calls)}
            for run in self._records():
                c = plans.get(run.seq)
                if c is None or run.seq < self.counted or not run.end_ns:
                    continue
                self.counted = run.seq + 1
                steps = c.plan.steps
                for step_i, group_i, begin, end in run.steps():
                    if not end:
                        continue
                    st = steps[step_i]
                    g = st.groups[group_i]
                    t = self.tiers.setdefault(st.tier, TierTotals())
                    t.bytes += step_bytes(st.collective, len(g.ranks), g.seg, c.elem_size)
                    t.seconds += (end - begin) / 1e9
                    t.steps += 1
            return dict(self.tiers)
