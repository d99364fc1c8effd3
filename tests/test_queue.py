"""The engine's call queue (hocc/engine/queue.py, csrc/executor/call_queue.h):
queued calls run in the order they were made whether they run with no Python
(a plain plan run) or with Python around the run; a queued run's failure, or
one raised around it, reaches every
rank, and the calls queued after it fail without touching their tensors; an
abort drops what has not begun; the watchdog ends a queued run that waits on
a healthy peer."""

from __future__ import annotations

import os
import time
from typing import Any

import pytest
import torch
import torch.distributed as dist

import hocc
from hocc.engine.group_engines import find_engine
from hocc.executor import load
from tests.worlds import hocc_env, run_world

CPU = torch.device("cpu")


def _engine() -> Any:
    e = find_engine(dist.group.WORLD, CPU)
    assert e is not None
    return e


def _count_pushes(engine: Any, ways: tuple[str, ...] = ("push_run",)) -> dict[str, int]:
    """How many calls took each way onto the queue (the real methods still run), and in "around" how
    many of them had Python around their run."""
    counts = dict.fromkeys((*ways, "around"), 0)
    for name in ways:
        real = getattr(engine._queue, name)

        def spy(*args: Any, _real: Any = real, _name: str = name, **kw: Any) -> Any:
            counts[_name] += 1
            counts["around"] += kw.get("around", args[-1] if len(args) > 8 else None) is not None
            return _real(*args, **kw)

        setattr(engine._queue, name, spy)
    return counts


def _in_order_body(rank: int, world: int) -> None:
    sizes = (1, 7, 1000, 4099)  # tiny frames, a ring of a few elements, a few pieces
    for n in sizes:  # set-up of every plan these calls use, done on the caller's thread
        hocc.all_reduce(torch.ones(n))
        hocc.all_gather_into_tensor(torch.empty(n * world), torch.ones(n))
        hocc.reduce_scatter_tensor(torch.empty(n), torch.ones(n * world))
    counts = _count_pushes(_engine())
    calls: list[tuple[Any, torch.Tensor, torch.Tensor]] = []
    checked_all = 0
    for i in range(48):
        n = sizes[i % len(sizes)]
        if i % 11 == 5:  # HOCC_CHECK=all needs Python around the run, on the worker, between plain runs
            hocc.configure(check="all")
            checked_all += 1
        kind = i % 3
        if kind == 0:
            t = torch.full((n,), float(rank + i))
            w = hocc.all_reduce(t, async_op=True)
            want = torch.full((n,), float(sum(r + i for r in range(world))))
        elif kind == 1:
            t = torch.empty(n * world)
            w = hocc.all_gather_into_tensor(t, torch.full((n,), float(rank * 100 + i)), async_op=True)
            want = torch.cat([torch.full((n,), float(r * 100 + i)) for r in range(world)])
        else:
            t = torch.empty(n)
            inp = torch.cat([torch.full((n,), float(rank + j + i)) for j in range(world)])
            w = hocc.reduce_scatter_tensor(t, inp, async_op=True)
            want = torch.full((n,), float(sum(r + rank + i for r in range(world))))
        hocc.configure(check="comm")
        calls.append((w, t, want))
        if i == 30:  # a sync call behind queued ones waits its turn
            s = torch.full((5,), float(rank))
            hocc.all_reduce(s)
            assert torch.all(s == sum(range(world)))
            assert all(c[0].is_completed() for c in calls), "a sync call returned before the calls queued before it"
    for i, (w, t, want) in enumerate(calls):
        assert w.wait()
        assert torch.equal(t, want), (i, t[:4], want[:4])
        if i:
            assert calls[i - 1][0].is_completed()
    assert counts["around"] == checked_all, counts  # every call one item, its run: some with Python around
    assert counts["push_run"] in (len(calls), len(calls) + 1), counts  # and the sync call, if it found calls queued


@pytest.mark.parametrize("host", ["shm", "net"])
def test_queued_calls_run_in_order(host: str) -> None:
    # HOCC_TUNE=0: the test counts the calls that have Python around their run, as a tuning trial does
    # (it is timed and reported there), so auto must run the model's picks without trials
    run_world(3, _in_order_body, env={**hocc_env("3", host), "HOCC_TUNE": "0"})


def _failure_body(rank: int, world: int) -> None:
    # ring: every wait is a point-to-point one that an abort wakes (a rank inside gloo's own all-reduce
    # waits for the group's timeout, docs/failures.md)
    hocc.configure(algo="ring")
    hocc.all_reduce(torch.ones(1000))
    a, b, c = torch.ones(1000), torch.ones(1000 if rank != 1 else 999), torch.ones(1000)
    start = time.monotonic()
    works = [hocc.all_reduce(t, async_op=True) for t in (a, b, c)]
    assert works[0].wait() and torch.all(a == world)
    with pytest.raises(hocc.CollectiveError, match="disagree"):
        works[1].wait()
    with pytest.raises(hocc.CollectiveError, match="failed earlier"):
        works[2].wait()
    assert torch.all(c == 1.0), "a call queued after the failure touched its tensor"
    assert works[1].exception() is not None and not works[1].is_success()
    assert time.monotonic() - start < 20, "the ranks waited for a timeout instead of seeing the mismatch"
    with pytest.raises(hocc.CollectiveError, match="failed earlier"):
        hocc.all_reduce(torch.ones(3))
    dist.barrier()  # nobody leaves (closing its connections) before every rank has heard why


def test_a_queued_failure_reaches_every_rank() -> None:
    run_world(3, _failure_body, env=hocc_env("3", "net"), timeout_s=60)


def _around_failure_body(rank: int, world: int, async_op: bool) -> None:
    hocc.configure(algo="ring")
    hocc.all_reduce(torch.ones(10))  # makes the engine; an all_gather's plan needs its set-up, Python around its run
    if rank == 1:
        def refuse(groups: Any) -> None:
            raise RuntimeError("set-up refused by the test")

        _engine().comms.prepare = refuse
    out = torch.full((999 * world,), -1.0)
    with pytest.raises(hocc.CollectiveError) as failed:
        w = hocc.all_gather_into_tensor(out, torch.full((999,), float(rank)), async_op=async_op)
        assert w is not None and async_op, f"rank {rank}: the call did not fail"
        w.wait()
    assert torch.all(out == -1.0), f"rank {rank}'s output changed in a failed call"
    if rank == 1:  # what the Python around the run raised is the call's failure, named as the executor's are
        assert "set-up refused by the test" in str(failed.value), failed.value
        assert isinstance(failed.value.__cause__, RuntimeError), repr(failed.value.__cause__)
    with pytest.raises(hocc.CollectiveError, match="failed earlier"):
        hocc.all_reduce(torch.ones(10))


@pytest.mark.parametrize("async_op", [False, True])
def test_a_failure_around_the_run_fails_the_call(async_op: bool) -> None:
    run_world(3, _around_failure_body, async_op, env=hocc_env("3", "net"), timeout_s=90)


def _watchdog_body(rank: int, world: int) -> None:
    hocc.configure(algo="ring")  # point-to-point waits, which an abort wakes
    x = torch.full((4096,), float(rank))
    hocc.all_reduce(x.clone())
    if rank == 2:  # fails before it sends a byte: its ring successor waits on a healthy rank
        _engine().inject_fault(0, "raise")
    start = time.monotonic()
    before = x.clone()
    w = hocc.all_reduce(x, async_op=True)
    with pytest.raises(hocc.CollectiveError) as failed:
        w.wait()
    took = time.monotonic() - start
    assert took < 15, f"rank {rank} waited {took:.1f} s: the watchdog did not end the queued run"
    assert torch.equal(x, before), f"rank {rank}'s tensor changed in a failed call"
    err = failed.value  # where it failed, as fields (the executor's, not parsed from the text)
    if rank == 2:
        assert (err.stage, err.chunk, err.peers) == (0, 0, (0, 1, 2)) and err.tier, err.at
        assert "fault injected" in err.cause and f"at stage 0 ({err.tier}), chunk 0" in str(err), err
    else:  # woken by the failure: in the same step, or before it (the watchdog's abort)
        assert err.stage in (0, None) and (err.stage is None or err.peers == (0, 1, 2)), err.at


def test_the_watchdog_ends_a_queued_run() -> None:
    run_world(3, _watchdog_body, env=hocc_env("3", "net"), timeout_s=60)


def _hook_body(rank: int, world: int) -> None:
    hocc.configure(algo="ring")
    x = torch.full((100,), float(rank))
    hocc.all_reduce(x)
    seen: list[int] = []
    _engine().inject_fault(0, "call", lambda: seen.append(rank))  # called mid-call, then the call goes on
    x = torch.full((100,), float(rank))
    hocc.all_reduce(x)
    assert seen == [rank] and torch.all(x == sum(range(world))), (seen, x)
    with pytest.raises(RuntimeError, match="a 'call' fault takes a hook"):
        _engine().inject_fault(0, "call")
    with pytest.raises(RuntimeError, match="unknown fault"):
        _engine().inject_fault(0, "run:true")  # no shell commands: the library runs none
    if rank == 1:  # a hook that raises: this rank's step fails with its error, every rank raises
        _engine().inject_fault(0, "call", lambda: 1 / 0)
    with pytest.raises(hocc.CollectiveError) as failed:
        hocc.all_reduce(torch.ones(100))
    assert rank != 1 or "hook raised" in str(failed.value), failed.value


def test_a_fault_hook_runs_mid_call() -> None:
    run_world(2, _hook_body, env=hocc_env("2", "net"), timeout_s=60)


def _prepared_body(rank: int, world: int) -> None:
    hocc.configure(algo="ring")
    hocc.all_reduce(torch.ones(1))  # makes the engine
    eng = _engine()
    here = _count_pushes(eng, ("push_run", "run_here", "push_prepared"))
    calls = {  # a call on fresh tensors each time, and what it must give
        "all_reduce": lambda i: _check(lambda x: hocc.all_reduce(x), torch.full((7,), float(rank + i)),
                                       torch.full((7,), float(sum(range(world)) + world * i))),
        "all_gather": lambda i: _check(lambda x: hocc.all_gather_into_tensor(x, torch.full((3,), float(rank + i))),
                                       torch.zeros(3 * world),
                                       torch.arange(world).float().add(i).repeat_interleave(3)),
        "reduce_scatter": lambda i: _check(lambda x: hocc.reduce_scatter_tensor(x, torch.full((2 * world,),
                                                                                              float(rank + i))),
                                           torch.zeros(2), torch.full((2,), float(sum(range(world)) + world * i))),
    }
    for name, call in calls.items():
        call(0), call(1)  # the first sets its communicators up; the second runs plain, then is prepared
        assert any(k[0] == name for k in eng._prepared), eng._prepared
        before = dict(here)
        for i in range(2, 5):  # new buffers and values each time: the prepared run takes them
            call(i)
        assert here == before, f"a prepared {name} went through the engine's queue wrapper: {here} vs {before}"
    # async calls of a prepared shape are its run queued (one crossing each), in order with the sync ones
    before = dict(here)
    outs = [(hocc.all_reduce(x, async_op=True), x, i) for i, x in ((i, torch.full((7,), float(rank + i)))
                                                                  for i in range(5, 9))]
    calls["all_reduce"](9)
    for w, x, i in outs:
        assert w is not None and w.wait() and torch.all(x == sum(range(world)) + world * i), (i, x)
    assert here["push_prepared"] - before["push_prepared"] >= 4 and here["push_run"] == before["push_run"], here
    seqs = [c[0] for c in eng.recorder.calls]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), seqs  # prepared calls are recorded, in order
    # what the short way's key does not hold goes the full way: another op, a strided tensor, new settings
    x = torch.full((7,), float(rank))
    hocc.all_reduce(x, op=dist.ReduceOp.MAX)
    assert torch.all(x == world - 1), x
    with pytest.raises(hocc.HoccError, match="not contiguous"):
        hocc.all_reduce(torch.zeros(14)[::2])
    hocc.configure(algo="native")
    x = torch.full((7,), float(rank))
    hocc.all_reduce(x)
    assert torch.all(x == sum(range(world))) and hocc.last_plan().algo == "native"  # type: ignore[union-attr]
    hocc.configure(algo="ring")
    calls["all_reduce"](0), calls["all_reduce"](1)  # prepared again under these settings
    before = dict(here)
    calls["all_reduce"](2)
    assert here == before, (here, before)
    x = torch.full((7,), float(rank))  # a prepared call that fails
    if rank == 1:
        eng.inject_fault(0, "raise")
    with pytest.raises(hocc.CollectiveError) as failed:
        hocc.all_reduce(x)
    assert torch.all(x == rank), "a failed prepared call wrote its tensor"
    assert "all_reduce of 7 float32" in str(failed.value), failed.value
    assert not eng._prepared  # a failed group keeps nothing to run, nor does the API's table (hocc.api.repeat)
    assert load().repeat_size() == 0, "the table of repeated calls still holds a failed engine's runs"
    with pytest.raises(hocc.CollectiveError, match="failed earlier"):
        hocc.all_reduce(x)


def _check(call: Any, out: torch.Tensor, want: torch.Tensor) -> None:
    call(out)
    assert torch.equal(out, want), (out, want)


def test_a_repeated_call_is_prepared() -> None:
    """A sync call of a shape that ran plain before is one crossing into C++ (Engine._prepared): right on
    new buffers every time, recorded, and failing as any call does."""
    run_world(2, _prepared_body, env=hocc_env("2", "net"), timeout_s=60)


def _abort_body(rank: int, world: int) -> None:
    hocc.all_reduce(torch.ones(1000))
    dist.barrier()
    if rank == 0:  # rank 1 never joins these: the first waits on it, the rest wait in the queue
        ts = [torch.ones(1000) for _ in range(4)]
        works = [hocc.all_reduce(t, async_op=True) for t in ts]
        time.sleep(0.3)
        _engine().abort("aborted by the test")
        for w in works:
            with pytest.raises(RuntimeError, match="abort"):
                w.wait()
        assert all(torch.all(t == 1.0) for t in ts[1:]), "a dropped call touched its tensor"
        assert all(not w.is_success() for w in works)
    dist.barrier()


def test_abort_drops_queued_calls() -> None:
    run_world(2, _abort_body, env=hocc_env("2", "net"), timeout_s=60)


_EXITING_RANK = """
import os, sys, time
from datetime import timedelta
import torch, torch.distributed as dist
import hocc
rank = int(sys.argv[1])
dist.init_process_group("gloo", rank=rank, world_size=2, timeout=timedelta(seconds=60))
hocc.all_reduce(torch.ones(1 << 16))
dist.barrier()
if rank == 0:
    ts = [torch.full((1 << 16,), float(i)) for i in range(8)]
    works = [hocc.all_reduce(t, async_op=True) for t in ts]
    sys.exit(0)  # queued calls not waited for: the exit hook runs them, as the peer expects
time.sleep(0.5)
for i in range(8):
    t = torch.full((1 << 16,), float(i))
    hocc.all_reduce(t)
    assert torch.all(t == 2 * i), (i, t[:3])
print("rank 1: 8 calls matched", flush=True)
"""


@pytest.mark.parametrize("host", ["shm", "net"])
def test_calls_queued_at_exit_still_run(tmp_path: Any, host: str) -> None:
    """A rank that exits with async calls queued runs them first (its peer's calls complete), and
    exits cleanly: no abort from the worker or a thread taking the GIL while Python ends."""
    import subprocess
    import sys

    from hocc.bench.launch import free_port

    script = tmp_path / "rank.py"
    script.write_text(_EXITING_RANK)
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), HOCC_TOPOLOGY="2",
               HOCC_HOST_TRANSPORT=host, HOCC_ALGO="ring", OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, str(script), str(r)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    for r, (p, (_, err)) in enumerate(zip(procs, outs, strict=True)):
        assert p.returncode == 0, f"rank {r} exited {p.returncode}: {err[-2000:]}"
        assert "terminate called" not in err and "FATAL" not in err, err[-2000:]
    assert "rank 1: 8 calls matched" in outs[1][0]
