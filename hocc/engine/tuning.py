"""Measured selection: what `auto` runs, per (collective, dtype, size bucket),
decided by the cost model, and by timing its top candidates on the cluster the
job runs on where the model cannot tell them apart.

The candidates of a bucket are the algorithms the model prices within
TRY_WITHIN (1.25x) of its pick, HO-Ring at the model's pipeline depth. Where
that is the pick alone (the usual case), the bucket is settled by the model
once its check passes. Every bucket runs the pick first and checks it once
(CHECK_CALLS of its calls timed, after calls worth CHECK_S, at the cost of a
barrier and an agreement): slower than CHECK_RATIO (6) x its price, the model
is wrong for this cluster (links described wrongly), and the bucket's trials
start at once, between every algorithm the model can price where it saw no
rival. Otherwise its first calls (after the check) are trials: each
candidate runs a warm-up call the first time this engine runs it
(communicator set-up is not timed), then three interleaved rounds, each a
burst of back-to-back calls of each candidate (1-4 calls, about 20 ms of the
fastest by the model's price; one round of one call when a call costs
seconds), each burst started together on all ranks (a barrier, hocc's own on
CPU: the previous candidate's stragglers are not its cost), each candidate's
median call kept (above 0.25 s a call, one call each and no warm-up: set-up
is noise there).
After the first round the ranks agree on what they measured so far and drop
every candidate slower than KEEP_WITHIN (1.5x) the fastest: a rival the model
priced wrongly costs one round, not three (successive halving);
the schedule follows from the call sequence alone, so every rank runs the same
candidate in the same call. Before its trials a bucket runs the model's pick,
as ordinary calls, until they have cost about what the trials would, set-ups
included (SET_UP_S, MAX_DEFER): a short job never pays for measuring. `hocc tune` measures every candidate instead
(Tuner.measure_all: every algorithm, HO-Ring at several depths), ahead of a job. After the last trial each
candidate's time is the slowest rank's (one all-reduce, MAX: on CPU through the
engine's own executor, on a GPU its gloo group), the fastest wins, and the bucket runs it from then on at the
cost of a lookup. The same agreed times refit the cost model's link
parameters (hocc.plan.calibrate, CPU only), and the crossover tables of sizes
not measured yet are priced with them.

Decisions persist in a tuning file (HOCC_TUNING_FILE, hocc.engine.tuning_file)
under a key naming the group's topology, device and settings; a later job
with the same key starts from them and measures nothing it already knows.
HOCC_TUNE=0 turns trials off (the file's picks, else the model's, still
apply). Reproducibility: different algorithms add in different orders, so an
auto call's floating-point bits can change at the end of a bucket's trials,
and between jobs that tuned differently; a job that loads a tuning file
covering its sizes, or runs with HOCC_TUNE=0, picks the same plans every run.
"""

from __future__ import annotations

import contextlib
import logging
import math
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from hocc.engine.tuning_file import TuningFile
from hocc.plan.calibrate import Fit, Sample, calibrate, price
from hocc.plan.cost import CostParams
from hocc.plan.crossover import Crossover, Pick, bucket_of, human, model_pick
from hocc.plan.planner import PlannerConfig, Prediction, chunk_choices, predict_all
from hocc.plan.registry import algorithm
from hocc.plan.volumes import call_bytes
from hocc.topology import Topology

log = logging.getLogger("hocc")

# a bucket's candidates: the algorithms the model prices within TRY_WITHIN of its pick (a model off by
# less than this keeps the fastest among them; bench/results/model-picks.md has the model's misses)
TRY_WITHIN = 1.25
# HO-Ring pipeline depths `hocc tune` (measure_all) tries besides the model's own: a spread wide enough
# that a model priced for the wrong links still has the right K among them
TRIED_CHUNKS = (1, 4, 16)
# ROUNDS rounds over the candidates, each a burst of back-to-back calls worth about BURST_S of the
# fastest's predicted time (1..MAX_BURST: a single short call is noise, and a loop of short calls is what
# they serve); one round of one call when the model prices even the fastest above ONE_ROUND_ABOVE_S (large
# calls are steady, and each costs seconds)
ROUNDS = 3
# after the first round, candidates measured slower than KEEP_WITHIN x the fastest run no more trials (this
# machine's call-to-call noise at small sizes is about 1.25x: bench/results/auto-sweep, two runs of one plan)
KEEP_WITHIN = 1.5
# a bucket's trials replace the model's pick only with a rival measured more than STAY_WITHIN faster: two runs
# of one plan differ by more than that here, so a narrower win can be the trials' noise (4x2 at 200 Mbit/s,
# all_gather 1 MiB: the trials' winner then ran 40-60 ms a call where the model's pick had run 33-37 ms,
# bench/results/auto-sweep). Not where the model failed its check (its prices are wrong there), nor in
# `hocc tune`'s measure_all (every algorithm and depth, no favourite).
STAY_WITHIN = 1.05
BURST_S = 0.02
MAX_BURST = 4
ONE_ROUND_ABOVE_S = 0.25
# A bucket's trials start only once its calls, run on the model's pick, have cost about what the trials
# would (ski rental): a short job never pays for measuring, a long one measures once it can win it back.
# What trials cost: their calls at the model's prices, and SET_UP_S for each candidate's first call (its
# communicators: 81-200 ms on the emulated 4x2, bench/results/auto-sweep); at most MAX_DEFER calls first.
SET_UP_S = 0.15
MAX_DEFER = 200
# Where the model's prices are wrong, a bucket it settles alone is never measured, and one with rivals waits
# for its trials by those wrong prices (a model priced for 10 Gbit/s on 200 Mbit/s links waited 200 calls of
# a pick 4x slower than its rival at 64 KiB all_reduce). So every bucket checks the model once, first: after
# its pick's calls have cost CHECK_S (about what the check's barrier and agreement cost on a slow cluster; at
# least one call, the set-up; at most CHECK_DEFER), CHECK_CALLS of them are timed in one burst, and if the
# slowest rank's fastest of them is above CHECK_RATIO x the pick's price, the model is wrong for this cluster
# (links described wrongly: HOCC_TOPOLOGY's rates): the bucket's trials start at once, between its rivals, or
# between every algorithm the model can price where it saw none, and their times refit the model. (Widening
# a bucket with rivals to every algorithm cost more than it won in the sweep with wrong links: auto's first
# 50 calls at 64 KiB all_reduce 1.89x native's.)
# Why 6x: on the emulated 2x4 (8 ranks, 2 cores) latency-bound calls run up to about 4.5x the model's price
# when every call follows a barrier (bench/results/auto-sweep: at 4x, a 4 KiB reduce_scatter there started
# trials for nothing, its first 50 calls 1.69x native's), while a wrong link rate is off by its factor where
# bytes count (10 Gbit/s described on 200 Mbit/s: host_rails at 64 KiB priced 0.92 ms, 9.4-10 ms measured;
# native at 1 MiB on 4x2 priced 2 ms, about 80 ms).
# A check above CHECK_RATIO is taken again at once before any trial: a busy spell on a shared machine is not a wrong
# model, and the trials a failed check starts set up every candidate's communicators (2x4 with wrong links,
# all_gather 4 KiB: three check calls of 1.2-4.9 ms, 0.2-0.4 ms before and after; its first 50 calls 2.75x
# native's).
# The calls before a check: at most CHECK_DEFER (a model priced for the wrong links under-prices them, and the
# trials a failed check starts should end within a short job's first 50 calls of the size).
CHECK_CALLS = 3
CHECK_RATIO = 6.0
CHECK_S = 0.02
CHECK_DEFER = 4


@dataclass
class _Bucket:
    """One (collective, dtype, bucket)'s trials: the candidates, the call
    schedule (candidate index, timed?), and what this rank measured. The
    schedule is planned to the end of the first round; the cut (the worker,
    after that round's last call) extends it with the later rounds of the
    candidates it keeps, or decides the bucket."""

    candidates: list[Pick]
    schedule: list[tuple[int, bool, bool]]  # (candidate, timed, synced: after a barrier)
    count: int
    elem_size: int
    collective: str
    later: list[list[tuple[int, bool, bool]]] = field(default_factory=list)  # rounds after the cut, all candidates
    first: Pick | None = None  # what the calls before the trials run (the model's pick)
    deferred: int = 0  # how many calls run it before the trials start
    ran_first: int = 0
    issued: int = 0
    times: dict[int, list[float]] = field(default_factory=dict)
    agreed: dict[int, float] = field(default_factory=dict)  # candidate: the slowest rank's median, at the cut
    decided: Pick | None = None
    price: float | None = None  # a check of the model's pick (its one candidate): its price, seconds
    rivals: bool = False  # (a check) the model priced rivals within TRY_WITHIN of its pick
    replan: str | None = None  # (a check, ended) what the next call plans: 'again', 'trials', 'now' or 'wide'
    again: bool = False  # (a check) the second: the first found the pick over CHECK_RATIO x its price
    made: int = 0  # calls of this bucket's size made before this plan (its check's): counted with it
    model: int | None = None  # the candidate that is the model's pick, where the trials favour it (STAY_WITHIN)
    cut: threading.Event = field(default_factory=threading.Event)  # the schedule is final
    done: threading.Event = field(default_factory=threading.Event)

    @property
    def check(self) -> bool:
        return self.price is not None

    def release(self) -> None:
        """Decided, or failed: no caller waits on this bucket any longer."""
        self.cut.set()
        self.done.set()

    def due(self) -> bool:
        """Every call of the schedule planned so far is issued: what comes next is the worker's."""
        return self.issued >= len(self.schedule)


@dataclass(frozen=True)
class Trial:
    """A call that is one of a bucket's trials: time it, and report back (tuner.measured)."""

    tuner: Tuner
    bucket: _Bucket
    key: tuple[str, str, int]
    candidate: int
    timed: bool
    synced: bool  # start after a barrier (the first call of a burst)
    last: bool


class Tuner:
    """auto's choices for one engine under one set of planner settings.
    `agree(values)` is an all-reduce MAX over the group, run on the engine's
    worker in call order."""

    def __init__(self, topology: Topology, settings: PlannerConfig, device: str, trials: bool,
                 agree: Callable[[list[float]], list[float]], file: TuningFile | None, key: str,
                 writer: bool) -> None:
        self.topology, self.base, self.device = topology, settings, device
        self.trials = trials and topology.world_size > 1
        self.within, self.depths = TRY_WITHIN, False  # measure_all() widens both
        self.agree, self.file, self.key, self.writer = agree, file, key, writer
        self.model_topo, self.model_cfg = topology, settings  # refitted by measurements (CPU)
        self._tables: dict[tuple[str, int], Crossover] = {}
        self._buckets: dict[tuple[str, str, int], _Bucket] = {}
        self._decided: dict[tuple[str, str, int], Pick] = {}
        self._warm: set[tuple[str, str]] = set()  # (collective, algo) run by this engine
        self._samples: list[tuple[str, int, int, str, int | None, float]] = []
        self._lock = threading.Lock()
        if file is not None:
            self._decided.update(file.picks(key))
            fitted = file.fit(key)
            if fitted is not None and device == "cpu":
                self._use_fit(fitted)

    def measure_all(self) -> None:
        """Trials for every bucket, between every algorithm the model can
        price (HO-Ring at several depths): `hocc tune`, measuring ahead of a
        job. Call it before this tuner's first call."""
        self.within, self.depths = math.inf, True

    # -- the caller's side (call order) ------------------------------------------
    def pick(self, collective: str, count: int, elem_size: int, dtype: str,
             gone: Callable[[], str | None] = lambda: None) -> tuple[Pick, Trial | None]:
        """What this call runs, and the trial it is (None: not a trial).
        `gone`: why the engine can no longer run calls (None: it can); a wait
        for a decision ends with it."""
        key = (collective, dtype, bucket_of(count * elem_size))
        with self._lock:
            known = self._decided.get(key)
        if known is not None:
            return known, None
        if not self.trials:
            return self.table(collective, elem_size).pick(count * elem_size), None
        b = self._buckets.get(key)
        if b is None:
            b = self._planned(key, gone, collective, count, elem_size)
        while True:
            if b.ran_first < b.deferred and b.first is not None:  # not worth measuring yet: an ordinary call
                b.ran_first += 1
                return b.first, None
            if b.due():  # the first round issued: wait for the cut, which may decide
                self._wait_cut(b, gone)
            if b.replan is None:
                break
            # its check ended without deciding: a second check, or trials ('trials', 'now' or 'wide'), planned
            # at the same call on every rank
            b = self._planned(key, gone, collective, count, elem_size, b.replan, b.made + b.ran_first + len(b.schedule),
                              b.times.get(0))
        if b.due():  # every trial issued: wait for the worker's decision
            return self._wait(b, gone), None
        cand, timed, synced = b.schedule[b.issued]
        b.issued += 1
        return b.candidates[cand], Trial(self, b, key, cand, timed, synced, b.due())

    def lease(self, collective: str, count: int, elem_size: int, dtype: str) -> int:
        """Take, now, the calls of this size's bucket that still run the model's pick before its trials (or
        its check): a prepared call shape runs them without asking again (Engine._prepare), at the cost of
        one call each. 0: none left (settled, measuring, or no wait). Every rank makes the same calls, so every
        rank takes them at the same call and starts measuring at the same call after them."""
        b = self._buckets.get((collective, dtype, bucket_of(count * elem_size)))
        if b is None or b.first is None or b.ran_first >= b.deferred:  # the same wait as pick()'s
            return 0
        calls = b.deferred - b.ran_first
        b.ran_first = b.deferred
        return calls

    def settled(self, collective: str, count: int, elem_size: int, dtype: str) -> bool:
        """Whether every later call of this shape picks what pick() answers now: its bucket is decided
        (decisions are final), or there are no trials (the table's pick stands)."""
        if not self.trials:
            return True
        with self._lock:
            return (collective, dtype, bucket_of(count * elem_size)) in self._decided

    def peek(self, collective: str, count: int, elem_size: int, dtype: str) -> Pick:
        """What a call of this size would run once its bucket is decided (its
        measured pick if it is, the table's if not), without taking a trial."""
        with self._lock:
            known = self._decided.get((collective, dtype, bucket_of(count * elem_size)))
        return known if known is not None else self.table(collective, elem_size).pick(count * elem_size)

    def _planned(self, key: tuple[str, str, int], gone: Callable[[], str | None], collective: str, count: int,
                 elem_size: int, mode: str = "", made: int = 0, seen: list[float] | None = None) -> _Bucket:
        """The bucket's new plan (_plan_trials), kept; one the model settles is decided at once."""
        self._wait_due(gone)
        b = self._buckets[key] = self._plan_trials(collective, count, elem_size, mode, made, seen)
        if b.decided is not None:  # settled by the model: no trials
            with self._lock:
                self._decided[key] = b.decided
        return b

    def _wait_due(self, gone: Callable[[], str | None]) -> None:
        """Before a bucket's trials are planned: a decision refits the model that plans them, so wait for
        every decision already due (all its trials issued), and every rank plans with the same model
        whatever its worker's pace."""
        for other in list(self._buckets.values()):
            if other.due():
                self._wait_cut(other, gone)
                if other.due() and other.replan is None:  # an ended check is planned again at its next call
                    self._wait(other, gone)

    @staticmethod
    def _wait_cut(b: _Bucket, gone: Callable[[], str | None]) -> None:
        """Wait for the cut (the worker's, after the first round): then b.schedule is final, or b is decided."""
        while not b.cut.wait(0.5) and gone() is None:
            pass
        if not b.cut.is_set():
            raise RuntimeError(f"hocc: tuning {b.collective} at {human(b.count * b.elem_size)} per rank failed: "
                               "see the group's first failure")

    @staticmethod
    def _wait(b: _Bucket, gone: Callable[[], str | None]) -> Pick:
        while not b.done.wait(0.5) and gone() is None:
            pass
        if b.decided is None:
            raise RuntimeError(f"hocc: tuning {b.collective} at {human(b.count * b.elem_size)} per rank failed: "
                               "see the group's first failure")
        return b.decided

    def table(self, collective: str, elem_size: int) -> Crossover:
        """The model's crossover table for (collective, element size), made once."""
        with self._lock:
            t = self._tables.get((collective, elem_size))
            if t is None:
                t = self._tables[(collective, elem_size)] = Crossover(collective, elem_size, self.model_topo,
                                                                      self.model_cfg)
            return t

    def _plan_trials(self, collective: str, count: int, elem_size: int, mode: str = "",
                     made: int = 0, seen: list[float] | None = None) -> _Bucket:
        """A bucket's plan. First (mode ''): a check of the model's pick (its calls, then CHECK_CALLS timed);
        hocc tune's (measure_all) plans trials between every algorithm instead, at once. After a check
        (`made` calls made): 'again', a second check at once (the first found the pick over CHECK_RATIO x its
        price); 'trials', the pick and its rivals (priced within self.within) after the pick's calls worth
        them; 'now', the same at once (both checks found the model wrong here, so are its prices of waiting);
        'wide', every algorithm the model can price, at once (it saw no rival). `seen`: the check's timed
        calls of the pick, which stand for its first round (a pick found 6x its price is not run again to
        learn that it is slow)."""
        wide = mode == "wide" or self.depths
        preds = predict_all(collective, count, elem_size, self.model_topo, self.model_cfg)
        model = model_pick(collective, count, elem_size, self.model_topo, self.model_cfg)
        bar = preds[model.algo].seconds * (math.inf if wide else self.within)
        cands = []
        for name, pred in preds.items():  # the algorithms that can run and the model cannot rule out
            if name != model.algo and not pred.seconds <= bar:
                continue
            if not algorithm(name).chunked:
                cands.append(Pick(name, None, "trial"))
                continue
            ks = {pred.chunks}
            if self.depths:  # measure_all: several K
                total = int(call_bytes(collective, count, elem_size, self.topology.world_size))
                allowed = chunk_choices(count, elem_size, self.base, total)
                ks |= {max(allowed)} | {k for k in TRIED_CHUNKS if k in allowed}
            if self.base.chunks is not None:  # HOCC_CHUNKS fixes K
                ks = {self.base.chunks}
            cands += [Pick(name, k, "trial") for k in sorted(ks)]
        price = preds[model.algo].seconds
        if mode in ("", "again") and not wide:
            # its pick's calls until they have cost CHECK_S (the first sets it up), then CHECK_CALLS timed; a
            # check again (the first failed) times CHECK_CALLS more at once
            first = 0 if mode else min(CHECK_DEFER, max(1, math.ceil(CHECK_S / max(price, 1e-6))))
            self._warm.add((collective, model.algo))
            rivals = "no other within" if len(cands) == 1 else "rivals within"
            return _Bucket([Pick(model.algo, model.chunks, model.why)], [(0, True, j == 0) for j in range(CHECK_CALLS)],
                           count, elem_size, collective, deferred=first, price=price, again=mode == "again",
                           rivals=len(cands) > 1, first=Pick(model.algo, model.chunks, f"{model.why} ({rivals} "
                                                             f"{self.within:g}x; checked from its call {first + 1})"))
        if len(cands) == 1:
            b = _Bucket(cands, [], count, elem_size, collective, decided=Pick(
                model.algo, model.chunks, f"{model.why} (no other within {self.within:g}x: not measured)"))
            b.release()
            return b
        # warm-ups first, then rounds over every candidate (interleaved: a slow spell hits all alike), each a
        # burst of back-to-back calls started together (how a loop of such calls runs); the rounds after the
        # first are the cut's to schedule
        # (by default) the calls before them run the model's pick, which sets up its communicators on the way
        defer = mode == "trials"
        if defer:
            self._warm.add((collective, model.algo))
        schedule: list[tuple[int, bool, bool]] = []
        rounds, burst = _rounds([_predicted(preds, c) for c in cands])
        set_ups = 0
        for i, c in enumerate(cands):
            if (collective, c.algo) not in self._warm:
                set_ups += 1
                if rounds > 1:  # a call of seconds: set-up is noise
                    self._warm.add((collective, c.algo))
                    schedule.append((i, False, False))
        per_round = [[(i, True, j == 0) for i in range(len(cands)) for j in range(burst)] for _ in range(rounds)]
        pick = next((i for i, c in enumerate(cands) if (c.algo, c.chunks) == (model.algo, model.chunks)), None)
        if seen and pick is not None:  # the check timed the pick: that is its first round
            per_round[0] = [e for e in per_round[0] if e[0] != pick]  # (each burst starts after a barrier)
        b = _Bucket(cands, schedule + per_round[0], count, elem_size, collective, later=per_round[1:], made=made)
        if seen and pick is not None:
            b.times[pick] = list(seen)
        if mode == "trials":  # after a check that found the model right (a failed one: its prices are wrong)
            b.model = pick
        if defer:
            cost = sum(_predicted(preds, cands[i]) for i, _, _ in schedule + [e for r in per_round for e in r])
            cost += SET_UP_S * set_ups
            b.deferred = max(0, min(MAX_DEFER, math.ceil(cost / max(price, 1e-6))) - made)
            b.first = Pick(model.algo, model.chunks,
                           f"{model.why} (measured from this size's call {made + b.deferred + 1})")
        return b

    # -- the worker's side (call order) ------------------------------------------
    def measured(self, trial: Trial, seconds: float) -> None:
        """A trial call ran in `seconds` on this rank; after the first round's
        last, cut (or decide); after the bucket's last, decide."""
        b = trial.bucket
        if trial.timed:
            b.times.setdefault(trial.candidate, []).append(seconds)
        if not trial.last:
            return
        try:
            if not b.cut.is_set():
                self._cut(trial.key, b)
            else:
                self._decide(trial.key, b, self._agreed(b, [i for i in range(len(b.candidates)) if i in b.times
                                                            and i not in b.agreed]))
        finally:
            if b.decided is not None or not b.cut.is_set():  # decided, or failed
                b.release()

    def _agreed(self, b: _Bucket, which: list[int]) -> dict[int, float]:
        """The slowest rank's median call of each of these candidates (one all-reduce: every rank gets the
        same); a check's fastest call (waiting for a late rank is not the algorithm's cost)."""
        stat = min if b.check else statistics.median
        slowest = self.agree([stat(b.times[i]) for i in which])
        return dict(zip(which, slowest, strict=True))

    def _cut(self, key: tuple[str, str, int], b: _Bucket) -> None:
        """After the first round: keep the candidates within KEEP_WITHIN of the
        fastest for the later rounds, or decide now (one left, or no later round)."""
        first = self._agreed(b, list(range(len(b.candidates))))
        if b.price is not None:  # a check
            self._checked(key, b, first[0], b.price)
            return
        fastest = min(first.values())
        keep = [i for i, t in first.items() if t <= fastest * KEEP_WITHIN]
        if len(keep) == 1 or not b.later:
            self._decide(key, b, first)
            return
        b.agreed = {i: t for i, t in first.items() if i not in keep}  # the dropped keep their first round's time
        b.schedule = b.schedule + [e for r in b.later for e in r if e[0] in keep]
        b.cut.set()

    def _checked(self, key: tuple[str, str, int], b: _Bucket, took: float, price: float) -> None:
        """A check's agreed time against its price: the model is wrong here (trials next, at once: its
        rivals', or every algorithm's where it saw none), or right (its pick kept, or its rivals' trials
        when worth them)."""
        if took > price * CHECK_RATIO and not b.again:  # once more first: a busy spell is not a wrong model
            b.replan = "again"
        elif took > price * CHECK_RATIO:
            log.info("hocc tuning: %s %s bucket %d: %s took %.3f ms, the model priced %.3f ms: measuring now",
                     key[0], key[1], key[2], _label(b.candidates[0]), took * 1e3, price * 1e3)
            b.replan = "now" if b.rivals else "wide"
        elif b.rivals:
            b.replan = "trials"
        else:
            pick = b.candidates[0]  # its why: the model's
            b.decided = Pick(pick.algo, pick.chunks, f"{pick.why} (no other within {self.within:g}x; checked: "
                                                     f"{took * 1e3:.3f} ms measured, {price * 1e3:.3f} ms priced)")
            with self._lock:
                self._decided[key] = b.decided
        b.cut.set()

    def _decide(self, key: tuple[str, str, int], b: _Bucket, last: dict[int, float]) -> None:
        """Decide the bucket: the fastest of the candidates timed to the end (`last`, agreed)."""
        times = {**b.agreed, **last}
        best = min(last, key=lambda i: (last[i], i))
        stayed = False
        if b.model is not None and b.model != best and last.get(b.model, math.inf) <= last[best] * STAY_WITHIN:
            best, stayed = b.model, True  # a rival within the spread of two runs does not unseat the model's pick
        won = b.candidates[best]
        why = "measured: " + ", ".join(f"{_label(c)} {times[i] * 1e3:.3f} ms"
                                       + (" (dropped after round 1)" if i in b.agreed else "")
                                       for i, c in enumerate(b.candidates))
        if stayed:
            why += f"; the model's pick stays (within {STAY_WITHIN:g}x of the fastest)"
        pick = Pick(won.algo, won.chunks, why)
        b.decided = pick
        with self._lock:
            self._decided[key] = pick
        self._samples += [(key[0], b.count, b.elem_size, c.algo, c.chunks, times[i])
                          for i, c in enumerate(b.candidates)]
        log.info("hocc tuning: %s %s bucket %d: %s -> %s", key[0], key[1], key[2], why, _label(pick))
        fit = self._refit()
        if self.file is not None and self.writer:
            self.file.save(self.key, {f"{k[0]}/{k[1]}/{k[2]}": p for k, p in self._decided.items()
                                      if p.why.startswith("measured")}, fit)

    def _refit(self) -> dict[str, Any] | None:
        """Fit the CPU cost model to every agreed time so far; the tables of
        sizes not measured yet are priced with it. The GPU model (NCCL's
        algorithms) is not what hocc.plan.calibrate fits, so GPUs keep it."""
        if self.device != "cpu" or len({s[1] for s in self._samples}) < 2:
            return None
        samples = []
        for op, count, elem, algo, chunks, secs in self._samples:
            cost, k = price(op, algo, count, elem, self.topology, self.base, chunks)
            samples.append(Sample("tuning", self.topology, op, count * elem, algo, secs, cost, k))
        fit = calibrate(samples, iterations=20)
        fitted = {"efficiency": fit.efficiency, "latency": fit.latency, "params": fit.params.to_dict(),
                  "rms_log": fit.rms_log}
        self._use_fit(fitted)
        return fitted

    def _use_fit(self, fitted: dict[str, Any]) -> None:
        fit = Fit(fitted["efficiency"], fitted["latency"], CostParams.from_dict(fitted["params"]))
        topo = Topology(self.topology.host_infos(), fit.links_for(self.topology.links))
        with self._lock:
            self.model_topo, self.model_cfg = topo, replace(self.base, params=fit.params)
            self._tables.clear()

    def trial_calls(self, key: tuple[str, str, int]) -> int | None:
        """How many calls a bucket's trials take (warm-ups and its check's timed calls included; None: no
        call of it yet, or it came from the tuning file)."""
        b = self._buckets.get(key)
        return None if b is None else b.made + len(b.schedule)

    def calls_before_trials(self, key: tuple[str, str, int]) -> int | None:
        """How many of a bucket's calls run the model's pick before its trials (None: no call of it yet)."""
        b = self._buckets.get(key)
        return None if b is None else b.deferred

    def decided(self) -> dict[tuple[str, str, int], Pick]:
        with self._lock:
            return dict(self._decided)


@contextlib.contextmanager
def timed(device: torch.device) -> Iterator[Callable[[], float]]:
    """Seconds the block took: wall time on CPU; on a GPU, from events on the
    current stream (waited for: trials are few)."""
    secs = [0.0]
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        yield lambda: secs[0]
        end.record()
        end.synchronize()
        secs[0] = start.elapsed_time(end) / 1e3
    else:
        t0 = time.perf_counter()
        yield lambda: secs[0]
        secs[0] = time.perf_counter() - t0


def _rounds(predicted: list[float]) -> tuple[int, int]:
    """(rounds, calls per burst) for candidates the model prices at `predicted`."""
    fastest = max(min(predicted), 1e-6)
    if fastest > ONE_ROUND_ABOVE_S:
        return 1, 1
    return ROUNDS, max(1, min(MAX_BURST, math.ceil(BURST_S / fastest)))


def _predicted(preds: dict[str, Prediction], c: Pick) -> float:
    p = preds.get(c.algo)
    return p.seconds if p is not None else 0.0


def _label(p: Pick) -> str:
    return f"{p.algo}@{p.chunks}" if algorithm(p.algo).chunked else p.algo
