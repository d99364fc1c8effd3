"""Settings in one typed object; environment variables only override defaults.
When a setting takes effect: Config's docstring (one rule, every engine)."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, replace

from hocc.plan.cost import CostParams
from hocc.plan.planner import PlannerConfig
from hocc.plan.registry import names
from hocc.plan.types import COLLECTIVES


def algo_choices() -> tuple[str, ...]:
    """What `algo` may name: every registered algorithm (hocc.plan.registry), and 'auto'."""
    return (*names(), "auto")


# When each setting is read (Config's docstring: one rule for when they take effect). Call settings: by each
# call, when it is made. Engine settings: when an engine is made; built into it, so a change replaces engines.
CALL_SETTINGS = ("algo", "debug", "ring_ops", "host_transport", "check", "malloc_trim_s", "record_dir", "planner")
ENGINE_SETTINGS = ("topology", "trace", "shm_piece_bytes", "shm_wait", "record", "tune", "tuning_file",
                   "net_transport")
NET_TRANSPORTS = ("auto", "ucx", "gloo")


@dataclass(frozen=True)
class Config:
    """hocc's settings: HOCC_* environment variables give the defaults, hocc.configure() changes them.

    When a setting takes effect, one rule for every setting and every engine
    (the drop-in calls' engines, hocc.all_reduce etc., and those of "hocc"
    backend groups, dist.init_process_group("hocc"), alike): from the next
    call made after the change. A call already made, an async one still queued
    or running included, runs to its end under the settings it was made with:
    nothing changes mid-call. The environment is read once, when settings are
    first needed; hocc.config.reset_config() reads it again, under the same rule.

    How that holds: call settings (CALL_SETTINGS) are read by each call when it
    is made. Engine settings (ENGINE_SETTINGS) are read when an engine is made
    and built into it (its topology, shared-memory segments, executor, flight
    recorder, tuner), so the next call on an engine made under other engine
    settings first waits for that engine's earlier calls to end, closes it and
    makes a new one under the current settings; a group that failed keeps its
    failed engine (its calls go on raising). Making an engine is collective
    over its group, as a call is: change settings on every rank of a group,
    between the same two calls (docs/settings.md).

    Call settings:
    algo: default algorithm for calls that do not pass one.
    debug: log each call's plan choice (and why) to stderr.
    ring_ops: HO-Ring ops to run as point-to-point rings rather than the
      backend's collective; None: the backend's default (gloo: reduce_scatter
      and all_gather, measured faster as rings; NCCL: none).
    host_transport: how CPU ranks' host-level stages (and single-host
      collectives) of ho_ring move data: 'shm' through a shared-memory
      segment, 'net' over gloo like other stages; 'auto' (default): shm.
    check: how ranks make sure they are in the same call (collective, count,
      dtype, reduction op, algo, call number). 'comm' (default): each
      communicator compares call ids with its ring neighbour at the call's
      first message there, so a mismatch raises on every rank (one extra small
      message per communicator and call). 'all' (HOCC_CHECK=1): also compare
      over the whole group before anything moves, naming every rank that
      differs (one small all-gather per call). 'off' (HOCC_CHECK=0): neither,
      as with gloo itself, where a mismatched size aborts a process.
    malloc_trim_s: after hocc CPU calls, give the memory glibc holds free back
      to the OS at most this often (seconds; 0: never), from a thread of its
      own (hocc/engine/heap.py).
    record_dir: where recorder dumps go (a failed call's: the directory set
      when the call was made; SIGUSR1's and hocc.dump_record()'s: the one set
      then); None: <tmp>/hocc-record.
    planner: pipeline-depth bounds and cost-model parameters.

    Engine settings:
    topology: a HOCC_TOPOLOGY spec; None detects hosts from hostnames.
    trace: run plan steps one at a time and log each stage's time (slow; for measuring).
    shm_piece_bytes: bytes per member and piece streamed through the segment
      (the segment holds 2 pieces per member).
    shm_wait: how ranks wait at shared-memory barriers: 'futex' (sleep in the
      kernel until woken), 'yield' (sched_yield loop), 'hybrid' (yield for
      1 ms, then futex) or 'sleep' (backoff).
    record: how many of its latest calls each engine's flight recorder keeps
      (hocc/record/; 0: off). A new engine starts a new record.
    tune: auto times its candidates on the first calls of each (collective,
      dtype, size bucket) and keeps the fastest (hocc/engine/tuning.py);
      HOCC_TUNE=0: the model's choice (and a tuning file's) without trials.
      A new engine tunes afresh (from the tuning file, if there is one).
    tuning_file: where measured choices persist between jobs
      (HOCC_TUNING_FILE; None: kept for this process only); written by each
      group's rank 0 as buckets are decided.
    net_transport: what carries CPU steps outside shared memory (between
      hosts, and within one under host_transport='net'): 'ucx' (UCX tag
      messages, progressed on the calling thread; csrc/transport/ucx.h),
      'gloo' (torch's ProcessGroupGloo sub-groups), or 'auto' (default): UCX
      where every member of a communicator has it, else gloo. CUDA tensors
      always go through NCCL."""

    algo: str = "auto"
    topology: str | None = None
    debug: bool = False
    trace: bool = False
    ring_ops: tuple[str, ...] | None = None
    host_transport: str = "auto"
    shm_piece_bytes: int = 256 << 10
    shm_wait: str = "futex"
    check: str = "comm"
    malloc_trim_s: float = 1.0
    record: int = 2048
    record_dir: str | None = None
    tune: bool = True
    tuning_file: str | None = None
    net_transport: str = "auto"
    planner: PlannerConfig = field(default_factory=PlannerConfig)

    def engine_settings(self) -> tuple[object, ...]:
        """The values of ENGINE_SETTINGS: an engine made under a config serves
        every config whose engine settings are equal."""
        return tuple(getattr(self, name) for name in ENGINE_SETTINGS)

    @staticmethod
    def from_env(env: dict[str, str] | None = None) -> Config:
        env = dict(os.environ if env is None else env)
        cfg = Config()
        if "HOCC_ALGO" in env:
            algo = env["HOCC_ALGO"].strip()
            if algo not in algo_choices():
                raise ValueError(f"HOCC_ALGO={algo!r} is not one of {algo_choices()}")
            cfg = replace(cfg, algo=algo)
        calibrated: CostParams | None = None
        if env.get("HOCC_TOPOLOGY"):
            cfg = replace(cfg, topology=env["HOCC_TOPOLOGY"])
            calibrated = _calibrated_cost(env["HOCC_TOPOLOGY"])
        if env.get("HOCC_DEBUG", "0") not in ("", "0", "false", "False"):
            cfg = replace(cfg, debug=True)
        if env.get("HOCC_TRACE", "0") not in ("", "0", "false", "False"):
            cfg = replace(cfg, trace=True)
        if env.get("HOCC_CHECK", "").strip():
            val = env["HOCC_CHECK"].strip().lower()
            named = {"1": "all", "true": "all", "all": "all", "comm": "comm", "0": "off", "false": "off", "off": "off"}
            if val not in named:
                raise ValueError(f"HOCC_CHECK={env['HOCC_CHECK']!r} must be 1 (or all), comm (the default) or "
                                 "0 (or off)")
            cfg = replace(cfg, check=named[val])
        if env.get("HOCC_RING_OPS"):
            ops = tuple(o.strip() for o in env["HOCC_RING_OPS"].split(",") if o.strip() and o.strip() != "none")
            bad = [o for o in ops if o not in COLLECTIVES]
            if bad:
                raise ValueError(f"HOCC_RING_OPS has unknown ops {bad}; use reduce_scatter, all_gather, "
                                 "all_reduce or none")
            cfg = replace(cfg, ring_ops=ops)
        if env.get("HOCC_HOST_TRANSPORT"):
            cfg = replace(cfg, host_transport=_choice(env, "HOCC_HOST_TRANSPORT", ("shm", "net", "auto")))
        if env.get("HOCC_SHM_PIECE_BYTES"):
            cfg = replace(cfg, shm_piece_bytes=max(4096, _positive_int(env, "HOCC_SHM_PIECE_BYTES")))
        if env.get("HOCC_MALLOC_TRIM_S", "").strip():
            cfg = replace(cfg, malloc_trim_s=_seconds(env, "HOCC_MALLOC_TRIM_S"))
        if env.get("HOCC_RECORD", "").strip():
            val = env["HOCC_RECORD"].strip().lower()
            cfg = replace(cfg, record=0 if val in ("off", "false") else _count(env, "HOCC_RECORD"))
        if env.get("HOCC_RECORD_DIR", "").strip():
            cfg = replace(cfg, record_dir=env["HOCC_RECORD_DIR"].strip())
        if env.get("HOCC_TUNE", "").strip():
            val = env["HOCC_TUNE"].strip().lower()
            if val not in ("0", "1", "false", "true", "off", "on"):
                raise ValueError(f"HOCC_TUNE={env['HOCC_TUNE']!r} must be 1 (measure auto's choices, the default) "
                                 "or 0 (the cost model's, and a tuning file's)")
            cfg = replace(cfg, tune=val in ("1", "true", "on"))
        if env.get("HOCC_TUNING_FILE", "").strip():
            cfg = replace(cfg, tuning_file=env["HOCC_TUNING_FILE"].strip())
        if env.get("HOCC_NET_TRANSPORT", "").strip():
            cfg = replace(cfg, net_transport=_choice(env, "HOCC_NET_TRANSPORT", NET_TRANSPORTS))
        if env.get("HOCC_SHM_WAIT"):
            cfg = replace(cfg, shm_wait=_choice(env, "HOCC_SHM_WAIT", ("futex", "hybrid", "yield", "sleep")))
        planner = cfg.planner
        if calibrated is not None:  # a topology file from `hocc calibrate`: its fitted cost model
            planner = replace(planner, params=calibrated)
        if env.get("HOCC_CHUNKS"):
            planner = replace(planner, chunks=_positive_int(env, "HOCC_CHUNKS"))
        if env.get("HOCC_MIN_CHUNK_BYTES"):
            planner = replace(planner, min_chunk_bytes=_positive_int(env, "HOCC_MIN_CHUNK_BYTES"))
        if env.get("HOCC_MAX_CHUNKS"):
            planner = replace(planner, max_chunks=_positive_int(env, "HOCC_MAX_CHUNKS"))
        return replace(cfg, planner=planner)


def _calibrated_cost(spec: str) -> CostParams | None:
    """The 'cost' section of a HOCC_TOPOLOGY file, if it has one (compact specs have none)."""
    from hocc.topology import parse_spec

    topo = parse_spec(spec)
    return CostParams.from_dict(topo.cost) if topo.cost else None


def _choice(env: dict[str, str], name: str, choices: tuple[str, ...]) -> str:
    val = env[name].strip()
    if val not in choices:
        allowed = ", ".join(repr(c) for c in choices[:-1]) + f" or {choices[-1]!r}"
        raise ValueError(f"{name}={val!r} must be {allowed}")
    return val


def _seconds(env: dict[str, str], name: str) -> float:
    try:
        val = float(env[name])
    except ValueError:
        val = -1.0
    if not 0 <= val < math.inf:  # also refuses nan
        raise ValueError(f"{name}={env[name]!r} must be a finite number of seconds, 0 or more (0 turns it off)")
    return val


def _count(env: dict[str, str], name: str) -> int:
    try:
        val = int(env[name])
    except ValueError:
        val = -1
    if val < 0:
        raise ValueError(f"{name}={env[name]!r} must be a whole number, 0 or more (0 turns it off)")
    return val


def _positive_int(env: dict[str, str], name: str) -> int:
    try:
        val = int(env[name])
    except ValueError:
        raise ValueError(f"{name}={env[name]!r} must be a positive integer") from None
    if val < 1:
        raise ValueError(f"{name}={val} must be a positive integer")
    return val


_config: Config | None = None


def get_config() -> Config:
    global _config
    if _config is None:
        _config = Config.from_env()
    return _config


def configure(**changes: object) -> Config:
    """Change settings for this process, e.g. hocc.configure(algo="ho_ring").
    Every engine, drop-in and backend alike, runs its next call under them
    (Config's docstring says how); calls already made keep theirs. Call it on
    every rank of a group, between the same two calls."""
    global _config
    cfg = get_config()
    if "algo" in changes and changes["algo"] not in algo_choices():
        raise ValueError(f"algo={changes['algo']!r} is not one of {algo_choices()}")
    if "net_transport" in changes and changes["net_transport"] not in NET_TRANSPORTS:
        raise ValueError(f"net_transport={changes['net_transport']!r} is not one of {NET_TRANSPORTS}")
    _config = replace(cfg, **changes)  # type: ignore[arg-type]
    return _config


def reset_config() -> None:
    """Forget the settings: the next call reads the environment again (and runs under it, as after configure())."""
    global _config
    _config = None


__all__ = ["algo_choices", "CALL_SETTINGS", "ENGINE_SETTINGS", "NET_TRANSPORTS", "Config", "CostParams",
           "PlannerConfig", "configure", "get_config", "reset_config"]
