"""One engine per (process group, device type): it owns a call from plan to
result, the same way on every device. The group (hocc.engine.group), the
planner settings (hocc.plan.policy), the plan cache (hocc.engine.plan_cache), the
communicators (hocc.engine.comms: torch's gloo or NCCL sub-groups, shared
memory on a host) and the C++ executor that runs every plan live here, and
one queue (hocc.engine.queue: a C++ worker thread) runs queued calls in the
order they were made (every rank issues the same collectives in the same
order, which keeps sub-group traffic matched).
What differs between CPU and GPU lives behind the C++ device layer."""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
import weakref
from collections import Counter
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from hocc.config import Config, get_config
from hocc.engine.agreement import Call, check_all
from hocc.engine.comms import Communicators
from hocc.engine.errors import CallMismatchError, CollectiveError, failed_step
from hocc.engine.group import GroupInfo, device_name, resolve_topology
from hocc.engine.heap import note_cpu_call
from hocc.engine.plan_cache import Compiled, PlanCache
from hocc.engine.prepared import Prepared
from hocc.engine.queue import Around, CallQueue, Ticket
from hocc.engine.tuning import Trial, Tuner, timed
from hocc.engine.tuning_file import TuningFile
from hocc.engine.ucx import tcp_buffer_bytes
from hocc.engine.watchdog import Watchdog
from hocc.engine.work import Work, on_stream
from hocc.executor import load
from hocc.executor.cpp_form import dtype_name
from hocc.executor.lifecycle import hand_off
from hocc.plan.planner import PlannerConfig
from hocc.plan.policy import planner_settings
from hocc.plan.types import Plan
from hocc.record import dump as record_dump
from hocc.record.recorder import Recorder
from hocc.topology.spec import to_spec

log = logging.getLogger("hocc")

# Engines this process made per group and device: part of the store prefix, so
# a rebuilt engine never meets its predecessor's keys. Counted per group (not
# globally) because ranks use different sets of groups.
_generations: Counter[str] = Counter()


class Engine:
    """Serves one group and device under the engine settings of `cfg`
    (hocc.config.ENGINE_SETTINGS, read here once); call settings are read by
    each call (run). stale() says when the current settings want a new one."""

    def __init__(self, info: GroupInfo, device: torch.device, cfg: Config) -> None:
        self.info = info
        self.device = device
        self._cpu = device.type == "cpu"
        self.cfg = cfg  # what the engine settings were read from (a later config with the same ones, once seen)
        self.rank = info.rank
        self.size = info.size
        key = f"{info.name}/{device.type}"
        prefix = f"hocc/{key}/{_generations[key]}"
        _generations[key] += 1
        self.prefix = prefix
        self.failed: str | None = None  # the first failure: every later call raises it
        self._check_pg: Any = None  # HOCC_CHECK's gloo group
        self._barrier_token = torch.zeros(1)  # what _start_together reduces
        self.topology = resolve_topology(info, prefix, cfg, device)
        self._group: weakref.ref[dist.ProcessGroup] | None = None  # the API's group, when it made this engine
        # what a call of (collective, count, elem_size, algo, dtype) runs, where that can no longer change
        # (a fixed algo, or auto's bucket decided), under the config object `_ready_cfg`: a repeated call
        # skips planning and auto's lookup (half the engine's Python per call)
        self._ready: dict[tuple[str, int, int, str, str], Compiled] = {}
        self._ready_cfg: Config | None = None
        # a sync CPU call of a ready shape that ran as the executor's run alone, made once into C++
        # (_C.PreparedRun): its next call is this lookup and one crossing, keyed on what the caller
        # passes (collective, input and output sizes, torch dtype, op, algo), under `_ready_cfg` too;
        # the drop-in's repeated calls find them in C++ (hocc.api.repeat)
        self._prepared: dict[tuple[Any, ...], Prepared] = {}
        self.plans = PlanCache(self.topology)
        self._settings: tuple[Config, PlannerConfig] | None = None
        self._tuners: dict[PlannerConfig, Tuner] = {}  # auto's choices per planner settings
        self._tuning_file = TuningFile(cfg.tuning_file) if cfg.tuning_file else None
        # also numbers the calls (alike on every rank: the call check compares them) and keeps the last
        # call's plan (last_plan), for the calls made in C++ too (hocc.api.repeat)
        self._queue = CallQueue(self._queued_run_failed, self._dropped)
        self._lock = threading.Lock()
        self.closed: str | None = None  # why calls can no longer run ('closed', 'aborted (...)')
        # the C++ executor, over torch's backends (gloo or NCCL) and shared memory
        c = load()
        self.transport = c.GroupTransport(info.rank, info.size, device_name(device))
        self.executor = c.Executor(self.transport)
        self.comms: Communicators | None = Communicators(info, prefix, self.transport, device, cfg.shm_piece_bytes,
                                                         cfg.shm_wait, cfg.net_transport, cfg.ucx_spin_us,
                                                         tcp_buffer_bytes(cfg, self.topology))
        self.executor.set_trace(cfg.trace)
        self.recorder = Recorder(cfg.record, lambda: record_dump.header(self.info, self.device, self.topology),
                                 self.executor, self.comms.kinds)
        record_dump.register(self.recorder)
        self._peer_failure: str | None = None
        self.watchdog = Watchdog(info.store, f"{prefix}/failed", info.rank, self._peer_failed, self._queue.busy_for)

    @property
    def group(self) -> dist.ProcessGroup | None:
        """The process group the drop-in calls made this engine for (None for a
        backend's engine, or once that group is gone). Held weakly: the engine
        never keeps a group torch has ended alive (hocc.engine.group_engines)."""
        return self._group() if self._group is not None else None

    @group.setter
    def group(self, group: dist.ProcessGroup | None) -> None:
        self._group = weakref.ref(group) if group is not None else None

    def stale(self, cfg: Config) -> bool:
        """Whether the next call under `cfg` needs a new engine: its engine
        settings differ from this one's. A failed engine is never stale (its
        group stays failed); neither is a closed one (its calls raise)."""
        if cfg is self.cfg:
            return False
        if cfg.engine_settings() == self.cfg.engine_settings():
            self.cfg = cfg  # the same engine settings: the next look is one `is`
            return False
        return self.failed is None and self.closed is None

    # -- planning ---------------------------------------------------------------
    def settings(self, cfg: Config) -> PlannerConfig:
        """The planner settings this engine runs with under `cfg` (hocc.plan.policy)."""
        if self._settings is None or self._settings[0] is not cfg:
            host = "net" if cfg.host_transport == "net" else "shm"
            self._settings = (cfg, planner_settings(cfg.planner, self.device.type, self.topology, host,
                                                    cfg.ring_ops))
        return self._settings[1]

    def tuner(self, cfg: Config | None = None) -> Tuner:
        """auto's choices under `cfg`'s planner settings (hocc.engine.tuning)."""
        cfg = cfg or get_config()
        settings = self.settings(cfg)
        t = self._tuners.get(settings)
        if t is None:
            key = f"{self.device.type} {to_spec(self.topology) or self.topology.shape()} world={self.size} " \
                  f"ring_ops={','.join(settings.ring_ops) or 'none'} host={settings.host_impl or 'net'}"
            t = self._tuners[settings] = Tuner(self.topology, settings, self.device.type, self.cfg.tune,
                                               self._agree_max, self._tuning_file, key, self.rank == 0)
        return t

    def _agree_max(self, values: list[float]) -> list[float]:
        """Every rank's values, maxed element-wise over the group (in call order, on the thread of the call
        that measured them). On CPU through this engine's own executor, as _start_together: over gloo the call
        that ends a bucket's check took 10-11 ms on the emulated 4x2 (4 B all_gather), through the executor
        4.3 ms, within a short job's first calls; on a GPU on the engine's gloo group."""
        t = torch.tensor(values, dtype=torch.float64)
        if self.device.type == "cpu" and t.numel():
            self._run_own("all_reduce", t, "float64", "max", get_config())
            return [float(v) for v in t]
        opts = dist.AllreduceOptions()
        opts.reduceOp = dist.ReduceOp.MAX  # type: ignore[assignment]  # torch accepts the enum member
        self._checker().allreduce([t], opts).wait()
        return [float(v) for v in t]

    def _run_own(self, collective: str, t: torch.Tensor, dtype: str, reduce_op: str, cfg: Config) -> None:
        """`t` reduced in place by a ho_ring plan through this engine's executor: no call number, no call check,
        no recorder entry (the tuner's barrier and agreement, which run in call order between calls)."""
        entry = self.plans.get(collective, t.numel(), t.element_size(), "ho_ring", self.settings(cfg))
        if not entry.setup.done:
            if self.comms is not None:
                self.comms.prepare(entry.groups)
            entry.setup.done = True
        self.executor.run(entry.cpp, t.data_ptr(), t.data_ptr(), 0, dtype, reduce_op)

    def _ready_or_compiled(self, collective: str, count: int, elem_size: int, algo: str, cfg: Config,
                           dtype: str) -> tuple[Compiled, Trial | None]:
        """_compiled, answered from _ready where a call of this shape can no longer run anything else."""
        if cfg is not self._ready_cfg:
            self._drop_prepared()
            self._ready, self._ready_cfg = {}, cfg
        key = (collective, count, elem_size, algo, dtype)
        entry = self._ready.get(key)
        if entry is not None:
            return entry, None
        entry, trial = self._compiled(collective, count, elem_size, algo, cfg, dtype)
        if trial is None and not cfg.debug and (algo != "auto" or self.tuner(cfg).settled(collective, count,
                                                                                          elem_size, dtype)):
            if len(self._ready) >= self.plans.size:  # as bounded as the plan cache: oldest out
                self._ready.pop(next(iter(self._ready)))
            self._ready[key] = entry
        return entry, trial

    def _compiled(self, collective: str, count: int, elem_size: int, algo: str, cfg: Config,
                  dtype: str = "float32") -> tuple[Compiled, Trial | None]:
        settings = self.settings(cfg)
        trial = None
        if algo == "auto":
            pick, trial = self.tuner(cfg).pick(collective, count, elem_size, dtype,
                                               lambda: self.failed or self.closed)
            entry = self.plans.get(collective, count, elem_size, pick.algo, pick.settings(settings))
            why = "auto, " + ("tuning: a trial" if trial is not None else pick.why)
            entry.reason = why
        else:
            entry = self.plans.get(collective, count, elem_size, algo, settings)
        if cfg.debug:
            log.warning("hocc rank %d/%d (%s): %s", self.rank, self.size, self.topology.shape(), entry.plan.summary())
        return entry, trial

    def plan(self, collective: str, count: int, elem_size: int, algo: str, cfg: Config | None = None,
             dtype: str = "float32") -> Plan:
        """The plan a call would run (count per rank: the all_reduce tensor, the
        all_gather input, the reduce_scatter output); for auto, its measured
        pick, else the table's (a bucket still in trials: the model's pick)."""
        cfg = cfg or get_config()
        if algo == "auto":
            pick = self.tuner(cfg).peek(collective, count, elem_size, dtype)
            plan = self.plans.get(collective, count, elem_size, pick.algo, pick.settings(self.settings(cfg))).plan
            return dataclasses.replace(plan, reason=f"auto, {pick.why}")
        return self._compiled(collective, count, elem_size, algo, cfg)[0].plan

    @property
    def calls_made(self) -> int:
        return int(self._queue.cpp.made)

    @property
    def _last(self) -> Compiled | None:
        """The last call's plan entry."""
        last: Compiled | None = self._queue.cpp.last
        return last

    @property
    def last_plan(self) -> Plan | None:
        """The plan of this engine's last call (built now if it was a scaled one); its
        meta['transports'] says what carried each of this rank's groups ('stage 0 ring [0,4]': 'ucx')."""
        if self._last is None:
            return None
        plan = self._last.plan
        used = {f"stage {s.stage} {s.impl} [{','.join(map(str, g.ranks))}]": self._kind_of(s.stage, g.ranks, s.impl)
                for s in plan.steps for g in s.groups_of(self.rank) if len(g.ranks) > 1}
        return dataclasses.replace(plan, meta={**plan.meta, "transports": used}) if used else plan

    def _kind_of(self, stage: int, ranks: tuple[int, ...] | list[int], impl: str) -> str:
        """What carries this rank's communicator of a step's group ('shm', 'ucx', 'gloo', 'nccl'; '' if none)."""
        return self.comms.kinds(stage, ranks, impl) if self.comms is not None else ""

    # -- running ----------------------------------------------------------------
    def run(self, collective: str, inp: torch.Tensor, out: torch.Tensor, reduce_op: str = "sum",
            algo: str | None = None, async_op: bool = False) -> Work | None:
        """One collective, from plan to result: `inp` and `out` are checked
        (contiguous, on this engine's device, sizes as torch.distributed
        wants); `reduce_op` is 'sum', 'avg', 'min', 'max' or 'product'. Runs
        after every earlier call of this engine; blocks unless async_op. The
        call settings are read here, once: the call runs under them to its end."""
        cfg = get_config()
        if cfg is self._ready_cfg:
            prepared = self._prepared.get((collective, inp.numel(), out.numel(), inp.dtype, reduce_op, algo))
            if prepared is not None:
                run = prepared.run
                if run is not None and run.take():
                    return self._run_prepared(prepared, inp, out, cfg, async_op)
                if run is not None:  # its calls are spent (auto measures next): the full way from now on
                    self._let_go(self._prepared.pop(prepared.key))
                del run
        if self.failed is not None:
            raise self._failed_earlier(collective)
        self.check_usable(collective)  # before any byte moves: a closed engine takes no new call
        count = out.numel() if collective == "reduce_scatter" else inp.numel()
        dtype = dtype_name(inp.dtype)
        elem_size = inp.element_size()
        entry, trial = self._ready_or_compiled(collective, count, elem_size, algo or cfg.algo, cfg, dtype)
        call = Call(self._queue.cpp.begin(entry), collective, count, dtype, reduce_op, entry.algo, entry.hash)
        if self._cpu:
            note_cpu_call(cfg.malloc_trim_s)
        if self.recorder.on:  # noted when made, in call order, whichever way the call then runs
            self.recorder.made(call.seq, collective, count, dtype, elem_size, reduce_op, entry, time.time_ns())
        stream = None if self._cpu else torch.cuda.current_stream(self.device)  # the caller's, for the run
        around = self._around(entry, call, cfg, trial, stream)
        work = self._run(entry, inp, out, dtype, reduce_op, call, cfg, async_op, around, stream)
        if around is None:
            key = (collective, inp.numel(), out.numel(), inp.dtype, reduce_op, algo)
            if self._ready.get((collective, count, elem_size, algo or cfg.algo, dtype)) is entry:
                self._prepare(key, entry, call, cfg)
            elif trial is None and (algo or cfg.algo) == "auto" and not cfg.debug:
                # auto's bucket still runs the model's pick before measuring: its next calls of that, prepared
                calls = self.tuner(cfg).lease(collective, count, elem_size, dtype)
                if calls:
                    self._prepare(key, entry, call, cfg, calls)
        return work

    def _around(self, entry: Compiled, call: Call, cfg: Config, trial: Trial | None, stream: Any) -> Around | None:
        """What a call needs of Python around its plan run (queue.Around), or None: a plain call, the
        executor's run alone (a CPU plan already set up, no trial, no HOCC_CHECK=all, no trace)."""
        check = cfg.check
        if stream is None and trial is None and entry.setup.done and check != "all" and not self.cfg.trace:
            return None

        def around(run: Callable[[], None], queued: bool) -> torch.cuda.Event | None:
            with on_stream(stream):  # the caller's stream, on the worker too: the run is ordered on it
                try:
                    if check == "all":  # first: a mismatched call must not start a set-up its peers skip
                        check_all(self._checker(), call, self.rank, self.size, self.info.name)
                    if not entry.setup.done:  # collective set-up, in call order (on the worker if queued)
                        if self.comms is not None:
                            self.comms.prepare(entry.groups)
                        entry.setup.done = True
                    if trial is None:
                        run()
                    else:  # a tuning trial: timed (on a GPU, to its end on the stream), then reported
                        if trial.synced:  # a burst starts together: the last call's stragglers are not its cost
                            self._start_together(stream is None, cfg)
                        with timed(self.device) as took:
                            run()
                        trial.tuner.measured(trial, took())
                except BaseException:
                    if trial is not None:
                        trial.bucket.release()  # failed: no caller waits on its trials any longer
                    raise
                if self.cfg.trace:
                    self._log_trace(entry.plan)
                if stream is None or not queued:  # run here, on the caller's own stream: nothing to wait for
                    return None
                done = torch.cuda.Event()  # Work.wait orders the waiter's stream after it
                done.record(stream)
                return done

        return around

    def _start_together(self, cpu: bool, cfg: Config) -> None:
        """A barrier before a tuning burst. On CPU a 1-element all_reduce through this engine's own executor
        (no call number, no call check: in call order, as the trial it precedes): gloo's barrier left the
        first hocc call after it 3x slower than after hocc's own (1.1 against 0.35 ms, emulated 2x4, 32 B),
        which a burst of a few calls would measure as the candidate's cost."""
        if not cpu:
            self._checker().barrier().wait()
            return
        self._run_own("all_reduce", self._barrier_token, "float32", "max", cfg)

    def _run(self, entry: Compiled, inp: torch.Tensor, out: torch.Tensor, dtype: str, reduce_op: str, call: Call,
             cfg: Config, async_op: bool, around: Around | None, stream: Any = None) -> Work | None:
        """Every call's one way: its plan run (within `around`, if it has one), sync on this thread when
        the queue is idle (its failure raises here), else queued to the worker (its failure comes back
        through _queued_run_failed, on the worker)."""
        cpp_call = call.cpp() if cfg.check != "off" else None
        if not async_op:
            try:
                if self._queue.run_here(self.executor, entry.cpp, inp, out, dtype, reduce_op, cpp_call, call.seq,
                                        around):
                    return None
            except Exception as e:  # the executor's failure, or what the Python around it raised
                raise self._run_failed(call, cfg, e) from e
        ticket = self._queue.push_run(self.executor, entry.cpp, inp, out, dtype, reduce_op, cpp_call, call.seq,
                                      (entry, call, cfg, inp, out), around)
        return self._handed(Work(ticket, [out], stream), async_op)

    def _prepare(self, key: tuple[Any, ...], entry: Compiled, call: Call, cfg: Config, calls: int = -1) -> None:
        """Make the call shape `key` a prepared one (_prepared), bounded as the plan cache is, for `calls`
        more calls (-1: any number)."""
        if self.closed is not None or self.failed is not None:
            return
        old = self._prepared.pop(key, None)  # a shape prepared again (its counted calls spent meanwhile)
        if old is not None:
            self._let_go(old)
        if len(self._prepared) >= self.plans.size:
            self._let_go(self._prepared.pop(next(iter(self._prepared))))  # oldest out
        cpp_call = call.cpp() if cfg.check != "off" else None
        run = load().PreparedRun(self._queue.cpp, self.executor, entry.cpp, call.dtype, call.op, cpp_call, calls)
        self._prepared[key] = Prepared(key, run, entry, call.collective, call.count, call.dtype, key[3].itemsize,
                                       call.op)

    def prepared(self, key: tuple[Any, ...]) -> Prepared | None:
        """The prepared call of shape `key` (collective, input and output numel, torch dtype, op, algo) if
        it is still one under the current settings (hocc.api.repeat keeps them by the API's arguments)."""
        return self._prepared.get(key) if get_config() is self._ready_cfg else None

    def _run_prepared(self, p: Prepared, inp: torch.Tensor, out: torch.Tensor, cfg: Config,
                      async_op: bool = False) -> Work | None:
        """A prepared call (_prepared): one crossing into C++, on this thread if it is sync and the queue is
        idle, else queued. hocc.api.repeat's table makes a repeated sync call the same way in C++
        (csrc/python/repeat_bindings.cc: these steps, then _prepared_failed or _prepared_busy)."""
        seq = self._queue.cpp.begin(p.entry)
        note_cpu_call(cfg.malloc_trim_s)
        if self.recorder.on:
            self.recorder.made(seq, *p.record_fields(), time.time_ns())
        if async_op:
            return self._prepared_busy(p, inp, out, seq, async_op)
        run = self._prepared_run(p)
        failed: Exception | None = None
        try:
            if run.run_here(inp.data_ptr(), out.data_ptr(), seq):
                return None
        except (load().HoccNativeError, load().HoccMismatchError) as e:
            failed = e
        finally:
            del run  # a caught error's frames must not hold the executor (the run holds it)
        if failed is not None:
            raise self._prepared_failed(p, seq, failed)
        return self._prepared_busy(p, inp, out, seq)

    def _prepared_run(self, p: Prepared) -> Any:
        """p's C++ run, read once (abort() on the watchdog's thread may drop it meanwhile); dropped since
        it was looked up, the engine failed or closed: that error."""
        run = p.run
        if run is None:
            raise self._failed_earlier(p.collective) if self.failed is not None else self._unusable(p.collective)
        return run

    def _prepared_failed(self, p: Prepared, seq: int, err: Exception) -> BaseException:
        """The error that call `seq` of prepared shape `p` raises for its run's failure `err` (its cause)."""
        exc = self._run_failed(p.call(seq), get_config(), err)
        exc.__cause__ = err
        return exc

    def _prepared_busy(self, p: Prepared, inp: torch.Tensor, out: torch.Tensor, seq: int,
                       async_op: bool = False) -> Work | None:
        """Call `seq` of prepared shape `p` queued (async, or the queue is busy); a sync one returns when done."""
        run = self._prepared_run(p)
        try:
            self.check_usable(p.collective)  # queued: a closing engine's queue refuses it (busy: its turn comes)
            ticket = self._queue.push_prepared(run, inp, out, seq, (p.entry, p.call(seq), get_config(), inp, out))
        finally:
            del run
        return self._handed(Work(ticket, [out]), async_op)

    def _drop_prepared(self) -> None:
        """Forget the prepared calls, and let go of their C++ runs, each of which holds the executor (and
        through it the transport): a Prepared may live on in a caught error's frames."""
        for p in self._prepared.values():
            self._let_go(p)
        self._prepared = {}

    @staticmethod
    def _let_go(p: Prepared) -> None:
        if p.run is not None:
            load().repeat_forget(p.run)  # hocc.api.repeat's table (in C++) holds it too
            p.run = None

    def _queued_run_failed(self, ticket: Ticket, err: Exception) -> BaseException:
        """The error a queued plain call raises (on the worker, holding the GIL)."""
        _, call, cfg, _, _ = ticket.context  # (entry, call, cfg, inp, out): the run's plan and tensors held
        exc = self._run_failed(call, cfg, err)
        exc.__cause__ = err
        return exc

    def _run_failed(self, call: Call, cfg: Config, err: Exception) -> CollectiveError:
        """The error of a plain call's failed run, wherever it ran."""
        if self.failed is not None:  # an earlier call failed the group (this one did not run)
            return self._not_run(call)
        return self._fail(call, err, cfg.record_dir)

    def _dropped(self, ticket: Ticket) -> BaseException:
        """The error of a queued call that abort() dropped before it began."""
        ctx = ticket.context  # (entry or None, call), or None for what is not a call
        if ctx is not None and self.recorder.on:
            self.recorder.failed(ctx[1].seq, f"not run: the engine was {self.closed or 'closed'}")
        return self._unusable("this call")

    # -- failures ---------------------------------------------------------------
    def _where(self) -> str:
        ranks = self.info.global_ranks
        glob = "" if ranks == list(range(self.size)) else f"; its ranks 0..{self.size - 1} are global ranks {ranks}"
        return f"group {self.info.name!r} (rank {self.rank} of {self.size}{glob})"

    def _fail(self, call: Call, e: Exception, record_dir: str | None) -> CollectiveError:
        """Fail the group: remember why, abort the transport (peers blocked on
        this rank fail too), tell the group through the watchdog, and write
        the flight recorder's dump before the error reaches the caller."""
        at = failed_step(e)
        why = at.describe() if at is not None else str(e)
        msg = (f"hocc: {call.describe()} failed on {self._where()}: {why}. The group is no longer usable: destroy "
               "it and create it again (dist.destroy_process_group() and init_process_group(), or "
               "dist.new_group() again for a sub-group)")
        if self.failed is None:
            self.failed = msg
            self._drop_prepared()
            self._queue.mark_failed()  # queued runs fail without running
            self._abort_transport(msg)
            if self._peer_failure is None:
                self.watchdog.publish(f"{call.describe()} failed: {why}")
        if self.recorder.on:
            self.recorder.failed(call.seq, why)
            msg += record_dump.on_failure(self.recorder, f"failed: {call.describe()}: {why}", record_dir)
        mismatch = (CallMismatchError, load().HoccMismatchError)  # csrc's MismatchError, kept through re-wraps
        kind = CallMismatchError if isinstance(e, mismatch) else CollectiveError
        return kind(msg, collective=call.collective, group=self.info.name, at=at)

    def _not_run(self, call: Call) -> CollectiveError:
        """A queued call's error when an earlier call failed the group: it never ran (noted so)."""
        if self.recorder.on:
            self.recorder.failed(call.seq, "not run: the group failed earlier")
        return self._failed_earlier(call.collective)

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
        transport = self.transport
        if transport is not None:
            transport.abort(why)

    def _checker(self) -> Any:
        """HOCC_CHECK's own gloo group over the whole group (CPU tensors, any device's engine)."""
        if self._check_pg is None:
            store = dist.PrefixStore(f"{self.prefix}/check", self.info.store)
            self._check_pg = dist.ProcessGroupGloo(store, self.rank, self.size, self.info.timeout)
        return self._check_pg

    def inject_fault(self, stage: int, action: str, hook: Callable[[], None] | None = None) -> None:
        """For fault tests: this rank fails in its next call on reaching `stage`
        ('raise', 'kill', 'stop' or 'exit'), or calls `hook` there ('call': e.g. a
        test cutting this host's link mid-call); see Executor::inject_fault."""
        if self.executor is None:
            raise RuntimeError("hocc: this engine was closed: no executor to inject a fault into")
        self.executor.inject_fault(stage, action, hook)

    def _log_trace(self, plan: Plan) -> None:
        """Per-stage seconds of the plan just run (HOCC_TRACE=1), summed over chunks."""
        tiers = {s.stage: s.tier for s in plan.steps}
        per: dict[tuple[int, str], float] = {}
        for stage, _, op, secs in self.executor.take_timings():
            per[(stage, op)] = per.get((stage, op), 0.0) + secs
        parts = ", ".join(f"s{s} {op}@{tiers.get(s, '?')} {t * 1e3:.1f} ms" for (s, op), t in sorted(per.items()))
        log.warning("hocc trace rank %d: %s: %s", self.rank, plan.summary(), parts)

    @staticmethod
    def _handed(work: Work, async_op: bool) -> Work | None:
        """A queued call's Work to an async caller; a sync caller waits for it here."""
        if async_op:
            return work
        work.wait()
        return None

    # -- teardown ---------------------------------------------------------------
    def check_usable(self, what: str = "this call") -> None:
        """Raise if this engine was closed or aborted: its communicators are gone."""
        if self.closed is not None:
            raise self._unusable(what)

    def _unusable(self, what: str) -> RuntimeError:
        return RuntimeError(f"hocc: {what} on group {self.info.name!r} cannot run: the group's hocc engine "
                            f"was {self.closed or 'closed'}. Destroy the process group and init it again "
                            "(torch.distributed.destroy_process_group, then init_process_group / new_group)")

    def close(self) -> None:
        """Release everything this engine holds once the calls made before have
        ended: the worker thread, the gloo sub-groups, the shared-memory
        segments and the buffers. Idempotent; later calls raise, calls queued
        before still run (every rank runs them: a rank that refused one would
        leave its peers waiting). Called on the worker itself, or where this
        engine's lock is held (a finalizer can run on any thread, in any
        collection), it returns at once and a thread of its own closes."""
        if not self._lock.acquire(blocking=False):
            hand_off(self.close)
            return
        try:
            if self.closed is None:
                self.closed = "closed"
            self._drop_prepared()
        finally:
            self._lock.release()
        if self._queue.on_worker or self._queue.held_here():  # the worker cannot wait for itself, nor for a
            hand_off(self.close)  # lock held here
            return
        self._queue.close()  # runs what was queued before, then its worker ends
        self._release_when_idle()

    def abort(self, why: str) -> None:
        """Make the call in flight and every later one fail now: the shared-
        memory segments' abort flag (host peers fail too), the abort of each
        torch sub-group (gloo's, or NCCL's ncclCommAbort). Queued calls are cancelled; what close()
        releases goes once the call in flight has returned (at once if none
        is: the watchdog may call this from its own thread)."""
        with self._lock:
            if self.closed is None or self.closed == "closed":
                self.closed = f"aborted ({why})"
            self._drop_prepared()
            comms = self.comms
        if comms is not None:  # the transport's waits, then each backend's own abort (ncclCommAbort on NCCL)
            comms.abort(why)
        self._queue.cancel(f"aborted ({why})")
        # a run still in flight ends soon: the comms' abort woke its waits
        if self._queue.busy_for() > 0 or self._queue.on_worker:
            hand_off(self._release_when_idle)
        else:
            self._release_when_idle()

    def _release_when_idle(self) -> None:
        """Drop every reference to a backend, not just shut it, once no run is
        in flight: a closed engine can outlive its group (a caught error's
        traceback holds the frame that holds it), and gloo frees a group's
        threads and sockets only with the last reference."""
        self._queue.join()  # its worker has ended the run it had (close or cancel stopped it)
        with self._lock:
            comms, self.comms = self.comms, None
            self.recorder.detach()  # its records stay readable; the executor (and the transport it holds) goes
            record_dump.unregister(self.recorder)
            self.executor = self.transport = None
            self.info = dataclasses.replace(self.info, inner=None)
            self.plans.clear()
            self._drop_prepared()
            self._ready = {}
            self._settings = None
            self._tuners.clear()
            self.group = None
        self.watchdog.close()
        if comms is not None:
            comms.close()

