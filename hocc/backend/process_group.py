"""The "hocc" torch.distributed backend: a ProcessGroup whose all-reduce,
all-gather and reduce-scatter go through hocc's planner (auto), whose
broadcast is a planned all-reduce (below), and whose every other collective is
delegated unchanged to an inner backend (gloo for CPU tensors, NCCL for CUDA
tensors), so nothing a training script calls is missing. Delegation is one
mechanism for all methods; the planned collectives are the only overrides."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from hocc.api.record import stats
from hocc.backend.barrier import BarrierLog, BarrierWork, barrier_error
from hocc.config import get_config
from hocc.engine.dtypes import DTYPE_SET, op_name, premul_factor
from hocc.engine.engine import Engine
from hocc.engine.errors import CollectiveError
from hocc.engine.group import GroupInfo, new_backend
from hocc.engine.work import Work, copy_out

# Methods handed to the inner backend as they are: ProcessGroup's name -> the backend's.
DELEGATED = {
    name: name for name in (
        "allreduce_coalesced", "allgather_coalesced", "alltoall", "alltoall_base", "gather",
        "scatter", "reduce", "send", "recv", "recv_anysource", "monitored_barrier",
    )
} | {"all_to_all_single": "alltoall_base"}


# Smaller broadcasts are gloo's own: there a call is its latency, and gloo's one-to-all is as fast or faster
# than a planned all-reduce (bench/results/broadcast, 200 Mbit/s: 2x4 at 32 KiB 3.4 ms against 6.2 ms, at
# 64 KiB 9.0 against 3.7 ms; 4x2 ties at 64 KiB; from 1 MiB the planned one is 2.2-3.3x faster).
PLANNED_BROADCAST_BYTES = 64 * 1024
# the dtypes gloo's broadcast takes (torch 2.13: int16, uint16 and the float8s raise "Invalid scalar type")
GLOO_BROADCASTS = frozenset({torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.complex64,
                             torch.complex128, torch.bool, torch.int8, torch.uint8, torch.int32, torch.int64})


def _first_tensor(args: tuple[Any, ...]) -> torch.Tensor | None:
    stack: list[Any] = list(args)
    while stack:
        x = stack.pop(0)
        if isinstance(x, torch.Tensor):
            return x
        if isinstance(x, (list, tuple)):
            stack = list(x) + stack
    return None


class HoccProcessGroup(dist.ProcessGroup):
    def __init__(self, store: dist.Store, rank: int, size: int, timeout: timedelta,
                 global_ranks: list[int] | None, name: str) -> None:
        super().__init__(rank, size)
        self._store, self._timeout, self._name = store, timeout, name
        self._global_ranks = list(global_ranks) if global_ranks else list(range(size))
        self._inner: dict[str, Any] = {}
        self._engines: dict[str, Engine] = {}
        self._device_map: dict[str, str] | None = None
        self._ended: str | None = None  # 'shut down' or 'aborted': calls raise from then on
        self._failed: Exception | None = None  # a failed barrier: calls raise it again from then on
        self._barriers = BarrierLog(store, rank, size)

    # -- identity ------------------------------------------------------------
    def getBackendName(self) -> str:
        return "hocc"

    @property
    def group_name(self) -> str:
        return self._name

    @property
    def _device_types(self) -> list[torch.device]:
        """The devices this group serves, as torch's built-ins report theirs: CPU, and CUDA where torch
        has it (torch registers no device backend for a ProcessGroup subclass, and its utilities read
        this: DCP's async save, broadcast_from_rank0, _get_pg_default_device). Reported here rather than
        by registering the inner backends: a registration would keep them (their threads, sockets) alive
        as long as the group object, which a caught error's traceback can hold after destroy."""
        devices = [torch.device("cpu")]
        if torch.cuda.is_available() and dist.is_nccl_available():
            devices.append(torch.device("cuda"))
        return devices

    def __repr__(self) -> str:
        return f"HoccProcessGroup(rank={self.rank()}, size={self.size()}, name={self._name})"

    # -- inner backends and engines -------------------------------------------
    def _backend_for(self, device: torch.device) -> str:
        """What serves tensors on `device`: 'hocc', 'gloo' or 'nccl' (a
        'cpu:gloo,cuda:hocc' group serves CPU tensors with plain gloo)."""
        if self._device_map is None:
            try:
                config = str(dist.get_backend_config(self))
            except (RuntimeError, ValueError, KeyError):
                config = "hocc"
            mapping = {}
            for part in config.split(","):
                if ":" in part:
                    dev, be = part.split(":", 1)
                    mapping[dev.strip()] = be.strip().lower()
            self._device_map = mapping
        backend = self._device_map.get(device.type, "hocc")
        if backend not in ("hocc", "gloo", "nccl"):
            raise RuntimeError(f"hocc backend: the group maps {device.type} tensors to {backend!r}, which hocc "
                               "cannot serve; use 'gloo' or 'nccl' for that device, or 'hocc' for all")
        return backend

    def inner(self, device: torch.device) -> Any:
        self._check_open()
        key = device.type
        if key not in self._inner:
            store = dist.PrefixStore(f"hocc-inner/{key}", self._store)
            self._inner[key] = new_backend(device, store, self.rank(), self.size(), self._timeout)
        return self._inner[key]

    def hocc_engine(self, device: torch.device, refresh: bool = True) -> Engine:
        """This group's engine for `device` (hocc's drop-in calls use it too),
        made now if there is none or (refresh) if the engine settings changed
        since it was made (hocc.config: the same rule as the drop-in calls'
        engines): the old one first ends the calls made before."""
        self._check_open()
        cfg = get_config()
        key = device.type
        eng = self._engines.get(key)
        if eng is not None and refresh and eng.stale(cfg):
            del self._engines[key]
            eng.close()
            eng = None
        if eng is None:
            info = GroupInfo(rank=self.rank(), size=self.size(), global_ranks=self._global_ranks,
                             name=f"backend/{self._name}", store=self._store, inner=self.inner(device),
                             timeout=self._timeout)
            eng = self._engines[key] = Engine(info, device, cfg)
        return eng

    def stats(self, device: str | torch.device = "cpu") -> dict[str, Any]:
        """hocc.stats for this group: per-tier throughput and arrival skew of
        its planned calls (e.g. dist.group.WORLD.stats() under init_process_group("hocc"))."""
        return stats(self, device)

    # -- teardown (dist.destroy_process_group calls shutdown(), _abort_process_group abort()) --------------
    def shutdown(self) -> None:
        """Release everything once the calls made before have ended: the
        engines (worker threads, gloo sub-groups, shared-memory segments),
        then the inner backends. Later calls raise. Idempotent."""
        self._end(None)

    def abort(self) -> None:
        """Make calls in flight fail now (shared-memory peers and gloo
        connections are woken), then release what shutdown() does without
        waiting for them. Later calls raise. Idempotent."""
        self._end("the process group was aborted")

    def _end(self, why: str | None) -> None:
        if self._ended is None:
            self._ended = "shut down" if why is None else "aborted"
        engines, self._engines = list(self._engines.values()), {}
        inner, self._inner = list(self._inner.values()), {}
        for e in engines:
            if why is None:
                e.close()
            else:
                e.abort(why)
        for b in inner:
            if why is None:
                b.shutdown()
            else:
                b.abort()

    def _check_open(self) -> None:
        if self._ended is not None:
            raise RuntimeError(f"hocc backend: process group {self._name!r} was {self._ended}; destroy it and "
                               "init a new one (torch.distributed.destroy_process_group, then "
                               "init_process_group / new_group)")
        if self._failed is not None:
            raise CollectiveError(f"hocc backend: process group {self._name!r} failed earlier and cannot be used "
                                  f"again. The first failure: {self._failed}", group=self._name)

    def _where(self) -> str:
        glob = "" if self._global_ranks == list(range(self.size())) else f", global ranks {self._global_ranks}"
        return f"group {self._name!r} (rank {self.rank()} of {self.size()}{glob})"

    def _planned(self, device: torch.device) -> bool:
        return self._backend_for(device) == "hocc"

    # -- the three planned collectives ---------------------------------------
    def _call(self, collective: str, inp: torch.Tensor, out: torch.Tensor, reduce_op: str, opts: Any,
              result: list[torch.Tensor], after: Callable[[], None] | None = None) -> dist.Work:
        """An already-checked call with the default algo on the engine; `after` runs once it succeeded (a
        copy to the caller's tensors), and the Work's future then holds `result`. torch says in
        opts.asyncOp whether its caller waits at once (dist.all_reduce(t) does): such a CPU call runs
        here, on the caller's thread, as a drop-in sync call does (queued, the hand-off to the worker
        and back cost a 4-byte all_reduce about 120 us), and its failure raises here."""
        engine = self.hocc_engine(inp.device)
        if inp.device.type == "cpu" and not getattr(opts, "asyncOp", True):
            engine.run(collective, inp, out, reduce_op, None, async_op=False)
            if after is not None:
                after()
            done: torch.futures.Future[Any] = torch.futures.Future()
            done.set_result(result)
            return _FutureWork(done)
        call = engine.run(collective, inp, out, reduce_op, None, async_op=True)
        assert call is not None
        work = call.then(after, result) if after is not None else call
        return _FutureWork(work.get_future(), call)

    @staticmethod
    def _plannable(tensors: list[torch.Tensor], op: object = dist.ReduceOp.SUM) -> bool:
        """What hocc plans; anything else (other ops, dtypes, layouts) the inner backend runs.
        PREMUL_SUM is planned as SUM over a scaled copy (_scaled)."""
        if premul_factor(op) is not None:
            return all(t.dtype in DTYPE_SET and t.is_contiguous() and t.is_floating_point() for t in tensors)
        try:
            op_name(op)
        except ValueError:
            return False
        return all(t.dtype in DTYPE_SET and t.is_contiguous() for t in tensors)

    @staticmethod
    def _scaled(t: torch.Tensor, op: object) -> tuple[torch.Tensor, str]:
        """The tensor to reduce and the op's name: for PREMUL_SUM a copy of `t`
        times its factor, summed (the caller's tensor is never scaled in
        place, so a failed call leaves it untouched), else `t` itself."""
        factor = premul_factor(op)
        if factor is None:
            return t, op_name(op)
        return t * factor, "sum"

    def allreduce(self, tensors: Any, opts: Any = None) -> dist.Work:
        opts = opts if opts is not None else dist.AllreduceOptions()
        if isinstance(tensors, torch.Tensor):
            tensors = [tensors]
        t = tensors[0]
        if len(tensors) != 1 or not self._planned(t.device) or not self._plannable(tensors, opts.reduceOp):
            return self.inner(t.device).allreduce(tensors, opts)
        src, name = self._scaled(t, opts.reduceOp)
        # the scaled copy's sum goes to the caller's tensor once the call succeeded
        return self._call("all_reduce", src, src, name, opts, [t],
                          (lambda: copy_out(src, [t])) if src is not t else None)

    def broadcast(self, tensors: Any, opts: Any = None) -> dist.Work:
        """The root's tensor to every rank, as a planned sum of its bytes seen
        as integers, to which every other rank adds zeros (x + 0 is x, bit for
        bit, whatever the dtype: NaN payloads and -0.0 included). So it follows
        the hierarchy as all_reduce does, where gloo's broadcast sends the data
        from the root to each rank of every other host in turn (DDP's start-up
        broadcast of 16 MiB on the emulated 2x4: 2.8 s on gloo, 0.84 s here).
        Each rank sums into a copy; the caller's tensor gets the result only
        once the call succeeded (a strided view too: gloo's own broadcast sends
        the bytes its storage holds there). CUDA tensors keep NCCL's broadcast,
        which is pipelined already, and calls below PLANNED_BROADCAST_BYTES
        gloo's, where gloo has the dtype."""
        opts = opts if opts is not None else dist.BroadcastOptions()
        if isinstance(tensors, torch.Tensor):
            tensors = [tensors]
        t = tensors[0]
        planned = (len(tensors) == 1 and opts.rootTensor == 0 and t.layout == torch.strided
                   and t.device.type == "cpu" and self._planned(t.device)
                   and (t.nbytes >= PLANNED_BROADCAST_BYTES or t.dtype not in GLOO_BROADCASTS))
        dense = t.contiguous() if planned else t  # a strided view: its elements, in order
        bits = _as_integers(dense) if planned else None
        if bits is None:
            return self.inner(t.device).broadcast(tensors, opts)
        root = self.rank() == opts.rootRank
        src = bits.clone() if root else torch.zeros_like(bits)

        def deliver() -> None:
            with torch.inference_mode():  # as copy_out: maybe on hocc's worker, without the caller's modes
                bits.copy_(src)
                if dense is not t:
                    t.copy_(dense)
        return self._call("all_reduce", src, src, "sum", opts, [t], None if root else deliver)

    def all_gather_single(self, output: torch.Tensor, inp: torch.Tensor, opts: Any = None) -> dist.Work:
        if not self._planned(inp.device) or not self._plannable([output, inp]):
            return self.inner(inp.device)._allgather_base(output, inp, opts or dist.AllgatherOptions())
        return self._call("all_gather", inp, output, "sum", opts, [output])

    _allgather_base = all_gather_single

    def reduce_scatter_single(self, output: torch.Tensor, inp: torch.Tensor, opts: Any = None) -> dist.Work:
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        if not self._planned(inp.device) or not self._plannable([output, inp], opts.reduceOp):
            return self.inner(inp.device)._reduce_scatter_base(output, inp, opts)
        src, name = self._scaled(inp, opts.reduceOp)
        return self._call("reduce_scatter", src, output, name, opts, [output])

    _reduce_scatter_base = reduce_scatter_single

    def allgather(self, output_lists: Any, inputs: Any, opts: Any = None) -> dist.Work:
        """List form: gathered into one flat buffer by hocc, then split into the
        caller's list once (and only if) the call succeeded."""
        inp = inputs[0]
        outs = output_lists[0]
        if (len(inputs) != 1 or not self._planned(inp.device) or not self._plannable([inp, *outs])
                or any(o.numel() != inp.numel() for o in outs)):
            return self.inner(inp.device).allgather(output_lists, inputs, opts or dist.AllgatherOptions())
        flat = torch.empty(inp.numel() * len(outs), dtype=inp.dtype, device=inp.device)
        return self._call("all_gather", inp, flat, "sum", opts, list(outs), lambda: copy_out(flat, outs))

    def reduce_scatter(self, outputs: Any, input_lists: Any, opts: Any = None) -> dist.Work:
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        out = outputs[0]
        ins = input_lists[0]
        if (len(outputs) != 1 or not self._planned(out.device) or not self._plannable([out, *ins], opts.reduceOp)
                or any(i.numel() != out.numel() for i in ins)):
            return self.inner(out.device).reduce_scatter(outputs, input_lists, opts)
        flat = torch.cat([i.reshape(-1) for i in ins])
        return self.reduce_scatter_single(out, flat, opts)

    def all_gather_single_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                    opts: Any = None) -> dist.Work:
        return _AllOf([self.all_gather_single(o, i, opts) for o, i in zip(outputs, inputs, strict=True)])

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def reduce_scatter_single_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                        opts: Any = None) -> dist.Work:
        return _AllOf([self.reduce_scatter_single(o, i, opts) for o, i in zip(outputs, inputs, strict=True)])

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    def barrier(self, opts: Any = None) -> dist.Work:
        """The inner backend's barrier; its failure names who never arrived
        (hocc/backend/barrier.py) and leaves the group failed, as a failed
        collective does."""
        self._check_open()
        device = torch.device("cuda", torch.cuda.current_device()) if "cuda" in self._inner else torch.device("cpu")
        started = time.monotonic()
        number = self._barriers.count + 1

        def failed(e: Exception) -> CollectiveError:
            err = barrier_error(self._where(), self._global_ranks, self._barriers, number, started, self._timeout, e)
            if self._failed is None:
                self._failed = err
            return err

        try:
            self._barriers.enter()
            work = self.inner(device).barrier(opts or dist.BarrierOptions())
        except Exception as e:  # the inner group's set-up (its first use) waits for every member too
            raise failed(e) from e
        return BarrierWork(work, failed)


def _as_integers(t: torch.Tensor) -> torch.Tensor | None:
    """A flat integer view of a contiguous `t`'s bytes (the widest integer its
    size and offset allow), or None where its dtype has none."""
    try:
        flat = t.reshape(-1).view(torch.uint8)
    except RuntimeError:
        return None
    for dtype in (torch.int64, torch.int32):
        size = dtype.itemsize
        if flat.numel() % size == 0 and flat.storage_offset() % size == 0:
            return flat.view(dtype)
    return flat


class _FutureWork(dist.Work):
    """A c10d Work over a torch future whose wait() raises the call's error
    (torch's _create_work_from_future returns True from wait() even when the
    future failed, which would leave a failed collective's output silently wrong).
    wait() first runs the call on the waiting thread if hocc's worker has not begun
    it and it is next (an async call waited on at once then pays no hand-off to the
    worker and back; torch's sync calls run on the caller's thread already, _call)."""

    def __init__(self, fut: torch.futures.Future[Any], work: Work | None = None) -> None:
        super().__init__()
        self._fut = fut
        self._work = work

    def wait(self, timeout: timedelta | None = None) -> bool:
        if self._work is not None:
            self._work.run_if_next()
        self._fut.wait()
        return True

    def is_completed(self) -> bool:
        return self._fut.done()

    def is_success(self) -> bool:
        if not self._fut.done():
            return False
        try:
            self._fut.value()
        except Exception:  # noqa: BLE001 - failed is what this reports
            return False
        return True

    def result(self) -> Any:
        return self._fut.wait()

    def get_future(self) -> torch.futures.Future[Any]:
        return self._fut


class _AllOf(dist.Work):
    """One Work for several calls (the coalesced calls run as one call each, in
    order): wait() raises the first failed call's own error, as it is."""

    def __init__(self, works: list[dist.Work]) -> None:
        super().__init__()
        self._works = works

    def wait(self, timeout: timedelta | None = None) -> bool:
        for w in self._works:
            w.wait()
        return True

    def is_completed(self) -> bool:
        return all(w.is_completed() for w in self._works)

    def is_success(self) -> bool:
        return all(w.is_success() for w in self._works)

    def get_future(self) -> torch.futures.Future[Any]:
        futs = [w.get_future() for w in self._works]
        return torch.futures.collect_all(futs).then(lambda f: [x.value() for x in f.value()])


def _delegate(name: str, backend_name: str) -> Any:
    def method(self: HoccProcessGroup, *args: Any) -> Any:
        t = _first_tensor(args)
        device = t.device if t is not None else torch.device("cpu")
        return getattr(self.inner(device), backend_name)(*args)

    method.__name__ = name
    method.__doc__ = f"{name}: delegated to the inner backend (gloo for CPU, NCCL for CUDA)."
    return method


for _name, _backend_name in DELEGATED.items():
    setattr(HoccProcessGroup, _name, _delegate(_name, _backend_name))


def create(opts: Any, _pg_options: Any = None) -> HoccProcessGroup:
    """torch.distributed's creator hook (extended API)."""
    _all_ranks_here(opts.store, opts.group_rank, opts.group_size, opts.timeout)
    return HoccProcessGroup(opts.store, opts.group_rank, opts.group_size, opts.timeout,
                            list(opts.global_ranks_in_group or []), str(opts.group_id))


def _all_ranks_here(store: dist.Store, rank: int, size: int, timeout: timedelta) -> None:
    """Return once every rank of the group has reached this creator.

    A ProcessGroup subclass returned from a creator replaces the group torch was
    assembling, so in a "cpu:gloo,cuda:hocc" group torch drops the gloo backend it
    has just built for CPU (the group's CPU tensors go to this one's inner gloo).
    Dropped on a rank that got here first, its sockets close while a slower rank is
    still inside that gloo's connectFullMesh, which then fails with "Connection
    closed by peer". Every rank reaches this creator only after that constructor
    returned, so waiting here for all of them makes the drop harmless."""
    store.set(f"hocc-created/{rank}", "1")
    try:
        store.wait([f"hocc-created/{r}" for r in range(size)], timeout)
    except Exception as e:
        raise RuntimeError(f"hocc backend: rank {rank} of {size} made its group, but not every rank did "
                           f"within the group's timeout ({timeout}): {e}") from e


def register() -> None:
    if "hocc" not in dist.Backend.backend_list:
        dist.Backend.register_backend("hocc", create, extended_api=True, devices=["cpu", "cuda"])
