"""The moves between scopes that PaRO-DP makes, as collectives, issued from
one background thread.

A scope move is one or two collectives on the rail-major layout
(hocc/paro/layout.py): I <-> N over the host, G <-> I over the rail, and
G <-> N as the rail stage then the host stage (or the reverse), which are
the two stages HO-Ring runs for a world collective.

Why one thread: units gather and reduce while autograd computes, and NCCL
and gloo both need every rank to issue the ops of several groups in one
order. Every rank submits the same moves in the same order (forward order,
then autograd's deterministic backward order), and a single worker runs
them in submission order, so the order on the wire is the same everywhere.

On CUDA the worker is a second host thread issuing GPU work, so host order
alone orders nothing on the device. Each move runs on the worker's own
stream (one per worker and device), after an event recorded on the
submitter's current stream at submission (so it sees every kernel the
caller queued before it: the gradients autograd wrote, the optimizer's
step), and the submitter's stream waits on an event recorded after the move
before its future resolves (so whatever the caller queues once it has the
result comes after the move). Buffers the caller made stay referenced until
it has the result (ShardUnit.inflight, Pass.gathering), so the caching allocator
cannot hand them to the caller's stream while the move still uses them, and
what the worker allocates is made and freed on its own stream.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from typing import Any, NamedTuple

import torch
import torch.distributed as dist

from hocc.api.collectives import all_gather_into_tensor, all_reduce, reduce_scatter_tensor
from hocc.paro.layout import Groups

TRACE = 4096  # collectives each Moves remembers
_LOCK = threading.Lock()
_WORKERS: dict[int, ThreadPoolExecutor] = {}  # by id of a Groups (build_groups keeps every Groups alive)
_STREAMS: dict[tuple[int, int], torch.cuda.Stream] = {}  # each worker's stream, by (id of its Groups, device)
# op: (torch.distributed's call, hocc's); torch's under the names torch 2.11 has too (its *_single aliases came later)
_CALLS: dict[str, tuple[Callable[..., Any], Callable[..., Any]]] = {
    "all_gather": (dist.all_gather_into_tensor, all_gather_into_tensor),
    "reduce_scatter": (dist.reduce_scatter_tensor, reduce_scatter_tensor),
}


class Logged(NamedTuple):
    """One logical collective of a strategy's schedule, as run."""

    op: str       # all_gather | reduce_scatter | all_reduce | broadcast | all_to_all (a checkpoint's chunks)
    where: str    # host | rail | world
    when: str     # micro | step | load
    state: str    # params | grads | buffers
    elems: int    # elements sent in by this rank


class Moves:
    """Scope moves over `groups`, through hocc's calls (`comm='hocc'`, with
    `algo`) or torch.distributed's own (`comm='torch'`, for comparison), on
    the tensors of `device` (CUDA: ordered with the submitter's stream)."""

    def __init__(self, groups: Groups, comm: str = "hocc", algo: str | None = None,
                 device: torch.device | str = "cpu") -> None:
        if comm not in ("hocc", "torch"):
            raise ValueError(f"comm must be 'hocc' or 'torch', got {comm!r}")
        self.groups, self.comm, self.algo = groups, comm, algo
        self.device = torch.device(device)
        self.trace: deque[Logged] = deque(maxlen=TRACE)  # the latest collectives, for tests and inspection

    # -- the worker ---------------------------------------------------------------
    def submit(self, fn: Callable[[], Any]) -> Future[Any]:
        """Run fn on the worker, after everything submitted before it. One
        worker per Groups: two models on the same groups (a GAN, a teacher)
        still put their collectives on the wire in one order."""
        with _LOCK:
            pool = _WORKERS.get(id(self.groups))
            if pool is None:
                pool = _WORKERS[id(self.groups)] = ThreadPoolExecutor(1, thread_name_prefix="hocc-paro")
            if self.device.type == "cuda":
                fn = self._stream_ordered(fn)
        return pool.submit(fn)

    def _stream_ordered(self, fn: Callable[[], Any]) -> Callable[[], Any]:
        """fn on the worker's stream, after the submitter's stream's work so
        far, with the submitter's stream waiting for it (the module's docstring)."""
        dev = self.device if self.device.index is not None else torch.device("cuda", torch.cuda.current_device())
        key = (id(self.groups), dev.index)
        side = _STREAMS.get(key)
        if side is None:
            side = _STREAMS[key] = torch.cuda.Stream(dev)
        caller = torch.cuda.current_stream(dev)
        ready = torch.cuda.Event()
        ready.record(caller)

        def run() -> Any:
            with torch.cuda.device(dev), torch.cuda.stream(side):
                side.wait_event(ready)
                try:
                    return fn()
                finally:  # a move that raised may still have queued work on the buffers
                    done = torch.cuda.Event()
                    done.record(side)
                    caller.wait_event(done)
        return run

    def run(self, fn: Callable[[], Any]) -> Any:
        """Run fn on the worker and wait for it (keeps the wire order)."""
        return self.submit(fn).result()


    # -- single collectives -------------------------------------------------------
    def _pg(self, where: str) -> dist.ProcessGroup:
        return {"host": self.groups.host, "rail": self.groups.rail, "world": self.groups.world}[where]

    def _width(self, where: str) -> int:
        return {"host": self.groups.group_size, "rail": self.groups.n_groups, "world": self.groups.size}[where]

    def all_gather(self, out: torch.Tensor, inp: torch.Tensor, where: str) -> None:
        self._one_way("all_gather", out, inp, where)

    def reduce_scatter(self, out: torch.Tensor, inp: torch.Tensor, where: str) -> None:
        self._one_way("reduce_scatter", out, inp, where)

    def _one_way(self, op: str, out: torch.Tensor, inp: torch.Tensor, where: str) -> None:
        """An all-gather or reduce-scatter from `inp` into `out` (a copy alone)."""
        if self._width(where) == 1:
            out.copy_(inp)
            return
        theirs, ours = _CALLS[op]
        if self.comm == "torch":
            theirs(out, inp, group=self._pg(where))
        else:
            ours(out, inp, group=self._pg(where), algo=self.algo)

    def all_reduce(self, t: torch.Tensor, where: str) -> None:
        if self._width(where) == 1:
            return
        if self.comm == "torch":
            dist.all_reduce(t, group=self._pg(where))
        else:
            all_reduce(t, group=self._pg(where), algo=self.algo)

    def broadcast(self, t: torch.Tensor) -> None:
        """From world rank 0 (buffers); torch's own call, as DDP makes it."""
        self.trace.append(Logged("broadcast", "world", "micro", "buffers", t.numel()))
        dist.broadcast(t, 0, group=self.groups.world)

    def broadcast_all(self, tensors: list[torch.Tensor]) -> None:
        """World rank 0's values into every tensor, on the worker: one
        broadcast per dtype, of the tensors flattened together."""
        for dtype in sorted({t.dtype for t in tensors if t.numel()}, key=str):
            same = [t for t in tensors if t.dtype == dtype and t.numel()]
            flat = torch.cat([t.detach().reshape(-1) for t in same])
            self.run(partial(self.broadcast, flat))
            off = 0
            with torch.no_grad():
                for t in same:
                    t.copy_(flat[off:off + t.numel()].view_as(t))
                    off += t.numel()

    # -- scope moves --------------------------------------------------------------
    def gather(self, out: torch.Tensor, shard: torch.Tensor, src: str, dst: str, when: str, state: str) -> None:
        """out (scope dst) <- every rank's shard (scope src), src finer than dst
        (or the same scope: a copy)."""
        if src == dst:
            out.copy_(shard)
            return
        self.trace.append(Logged("all_gather", _where(src, dst), when, state, shard.numel()))
        if src == "G" and dst == "N":
            mid = torch.empty(shard.numel() * self.groups.n_groups, dtype=shard.dtype, device=shard.device)
            self.all_gather(mid, shard, "rail")
            self.all_gather(out, mid, "host")
        else:
            self.all_gather(out, shard, _where(src, dst))

    def reduce(self, out: torch.Tensor, full: torch.Tensor, src: str, dst: str, when: str) -> torch.Tensor:
        """out (scope dst) <- the sum over the scope of every rank's `full`
        (scope src); dst == src: an all-reduce in place (out is full)."""
        where = _where(src, dst) if src != dst else {"N": "world", "I": "rail", "G": "world"}[src]
        op = "all_reduce" if src == dst else "reduce_scatter"
        self.trace.append(Logged(op, where, when, "grads", full.numel()))
        if src == dst:
            self.all_reduce(full, where)
            return full
        if src == "N" and dst == "G":
            mid = torch.empty(full.numel() // self.groups.group_size, dtype=full.dtype, device=full.device)
            self.reduce_scatter(mid, full, "host")
            self.reduce_scatter(out, mid, "rail")
        else:
            self.reduce_scatter(out, full, where)
        return out


def _where(a: str, b: str) -> str:
    pair = {a, b}
    if pair == {"N", "I"}:
        return "host"
    if pair == {"I", "G"}:
        return "rail"
    return "world"
