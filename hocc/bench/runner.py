"""The per-rank benchmark loop: sizes outer, algorithms interleaved inside,
warm-up, timed iterations, an optional correctness pass, and one row per
(op, size, algo) agreed across ranks."""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, overload

import torch
import torch.distributed as dist

import hocc
from hocc.bench.collectives import COLLECTIVES, BenchCollective, bandwidths

MAX_TRIAL_CALLS = 500  # a bucket decides far sooner (MAX_DEFER calls, then its trials: hocc.engine.tuning)


@dataclass
class Row:
    op: str
    size: int
    count: int
    dtype: str
    redop: str
    algo: str
    ran: str  # the algorithm that ran (what auto picked, or a fallback)
    time_us: float
    algbw: float
    busbw: float
    wrong: int
    spread: float  # (max - min) / median of the per-iteration times, on the reporting rank
    # --skew: per timed iteration, how much later than the first rank each rank began the call
    skew_us: float | None = None  # median over iterations of the latest rank's lateness
    late_us: list[float] | None = None  # each rank's mean lateness
    late_rank: int | None = None  # the rank with the largest mean lateness
    # auto: the calls of this size that were its trials (0 where the model settled
    # it), and their seconds on the slowest rank. time_us is auto after them, as a user meets it from then on
    trial_calls: int | None = None
    trial_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class BenchSpec:
    ops: tuple[str, ...]
    sizes: tuple[int, ...]
    algos: tuple[str, ...]
    dtype: torch.dtype
    redop: str
    iters: int
    warmup: int
    check: int
    average: int  # nccl-tests -a: 0 rank 0, 1 mean, 2 min, 3 max over ranks
    skew: bool = False  # record each rank's arrival (wall clock) at every timed call


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _combine(t: float, how: int, device: torch.device) -> float:
    world = dist.get_world_size()
    x = torch.tensor([t], dtype=torch.float64, device=device)
    if how == 0:
        dist.broadcast(x, 0)
        return float(x.item())
    op = {1: dist.ReduceOp.SUM, 2: dist.ReduceOp.MIN, 3: dist.ReduceOp.MAX}[how]
    dist.all_reduce(x, op=op)
    return float(x.item()) / (world if how == 1 else 1)


@overload
def slowest(seconds: float) -> float: ...
@overload
def slowest(seconds: Sequence[float]) -> list[float]: ...
@overload
def slowest(seconds: torch.Tensor) -> torch.Tensor: ...
def slowest(seconds: float | Sequence[float] | torch.Tensor) -> float | list[float] | torch.Tensor:
    """The slowest rank's `seconds` (an all-reduce MAX over the default group, on the CPU): a call's or a
    job's time, as the scripts in bench/ report it. Several figures go in one all-reduce, each its own
    maximum: a list gives a list; a CPU tensor is reduced in place and returned."""
    if isinstance(seconds, torch.Tensor):
        dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
        return seconds
    if isinstance(seconds, Sequence):
        x = torch.tensor(seconds, dtype=torch.float64)
        dist.all_reduce(x, op=dist.ReduceOp.MAX)
        return x.tolist()
    return _combine(seconds, 3, torch.device("cpu"))


def run_one(spec: BenchSpec, op: str, size: int, algo: str, device: torch.device) -> Row:
    coll = COLLECTIVES[op]
    world, rank = dist.get_world_size(), dist.get_rank()
    inp, out = coll.buffers(size, spec.dtype, world, rank, device)
    redop = spec.redop if coll.reduces else "none"
    trial_calls = trial_s = None
    if algo == "auto":
        trial_calls, secs = _until_decided(coll, size, spec, device)
        trial_s = _combine(secs, 3, device)
    wrong = 0
    if spec.check:
        coll.launch(inp, out, spec.redop, algo)
        _sync(device)
        wrong = coll.wrong(out, spec.redop, world, rank)
        inp, out = coll.buffers(size, spec.dtype, world, rank, device)
    for _ in range(spec.warmup):
        coll.launch(inp, out, spec.redop, algo)
    _sync(device)
    dist.barrier()
    times = []
    arrivals = []
    for _ in range(spec.iters):
        if spec.skew:
            arrivals.append(time.time_ns())
        start = time.perf_counter()
        coll.launch(inp, out, spec.redop, algo)
        _sync(device)
        times.append(time.perf_counter() - start)
    med = statistics.median(times) if times else 0.0
    spread = (max(times) - min(times)) / med if med > 0 else 0.0
    t = _combine(med, spec.average, device)
    wrong_t = torch.tensor([wrong], dtype=torch.int64, device=device)
    dist.all_reduce(wrong_t)
    nbytes = max(inp.numel(), out.numel()) * inp.element_size()
    algbw, busbw = bandwidths(op, nbytes, t, world)
    plan = hocc.last_plan(device=device.type)
    ran = plan.algo if plan is not None else algo
    row = Row(op, nbytes, max(inp.numel(), out.numel()), str(spec.dtype).replace("torch.", ""), redop,
              algo, ran, t * 1e6, algbw, busbw, int(wrong_t.item()), spread)
    if spec.skew and arrivals:
        row.skew_us, row.late_us, row.late_rank = _skew(arrivals, world)
    row.trial_calls, row.trial_s = trial_calls, trial_s
    return row


def _until_decided(coll: BenchCollective, size: int, spec: BenchSpec, device: torch.device) -> tuple[int, float]:
    """auto's first calls of a size: run it until the engine has decided the
    size's bucket (its trials, if the model could not tell its candidates
    apart), as nccl-tests reports a warmed algorithm. (trial calls, the
    trials' seconds) on this rank; (0, 0.0) where nothing was measured. The
    calls that run the model's pick before the trials (hocc.engine.tuning, MAX_DEFER) are
    neither.
    Every rank stops after the same call: a trial's decision is made inside
    the call that ends the trials."""
    from hocc.engine.group_engines import get_engine
    from hocc.executor.cpp_form import dtype_name
    from hocc.plan.crossover import bucket_of

    world, rank = dist.get_world_size(), dist.get_rank()
    inp, out = coll.buffers(size, spec.dtype, world, rank, device)
    tuner = get_engine(dist.group.WORLD, device).tuner()  # type: ignore[arg-type]
    key = (coll.name, dtype_name(inp.dtype), bucket_of(min(inp.numel(), out.numel()) * inp.element_size()))
    calls, start = 0, None
    while key not in tuner.decided() and calls < MAX_TRIAL_CALLS:
        before = tuner.calls_before_trials(key)
        if start is None and before is not None and calls >= before:  # the trials' time, not the pick's calls before
            _sync(device)
            start = time.perf_counter()
        coll.launch(inp, out, spec.redop, "auto")
        calls += 1
    _sync(device)
    trials = tuner.trial_calls(key) or 0  # settled by the model (or the tuning file): its first call was no trial
    return trials, time.perf_counter() - start if trials and start is not None else 0.0


def _skew(arrivals: list[int], world: int) -> tuple[float, list[float], int]:
    """Every rank's arrivals gathered (outside the timed loop, on the CPU): per iteration, each rank's lateness
    after the first; the median of the worst, each rank's mean, and the latest rank. Wall clocks: across hosts as
    good as their sync."""
    mine = torch.tensor(arrivals, dtype=torch.int64)
    every = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(every, mine, group=_cpu_group())
    grid = torch.stack(every).to(torch.float64)  # [rank, iteration]
    late = (grid - grid.min(dim=0).values) / 1e3  # us
    per_rank = late.mean(dim=1)
    return float(late.max(dim=0).values.median()), [float(x) for x in per_rank], int(per_rank.argmax())


_gloo: Any = None


def _cpu_group() -> Any:
    """The world on gloo, for CPU tensors whatever the default backend (NCCL takes only CUDA ones)."""
    global _gloo
    if dist.get_backend() == "gloo":
        return None
    if _gloo is None:
        _gloo = dist.new_group(backend="gloo")
    return _gloo


def run_bench(spec: BenchSpec, device: torch.device, progress: bool = True) -> list[Row]:
    rows: list[Row] = []
    total = len(spec.ops) * len(spec.sizes)
    done = 0
    for op in spec.ops:
        for size in spec.sizes:
            done += 1
            if progress and dist.get_rank() == 0:
                print(f"# [{done}/{total}] {op} {size} B", file=sys.stderr, flush=True)
            for algo in spec.algos:
                rows.append(run_one(spec, op, size, algo, device))
    return rows
