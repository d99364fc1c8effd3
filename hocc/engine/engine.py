"""One engine per (process group, device type): it owns a call from plan to
result. The group's topology, the planner settings (hocc.plan.policy), the
plan cache, the communicators and the C++ executor that runs every plan
(CPU: shared memory and gloo; CUDA: NCCL) live here, and a single worker
runs calls in the order they were made (every rank issues the same
collectives in the same order, which keeps sub-group traffic matched)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import re
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from hocc.config import Config, get_config
from hocc.engine.agreement import Call, check_all, plan_hash
from hocc.engine.comms import Communicators
from hocc.engine.errors import CallMismatchError, CollectiveError
from hocc.engine.heap import note_cpu_call
from hocc.engine.watchdog import Watchdog
from hocc.engine.work import Work, on_stream
from hocc.executor import cuda_built, load
from hocc.executor.nccl import NcclRunner
from hocc.executor.plans import dtype_name, to_native
from hocc.plan.nccl_defaults import NCCL_LINKS
from hocc.plan.planner import PlannerConfig, make_plan
from hocc.plan.policy import planner_settings
from hocc.plan.types import Plan
from hocc.record import dump as record_dump
from hocc.record.recorder import Recorder
from hocc.topology import Topology, from_hostnames, parse_spec
from hocc.topology.detect import from_host_reports, host_report

log = logging.getLogger("hocc")


@dataclass(frozen=True)
class GroupInfo:
    """What an engine needs of its process group: who is in it, the store to
    meet on, and the backend that runs its native collectives (gloo or NCCL)."""

    rank: int
    size: int
    global_ranks: list[int]
    name: str
    store: dist.Store
    inner: Any
    timeout: timedelta

    @staticmethod
    def of(group: dist.ProcessGroup, device: torch.device) -> GroupInfo:
        return GroupInfo(dist.get_rank(group), dist.get_world_size(group), dist.get_process_group_ranks(group),
                         str(group.group_name), dist.distributed_c10d._get_default_store(),
                         group._get_backend(device), group_timeout(group, device))


def group_timeout(group: dist.ProcessGroup, device: torch.device) -> timedelta:
    """The group's timeout, which hocc's sub-groups and shared memory inherit."""
    try:
        t = group._get_backend(device).options._timeout
        if isinstance(t, timedelta):
            return t
    except (AttributeError, RuntimeError):
        pass
    return dist.default_pg_timeout


def resolve_topology(info: GroupInfo, prefix: str, cfg: Config, device: torch.device | None = None) -> Topology:
    """The group's topology, renumbered by group rank: from the HOCC_TOPOLOGY
    spec (which describes the world) if set, else from what each rank sees of
    its host, exchanged through the store (no collective, so it works inside
    a backend): its hostname, and on CUDA its GPUs, NVLink and NICs
    (hocc.topology.detect; what cannot be seen falls back to hostnames)."""
    if cfg.topology:
        world = parse_spec(cfg.topology)
        # while the hocc backend builds the default group, that group is the world
        job = dist.get_world_size() if dist.is_initialized() else info.size
        if world.world_size != job:
            raise ValueError(f"HOCC_TOPOLOGY={cfg.topology!r} describes {world.world_size} ranks but the world "
                             f"has {job}; give a spec with that many ranks")
        return world.restrict(info.global_ranks)
    if device is not None and device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        info.store.set(f"{prefix}/host/{info.rank}", json.dumps(host_report(index)))
        reps = [json.loads(info.store.get(f"{prefix}/host/{r}")) for r in range(info.size)]
        return from_host_reports([r["hostname"] for r in reps], reps, NCCL_LINKS,
                                 warn=log.warning if info.rank == 0 else (lambda _: None))
    info.store.set(f"{prefix}/host/{info.rank}", socket.gethostname())
    names = [info.store.get(f"{prefix}/host/{r}").decode() for r in range(info.size)]
    return from_hostnames(names)


# Engines this process made per group and device: part of the store prefix, so
# a rebuilt engine never meets its predecessor's keys. Counted per group (not
# globally) because ranks use different sets of groups.
_generations: Counter[str] = Counter()


# Plans kept per engine, least recently used dropped first. A plan and its C++
# form take about 10 KiB: a loop over many distinct sizes (the soak) would
# otherwise grow RSS by 10 KiB a call up to the cap, while a training loop uses
# a few dozen sizes.
PLAN_CACHE_SIZE = 256


@dataclass
class _Compiled:
    """A cached plan, its C++ form, its hash (agreement.plan_hash), and whether its communicators exist."""

    plan: Plan
    native: Any
    hash: int
    prepared: bool = False


class Engine:
    def __init__(self, info: GroupInfo, device: torch.device, cfg: Config) -> None:
        self.info = info
        self.device = device
        self.cfg = cfg
        self.rank = info.rank
        self.size = info.size
        key = f"{info.name}/{device.type}"
        prefix = f"hocc/{key}/{_generations[key]}"
        _generations[key] += 1
        self.prefix = prefix
        self._seq = 0  # calls made, numbered alike on every rank (the call check compares them)
        self.failed: str | None = None  # the first failure: every later call raises it
        self._check_pg: Any = None  # HOCC_CHECK's gloo group
        self.topology = resolve_topology(info, prefix, cfg, device)
        self.group: dist.ProcessGroup | None = None  # the API's group, when it made this engine
        self.last_plan: Plan | None = None
        self._plans: dict[tuple[Any, ...], _Compiled] = {}
        self._settings: tuple[Config, PlannerConfig] | None = None
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hocc-engine")
        self._lock = threading.Lock()
        self._outstanding = 0
        self._spare: torch.Tensor | None = None  # a CPU work buffer kept between calls
        self.closed: str | None = None  # why calls can no longer run ('closed', 'aborted (...)')
        self._busy = 0  # runs in flight (worker or inline): teardown waits for them
        self._idle = threading.Condition(self._lock)
        # the C++ executor: NCCL for CUDA tensors, shared memory + gloo for CPU ones
        self.nccl: NcclRunner | None = None
        self.comms: Communicators | None = None
        if device.type == "cuda":
            if cuda_built():
                self.nccl = NcclRunner(info, device, prefix)
                self.executor: Any = self.nccl.executor
            else:  # degraded: only the backend's own collectives (see run())
                self.executor = None
                log.warning("hocc: hocc._C was built without CUDA; CUDA collectives go to %s unplanned",
                            type(info.inner).__name__)
        else:
            c = load()
            self.transport = c.GroupTransport(info.rank, info.size)
            self.executor = c.Executor(self.transport)
            self.comms = Communicators(info, prefix, self.transport, cfg.shm_piece_bytes, cfg.shm_wait)
        if self.executor is not None:
            self.executor.set_trace(cfg.trace)
        self.recorder = Recorder(cfg.record, lambda: record_dump.header(self.info, self.device, self.topology),
                                 self.executor)
        self._record_dir = cfg.record_dir
        record_dump.register(self.recorder)
        self._peer_failure: str | None = None
        self.watchdog = Watchdog(info.store, f"{prefix}/failed", info.rank, self._peer_failed)

    # -- planning ---------------------------------------------------------------
    def settings(self, cfg: Config) -> PlannerConfig:
        """The planner settings this engine runs with under `cfg` (hocc.plan.policy)."""
        if self._settings is None or self._settings[0] is not cfg:
            host = "net" if cfg.host_transport == "net" else "shm"
            self._settings = (cfg, planner_settings(cfg.planner, self.device.type, self.topology, host,
                                                    cfg.ring_ops))
        return self._settings[1]

    def _compiled(self, collective: str, count: int, elem_size: int, algo: str, cfg: Config) -> _Compiled:
        pcfg = self.settings(cfg)
        if self.executor is None:
            algo = "native"
        key = (collective, count, elem_size, algo, pcfg)
        entry = self._plans.pop(key, None)
        if entry is None:
            plan = make_plan(collective, count, elem_size, self.topology, algo, pcfg)
            entry = _Compiled(plan, to_native(plan) if self.executor is not None else None, plan_hash(plan))
            if len(self._plans) >= PLAN_CACHE_SIZE:  # least recently used out (dicts keep insertion order)
                self._plans.pop(next(iter(self._plans)))
        self._plans[key] = entry  # (re)inserted last: the most recently used
        if cfg.debug:
            log.warning("hocc rank %d/%d (%s): %s", self.rank, self.size, self.topology.shape(), entry.plan.summary())
        return entry

    def plan(self, collective: str, count: int, elem_size: int, algo: str, cfg: Config | None = None) -> Plan:
        """The plan a call would run (count per rank: the all_reduce tensor, the
        all_gather input, the reduce_scatter output)."""
        return self._compiled(collective, count, elem_size, algo, cfg or get_config()).plan

    # -- running ----------------------------------------------------------------
    def run(self, collective: str, inp: torch.Tensor, out: torch.Tensor, reduce_op: str = "sum",
            algo: str | None = None, async_op: bool = False) -> Work | None:
        """One collective, from plan to result: `inp` and `out` are checked
        (contiguous, on this engine's device, sizes as torch.distributed
        wants); `reduce_op` is 'sum', 'avg', 'min', 'max' or 'product'. Runs
        after every earlier call of this engine; blocks unless async_op."""
        cfg = get_config()
        if self.failed is not None:
            raise self._failed_earlier(collective)
        count = out.numel() if collective == "reduce_scatter" else inp.numel()
        entry = self._compiled(collective, count, inp.element_size(), algo or cfg.algo, cfg)
        self.last_plan = entry.plan
        dtype = dtype_name(inp.dtype)
        call = Call(self._seq, collective, count, dtype, reduce_op, entry.plan.algo, entry.hash)
        self._seq += 1
        if self.device.type == "cpu":
            note_cpu_call(cfg.malloc_trim_s)
        made = time.time_ns() if self.recorder.on else 0  # the flight recorder's enqueue time
        return self.submit(lambda: self._execute(entry, inp, out, reduce_op, call, cfg.check, made), [out], async_op)

    def _execute(self, entry: _Compiled, inp: torch.Tensor, out: torch.Tensor, reduce_op: str, call: Call,
                 check: str, made: int) -> None:
        """One call on the worker, in call order. Any failure fails the group
        for good (self.failed): its comms may hold unmatched messages."""
        with self._running(call.collective):
            if self.failed is not None:
                raise self._failed_earlier(call.collective)
            self._execute_checked(entry, inp, out, reduce_op, call, check, made)

    def _execute_checked(self, entry: _Compiled, inp: torch.Tensor, out: torch.Tensor, reduce_op: str, call: Call,
                         check: str, made: int) -> None:
        # the flight recorder notes what was called here, on the worker (an async caller's thread then does
        # nothing more: its GIL time is what the worker waits for); the executor notes the run
        if made:
            self.recorder.made(call.seq, call.collective, call.count, call.dtype, inp.element_size(), reduce_op,
                               entry.plan, made)
        try:
            if check == "all":
                check_all(self._checker(), call, self.rank, self.size, self.info.name)
            self.watchdog.begin()
            self._run_plan(entry, inp, out, reduce_op, call if check != "off" else None, call.seq)
        except Exception as e:
            raise self._fail(call, entry.plan, e) from e
        finally:
            self.watchdog.end()

    def _run_plan(self, entry: _Compiled, inp: torch.Tensor, out: torch.Tensor, reduce_op: str,
                  call: Call | None, seq: int) -> None:
        plan = entry.plan
        if self.executor is None:
            _backend_call(self.info.inner, plan.collective, inp, out, reduce_op, self.size)
            return
        if not entry.prepared:  # collective set-up, here on the worker, in call order
            if self.comms is not None:
                self.comms.prepare(plan)
            entry.prepared = True
        nbytes = plan.layout.size * inp.element_size() if plan.work_at == "scratch" else 0
        # an in-place all_reduce that would reduce in the caller's tensor (native) goes through
        # the work buffer, so that a failure leaves the tensor as it was
        beside = (nbytes == 0 and plan.collective == "all_reduce" and inp.device.type == "cpu"
                  and inp.data_ptr() == out.data_ptr() and inp.numel() > 0)
        buf = self._take_work(out.numel() * out.element_size() if beside else nbytes, inp.device)
        into = buf.data_ptr() if beside else out.data_ptr()
        stream = self.nccl.stream() if self.nccl is not None else 0
        dtype = dtype_name(inp.dtype)
        self.executor.run(entry.native, inp.data_ptr(), into, buf.data_ptr() if nbytes else 0, dtype, reduce_op,
                          stream, call.native() if call is not None else None, seq)
        if beside:
            load().reduce(out.data_ptr(), into, out.numel(), dtype, "copy")
        self._give_back(buf)
        if self.cfg.trace and self.nccl is None:
            self._log_trace(plan)

    # -- failures ---------------------------------------------------------------
    def _where(self) -> str:
        ranks = self.info.global_ranks
        glob = "" if ranks == list(range(self.size)) else f"; its ranks 0..{self.size - 1} are global ranks {ranks}"
        return f"group {self.info.name!r} (rank {self.rank} of {self.size}{glob})"

    def _fail(self, call: Call, plan: Plan, e: Exception) -> CollectiveError:
        """Fail the group: remember why, abort the transport (peers blocked on
        this rank fail too), tell the group through the watchdog, and write
        the flight recorder's dump before the error reaches the caller."""
        why = str(e)
        tiers = {st.stage: st.tier for st in plan.steps}  # "at stage 1," -> "at stage 1 (rail),"
        why = re.sub(r"at stage (\d+),", lambda m: f"at stage {m[1]} ({tiers.get(int(m[1]), '?')}),", why)
        msg = (f"hocc: {call.describe()} failed on {self._where()}: {why}. The group is no longer usable: destroy "
               "it and create it again (dist.destroy_process_group() and init_process_group(), or "
               "dist.new_group() again for a sub-group)")
        if self.failed is None:
            self.failed = msg
            self._abort_transport(msg)
            if self._peer_failure is None:
                self.watchdog.publish(f"{call.describe()} failed: {why}")
        if self.recorder.on:
            self.recorder.failed(call.seq, why)
            msg += record_dump.on_failure(self.recorder, f"failed: {call.describe()}: {why}", self._record_dir)
        mismatch = (CallMismatchError, load().HoccMismatchError)  # csrc's MismatchError, kept through re-wraps
        kind = CallMismatchError if isinstance(e, mismatch) else CollectiveError
        return kind(msg, collective=call.collective, group=self.info.name)

    def _failed_earlier(self, collective: str) -> CollectiveError:
        return CollectiveError(f"hocc: {collective} on {self._where()}: the group failed earlier and cannot be "
                               f"used again; destroy it and create it again. The first failure: {self.failed}",
                               collective=collective, group=self.info.name)

    def _peer_failed(self, why: str) -> None:
        """The watchdog saw a peer's failure on the store: end the running call now."""
        self._peer_failure = why
        self._abort_transport(why)

    def _abort_transport(self, why: str) -> None:
        """Wake every wait of this rank's comms (the running call then fails with `why`)."""
        transport = self.nccl.transport if self.nccl is not None else getattr(self, "transport", None)
        if transport is not None:
            transport.abort(why)

    def _checker(self) -> Any:
        """HOCC_CHECK's own gloo group over the whole group (CPU tensors, any device's engine)."""
        if self._check_pg is None:
            store = dist.PrefixStore(f"{self.prefix}/check", self.info.store)
            self._check_pg = dist.ProcessGroupGloo(store, self.rank, self.size, self.info.timeout)
        return self._check_pg

    def inject_fault(self, stage: int, action: str) -> None:
        """For fault tests: this rank fails in its next call on reaching `stage`
        ('raise', 'kill', 'stop' or 'exit'; see Executor::inject_fault)."""
        if self.executor is None:
            raise RuntimeError("hocc: this engine has no executor to inject a fault into")
        self.executor.inject_fault(stage, action)

    def _take_work(self, nbytes: int, device: torch.device) -> torch.Tensor:
        """A byte buffer, reused between calls on CPU: a fresh large allocation
        costs a page fault per 4 KiB (torch's CPU allocator returns big blocks
        to the OS), which at 8 ranks on 2 cores costs more than the copies.
        On CUDA torch's caching allocator does that already."""
        if device.type != "cpu":
            return torch.empty(nbytes, dtype=torch.uint8, device=device)
        with self._lock:
            spare, self._spare = self._spare, None
        if spare is None or spare.numel() < nbytes:
            spare = torch.empty(max(nbytes, 1), dtype=torch.uint8)
        return spare

    def _give_back(self, buf: torch.Tensor) -> None:
        """Keep a CPU buffer for the next call (only after a run ended well: a
        failed run's buffer may still be written by a backend op that timed out)."""
        if buf.device.type == "cpu":
            with self._lock:
                if self._spare is None or self._spare.numel() < buf.numel():
                    self._spare = buf

    def _log_trace(self, plan: Plan) -> None:
        """Per-stage seconds of the plan just run (HOCC_TRACE=1), summed over chunks."""
        tiers = {s.stage: s.tier for s in plan.steps}
        per: dict[tuple[int, str], float] = {}
        for stage, _, op, secs in self.executor.take_timings():
            per[(stage, op)] = per.get((stage, op), 0.0) + secs
        parts = ", ".join(f"s{s} {op}@{tiers.get(s, '?')} {t * 1e3:.1f} ms" for (s, op), t in sorted(per.items()))
        log.warning("hocc trace rank %d: %s: %s", self.rank, plan.summary(), parts)

    def submit(self, job: Callable[[], None], result: list[torch.Tensor], async_op: bool) -> Work | None:
        """Run `job` after every earlier call of this engine; block unless async_op."""
        stream = torch.cuda.current_stream(self.device) if self.device.type == "cuda" else None
        with self._lock:
            inline = not async_op and self._outstanding == 0
            if not inline:
                self._outstanding += 1
        if inline:
            with on_stream(stream):
                job()
            return None
        fut: Future[torch.cuda.Event | None] = self._worker.submit(self._run_job, job, stream)
        work = Work(fut, result, stream)
        if async_op:
            return work
        work.wait()
        return None

    def _run_job(self, job: Callable[[], None], stream: Any) -> torch.cuda.Event | None:
        """Run one queued call; on CUDA, return an event recorded after its kernels (Work waits on it)."""
        try:
            with on_stream(stream):
                job()
                if stream is None:
                    return None
                done = torch.cuda.Event()
                done.record(stream)
                return done
        finally:
            with self._lock:
                self._outstanding -= 1

    # -- teardown ---------------------------------------------------------------
    @contextlib.contextmanager
    def _running(self, what: str) -> Iterator[None]:
        """Around every run (on the worker or inline): raises at once on a
        closed or aborted engine, and keeps teardown from freeing the
        communicators under a run still in flight."""
        with self._lock:
            self.check_usable(what)
            self._busy += 1
        try:
            yield
        finally:
            with self._lock:
                self._busy -= 1
                self._idle.notify_all()

    def check_usable(self, what: str = "this call") -> None:
        """Raise if this engine was closed or aborted: its communicators are gone."""
        if self.closed is not None:
            raise RuntimeError(f"hocc: {what} on group {self.info.name!r} cannot run: the group's hocc engine "
                               f"was {self.closed}. Destroy the process group and init it again "
                               "(torch.distributed.destroy_process_group, then init_process_group / new_group)")

    def close(self) -> None:
        """Release everything this engine holds once the calls made before have
        ended: the worker thread, the gloo sub-groups, the shared-memory
        segments and the buffers. Idempotent; later calls raise."""
        with self._lock:
            if self.closed is None:
                self.closed = "closed"
        self._worker.shutdown(wait=True)
        self._release_when_idle()

    def abort(self, why: str) -> None:
        """Make the call in flight and every later one fail now: the shared-
        memory segments' abort flag (host peers fail too), gloo's abort of the
        sub-groups, ncclCommAbort. Queued calls are cancelled; what close()
        releases goes once the call in flight has returned (at once if none
        is: the watchdog may call this from its own thread)."""
        with self._lock:
            if self.closed is None or self.closed == "closed":
                self.closed = f"aborted ({why})"
            comms, nccl = self.comms, self.nccl
        if comms is not None:
            comms.abort(why)
        elif nccl is not None:  # ncclCommAbort on every communicator
            nccl.transport.abort(why)
        self._worker.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            busy = self._busy > 0
        if busy:
            threading.Thread(target=self._release_when_idle, name="hocc-release", daemon=True).start()
        else:
            self._release_when_idle()

    def _release_when_idle(self) -> None:
        """Drop every reference to a backend, not just shut it, once no run is
        in flight: a closed engine can outlive its group (a caught error's
        traceback holds the frame that holds it), and gloo frees a group's
        threads and sockets only with the last reference."""
        with self._lock:
            self._idle.wait_for(lambda: self._busy == 0)
            comms, self.comms = self.comms, None
            self.recorder.detach()  # its records stay readable; the executor (and the transport it holds) goes
            record_dump.unregister(self.recorder)
            self.executor = self.transport = self.nccl = None
            self.info = dataclasses.replace(self.info, inner=None)
            self._spare = None
            self._plans.clear()
            self._settings = None
            self.group = None
        self.watchdog.close()
        if comms is not None:
            comms.close()


def _backend_call(backend: Any, collective: str, inp: torch.Tensor, out: torch.Tensor, reduce_op: str,
                  size: int) -> None:
    """The backend's own collective, for CUDA tensors when hocc._C has no CUDA
    (AVG as SUM, then divided: not every backend has it)."""
    wire: Any = {"avg": dist.ReduceOp.SUM, "sum": dist.ReduceOp.SUM, "min": dist.ReduceOp.MIN,
            "max": dist.ReduceOp.MAX, "product": dist.ReduceOp.PRODUCT}[reduce_op]
    if collective == "all_reduce":
        opts = dist.AllreduceOptions()
        opts.reduceOp = wire
        backend.allreduce([inp], opts).wait()
    elif collective == "all_gather":
        backend._allgather_base(out.view(-1), inp.view(-1)).wait()
    else:
        ropts = dist.ReduceScatterOptions()
        ropts.reduceOp = wire
        backend._reduce_scatter_base(out.view(-1), inp.view(-1), ropts).wait()
    if reduce_op == "avg":
        out.div_(size)
