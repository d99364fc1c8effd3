"""No failed call returns data, on any path: every planned method of the "hocc"
backend (through torch.distributed's calls, sync, async, futures, coalesced,
list forms, PREMUL_SUM) and every drop-in call (on a gloo group), each with a
peer that differs in dtype, count or reduction op, or that never makes the
call. Every rank that made the call raises within the group's timeout, and the
outputs it passed are untouched.

One world, a fresh group per case (a failed group stays failed); the default
settings, as users get them."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
import torch
import torch.distributed as dist

import hocc
from tests.worlds import hocc_env, run_world

pytestmark = pytest.mark.slow

TIMEOUT_S = 1.0  # each case with a missing peer waits this long (15 of them); a healthy call here takes milliseconds
ODD = 3  # the rank that differs
N = 1000  # above the tiny-call size: the planned path; the tiny path has its own cases (TINY)
TINY = 3
KINDS = ("dtype", "count", "op", "missing")

# A path: (group, x: this rank's input, op) -> (the outputs the caller passed, the call)
Path = Callable[[dist.ProcessGroup, torch.Tensor, Any], tuple[list[torch.Tensor], Callable[[], Any]]]


def _world(g: dist.ProcessGroup) -> int:
    return dist.get_world_size(g)


def _ar(g: dist.ProcessGroup, x: torch.Tensor, op: Any, how: str = "sync") -> Callable[[], Any]:
    def call() -> Any:
        if how == "sync":
            return dist.all_reduce(x, op, group=g)
        work = dist.all_reduce(x, op, group=g, async_op=True)
        return work.wait() if how == "wait" else work.get_future().wait()
    return call


def _coalesced(g: dist.ProcessGroup, x: torch.Tensor, op: Any, gather: bool) -> tuple[list[torch.Tensor],
                                                                                      Callable[[], Any]]:
    w = _world(g)
    outs = [x.new_zeros(w * x.numel()) if gather else x.new_zeros(x.numel()) for _ in range(2)]

    def call() -> None:
        # no device: torch's manager would start coalescing on the device's backend, which gloo refuses
        with dist._coalescing_manager(group=g, async_ops=True) as cm:
            for o in outs:
                if gather:
                    dist.all_gather_single(o, x, group=g)
                else:
                    dist.reduce_scatter_single(o, x.repeat(w), op, group=g)
        cm.wait()
    return outs, call


BACKEND: dict[str, Path] = {
    "all_reduce": lambda g, x, op: ([x], _ar(g, x, op)),
    "all_reduce async wait": lambda g, x, op: ([x], _ar(g, x, op, "wait")),
    "all_reduce get_future": lambda g, x, op: ([x], _ar(g, x, op, "future")),
    "all_reduce PREMUL_SUM": lambda g, x, op: ([x], _ar(g, x, dist._make_nccl_premul_sum(0.5)
                                                      if op == dist.ReduceOp.SUM else op)),
    "all_gather (list)": lambda g, x, op: (
        outs := [torch.zeros_like(x) for _ in range(_world(g))], lambda: dist.all_gather(outs, x, group=g)),
    "all_gather (list) async": lambda g, x, op: (
        outs := [torch.zeros_like(x) for _ in range(_world(g))],
        lambda: dist.all_gather(outs, x, group=g, async_op=True).wait()),
    "all_gather_into_tensor": lambda g, x, op: (
        [out := x.new_zeros(_world(g) * x.numel())], lambda: dist.all_gather_into_tensor(out, x, group=g)),
    "reduce_scatter (list)": lambda g, x, op: (
        [out := torch.zeros_like(x)],
        lambda: dist.reduce_scatter(out, [x.clone() for _ in range(_world(g))], op, group=g)),
    "reduce_scatter_tensor": lambda g, x, op: (
        [out := torch.zeros_like(x)], lambda: dist.reduce_scatter_tensor(out, x.repeat(_world(g)), op, group=g)),
    "reduce_scatter_tensor async": lambda g, x, op: (
        [out := torch.zeros_like(x)],
        lambda: dist.reduce_scatter_tensor(out, x.repeat(_world(g)), op, group=g, async_op=True).wait()),
    "broadcast": lambda g, x, op: (  # large enough to be planned (PLANNED_BROADCAST_BYTES)
        [big := x.repeat(20)], lambda: dist.broadcast(big, 0, group=g)),
    "all_gather_single coalesced": lambda g, x, op: _coalesced(g, x, op, gather=True),
    "reduce_scatter_single coalesced": lambda g, x, op: _coalesced(g, x, op, gather=False),
}

DROP_IN: dict[str, Path] = {
    "hocc.all_reduce": lambda g, x, op: ([x], lambda: hocc.all_reduce(x, op, group=g)),
    "hocc.all_reduce async": lambda g, x, op: ([x], lambda: hocc.all_reduce(x, op, group=g, async_op=True).wait()),
    "hocc.all_reduce get_future": lambda g, x, op: (
        [x], lambda: hocc.all_reduce(x, op, group=g, async_op=True).get_future().wait()),
    "hocc.all_gather_into_tensor": lambda g, x, op: (
        [out := x.new_zeros(_world(g) * x.numel())], lambda: hocc.all_gather_into_tensor(out, x, group=g)),
    "hocc.all_gather_single async": lambda g, x, op: (
        [out := x.new_zeros(_world(g) * x.numel())],
        lambda: hocc.all_gather_single(out, x, group=g, async_op=True).wait()),
    "hocc.all_gather (list)": lambda g, x, op: (
        outs := [torch.zeros_like(x) for _ in range(_world(g))], lambda: hocc.all_gather(outs, x, group=g)),
    "hocc.all_gather (list) async": lambda g, x, op: (
        outs := [torch.zeros_like(x) for _ in range(_world(g))],
        lambda: hocc.all_gather(outs, x, group=g, async_op=True).wait()),
    "hocc.reduce_scatter_tensor": lambda g, x, op: (
        [out := torch.zeros_like(x)], lambda: hocc.reduce_scatter_tensor(out, x.repeat(_world(g)), op, group=g)),
    "hocc.reduce_scatter_single async": lambda g, x, op: (
        [out := torch.zeros_like(x)],
        lambda: hocc.reduce_scatter_single(out, x.repeat(_world(g)), op, group=g, async_op=True).wait()),
    "hocc.reduce_scatter (list)": lambda g, x, op: (
        [out := torch.zeros_like(x)],
        lambda: hocc.reduce_scatter(out, [x.clone() for _ in range(_world(g))], op, group=g)),
}


def _input(rank: int, kind: str, n: int) -> tuple[torch.Tensor, Any]:
    odd = rank == ODD
    dtype = torch.float64 if kind == "dtype" and odd else torch.float32
    count = n + 17 if kind == "count" and odd else n
    op = dist.ReduceOp.MAX if kind == "op" and odd else dist.ReduceOp.SUM
    return torch.arange(count, dtype=dtype) + rank, op


def _case(rank: int, world: int, backend: str, name: str, path: Path, kind: str, n: int) -> None:
    dist.barrier()  # the last case's ranks raised at different times; the new group's timeout is short
    g = dist.new_group(list(range(world)), timeout=timedelta(seconds=TIMEOUT_S), backend=backend)
    x, op = _input(rank, kind, n)
    outs, call = path(g, x, op)
    before = [o.clone() for o in outs]
    if kind == "missing" and rank == ODD:
        return  # this rank never makes the call: the others must not wait for it past the timeout
    t0 = time.monotonic()
    with pytest.raises(RuntimeError) as info:
        call()
    took = time.monotonic() - t0
    where = f"{backend} {name}, {kind}, {n} elements, rank {rank}"
    assert took < TIMEOUT_S + 15, f"{where}: raised after {took:.1f} s: {info.value}"
    assert "hocc" in str(info.value), f"{where}: not hocc's error: {info.value!r}"
    for i, (o, b) in enumerate(zip(outs, before, strict=True)):
        assert torch.equal(o, b), f"{where}: output {i} was written by a failed call"


# every kind for each method's first form; its other forms (async, futures, coalesced, *_single) share
# that form's planned path after their own first steps, and take one kind each
VARIANTS = ("async", "get_future", "coalesced", "single")


def _kinds(name: str) -> tuple[str, ...]:
    if any(v in name for v in VARIANTS):
        return ("count",)
    return tuple(k for k in KINDS if not (k == "op" and ("gather" in name or name == "broadcast")))


def _body(rank: int, world: int) -> None:
    for backend, paths in (("hocc", BACKEND), ("gloo", DROP_IN)):
        for name, path in paths.items():
            for kind in _kinds(name):
                _case(rank, world, backend, name, path, kind, N)
    for name in ("all_reduce", "all_gather (list)", "reduce_scatter_tensor"):  # calls small enough to be tiny
        for kind in _kinds(name):
            _case(rank, world, "hocc", name, BACKEND[name], kind, TINY)


def test_no_failed_call_returns_data() -> None:
    run_world(4, _body, env=hocc_env("2x2", "shm"), timeout_s=120)
