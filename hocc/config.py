"""Settings in one typed object, `Config`, and one table, `SETTINGS`: each
setting's name, environment variable, parser, when it takes effect and what it
does. HOCC_* variables give the defaults (`Config.from_env`), hocc.configure()
changes them; both go through the same row's parser, and docs/settings.md's
table is made from it (`settings_markdown`; the suite checks they agree). No
other module reads a HOCC_* variable. When a setting takes effect: Config's
docstring (one rule, every engine)."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from hocc.plan.cost import CostParams
from hocc.plan.planner import PlannerConfig
from hocc.plan.registry import names
from hocc.plan.types import COLLECTIVES


def algo_choices() -> tuple[str, ...]:
    """What `algo` may name: every registered algorithm (hocc.plan.registry), and 'auto'."""
    return (*names(), "auto")


NET_TRANSPORTS = ("auto", "ucx", "gloo")


# -- parsers: text (a variable's, or a string given to configure) or a value -> the setting's value ------------
Parse = Callable[[Any, str], Any]  # (value, the name to blame) -> the setting's value, or ValueError


def _bool(v: Any, who: str) -> bool:
    if isinstance(v, bool):
        return v
    text = str(v).strip().lower()
    if text in ("1", "true", "on", "yes"):
        return True
    if text in ("0", "false", "off", "no"):
        return False
    raise ValueError(f"{who}={v!r} must be 1 (or true, on) or 0 (or false, off)")


def _choice(options: tuple[str, ...] | Callable[[], tuple[str, ...]], aliases: dict[str, str] | None = None) -> Parse:
    def parse(v: Any, who: str) -> str:
        allowed = options() if callable(options) else options
        text = str(v).strip()
        text = (aliases or {}).get(text.lower(), text)
        if text not in allowed:
            raise ValueError(f"{who}={v!r} must be one of {', '.join(allowed)}")
        return text
    return parse


def _int(least: int, off_words: tuple[str, ...] = ()) -> Parse:
    def parse(v: Any, who: str) -> int:
        if isinstance(v, str) and v.strip().lower() in off_words:
            return 0
        try:
            val = int(v) if not isinstance(v, bool) and float(v) == int(float(v)) else None
        except (TypeError, ValueError):
            val = None
        if val is None or val < least:
            raise ValueError(f"{who}={v!r} must be a whole number, {least} or more"
                             + (" (0 turns it off)" if least == 0 else ""))
        return val
    return parse


def _seconds(v: Any, who: str) -> float:
    try:
        val = float(v)
    except (TypeError, ValueError):
        val = -1.0
    if not 0 <= val < math.inf:  # also refuses nan
        raise ValueError(f"{who}={v!r} must be a finite number of seconds, 0 or more (0 turns it off)")
    return val


def _text(v: Any, who: str) -> str | None:
    if v is None:
        return None
    if not isinstance(v, str):
        raise ValueError(f"{who}={v!r} must be a string (or None)")
    return v.strip() or None


def _ring_ops(v: Any, who: str) -> tuple[str, ...] | None:
    if v is None:
        return None
    items = v.split(",") if isinstance(v, str) else list(v)
    ops = tuple(str(o).strip() for o in items if str(o).strip() and str(o).strip() != "none")
    bad = [o for o in ops if o not in COLLECTIVES]
    if bad:
        raise ValueError(f"{who} has unknown ops {bad}; use {', '.join(COLLECTIVES)} or none")
    return ops


def _planner(v: Any, who: str) -> PlannerConfig:
    if not isinstance(v, PlannerConfig):
        raise ValueError(f"{who} must be a hocc.plan.PlannerConfig, got {type(v).__name__}")
    return v


@dataclass(frozen=True)
class Setting:
    """One row of the table: `name` is Config's field (or 'planner.<field>'
    for a field of its PlannerConfig), `env` its variable (None: configure()
    only), `when` 'call' or 'engine' (Config's docstring), `doc` what it does."""

    name: str
    env: str | None
    parse: Parse
    when: str
    doc: str
    default_doc: str = ""  # the default as the docs show it, where repr() would not say it well


SETTINGS: tuple[Setting, ...] = (
    Setting("algo", "HOCC_ALGO", _choice(algo_choices), "call",
            "default algorithm for calls that pass none: a registered one (`native`, `ring`, `ho_ring`) or `auto`, "
            "the cost model's pick, checked by timing where it is unsure ([tuning.md](tuning.md))"),
    Setting("debug", "HOCC_DEBUG", _bool, "call", "log each call's plan and why it was chosen"),
    Setting("ring_ops", "HOCC_RING_OPS", _ring_ops, "call",
            "HO-Ring ops run as point-to-point rings rather than the backend's collective (`none`: none)",
            "the backend's: gloo `reduce_scatter,all_gather`, NCCL none"),
    Setting("host_transport", "HOCC_HOST_TRANSPORT", _choice(("shm", "net", "auto")), "call",
            "CPU ranks' host-level stages (and a single host's whole collective): `shm` through a shared-memory "
            "segment, `net` over the network's transport like the rest, `auto`: `shm`"),
    Setting("check", "HOCC_CHECK", _choice(("all", "comm", "off"), {"1": "all", "true": "all", "0": "off",
                                                                        "false": "off"}), "call",
            "how ranks check they are in the same call: `comm` at each communicator's first message of a call; "
            "`all` (`1`) also over the whole group before anything moves, naming every rank that differs; `off` "
            "(`0`) neither (as gloo: a mismatched size aborts a process) ([failures.md](failures.md))"),
    Setting("malloc_trim_s", "HOCC_MALLOC_TRIM_S", _seconds, "call",
            "after CPU calls, hand the memory glibc holds free back to the OS at most this often, from a thread "
            "of its own (seconds; 0: never)"),
    Setting("record_dir", "HOCC_RECORD_DIR", _text, "call",
            "where flight-recorder dumps go", "`<tmp>/hocc-record`"),
    Setting("planner", None, _planner, "call",
            "the planner's settings (`hocc.plan.PlannerConfig`): pipeline-depth bounds and the cost model; the "
            "three rows below set its fields, a topology file's `cost` section its cost model",
            "`PlannerConfig()`"),
    Setting("planner.chunks", "HOCC_CHUNKS", _int(1), "call", "force HO-Ring's pipeline depth K",
            "the cost model's"),
    Setting("planner.min_chunk_bytes", "HOCC_MIN_CHUNK_BYTES", _int(1), "call",
            "the least bytes of a chunk the cost model's K may make", "`65536` on CPU, `524288` on CUDA"),
    Setting("planner.max_chunks", "HOCC_MAX_CHUNKS", _int(1), "call", "the largest K the cost model may pick"),
    Setting("topology", "HOCC_TOPOLOGY", _text, "engine",
            "a topology spec (`2x4`, `2x4@nic=1gbit`, `3+5`) or a JSON/YAML file ([usage.md](usage.md)); "
            "none: the hosts are detected", "detected"),
    Setting("trace", "HOCC_TRACE", _bool, "engine",
            "run plan steps one at a time and log each stage's time (slow; the flight recorder times steps as "
            "they run, without serializing them)"),
    Setting("shm_piece_bytes", "HOCC_SHM_PIECE_BYTES", _int(4096), "engine",
            "bytes per rank streamed through the shared-memory segment at a time (it holds two per rank)"),
    Setting("shm_wait", "HOCC_SHM_WAIT", _choice(("futex", "hybrid", "yield", "sleep")), "engine",
            "how ranks wait for each other in shared memory: `futex` sleeps in the kernel until woken (a call of "
            "one piece yields for 1 ms first), `yield` "
            "loops on sched_yield, `hybrid` yields for 1 ms then sleeps, `sleep` backs off"),
    Setting("record", "HOCC_RECORD", _int(0, ("off", "false")), "engine",
            "calls each engine's flight recorder keeps (0 or `off`: none) ([recorder.md](recorder.md))"),
    Setting("tune", "HOCC_TUNE", _bool, "engine",
            "1: `auto` runs the cost model's pick and, where the model prices a rival within 1.25x of it, times "
            "them on that size bucket's first calls and keeps the fastest; 0: the model's picks (and a tuning "
            "file's) without trials ([tuning.md](tuning.md))"),
    Setting("tuning_file", "HOCC_TUNING_FILE", _text, "engine",
            "keep `auto`'s measured picks between jobs (`hocc tune` builds one ahead)", "none"),
    Setting("net_transport", "HOCC_NET_TRANSPORT", _choice(NET_TRANSPORTS), "engine",
            "what carries CPU steps outside shared memory: `ucx` (UCX tag messages on the calling thread), "
            "`gloo` (torch's ProcessGroupGloo sub-groups), `auto`: UCX where every member of a communicator has "
            "it, else gloo ([executor.md](executor.md#ucx-between-hosts))"),
    Setting("ucx_spin_us", "HOCC_UCX_SPIN_US", _int(0), "engine",
            "how long a UCX wait polls (yielding the core between tries) before it sleeps on the worker's event "
            "fd (microseconds)"),
    Setting("ucx_tcp_buffer", "HOCC_UCX_TCP_BUFFER", _int(0, ("auto",)), "engine",
            "socket buffer of UCX's TCP connections, each way (bytes): `0` or `auto` sizes it from the host NIC "
            "rate the topology states (0.5 ms of it, at least 64 KiB), and leaves UCX's own where none is stated; "
            "`UCX_TCP_SNDBUF` and `UCX_TCP_RCVBUF` win if set; the first group to connect over UCX sets it for "
            "the process ([executor.md](executor.md#ucx-between-hosts))"),
)
BY_NAME = {s.name: s for s in SETTINGS}
# When each setting is read (Config's docstring: one rule for when they take effect). Call settings: by each
# call, when it is made. Engine settings: when an engine is made; built into it, so a change replaces engines.
CALL_SETTINGS = tuple(s.name for s in SETTINGS if s.when == "call" and "." not in s.name)
ENGINE_SETTINGS = tuple(s.name for s in SETTINGS if s.when == "engine")


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

    Each setting, its variable and what it does: SETTINGS above (and
    docs/settings.md, made from it).
    """

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
    ucx_spin_us: int = 50
    ucx_tcp_buffer: int = 0
    planner: PlannerConfig = field(default_factory=PlannerConfig)

    def engine_settings(self) -> tuple[object, ...]:
        """The values of ENGINE_SETTINGS: an engine made under a config serves
        every config whose engine settings are equal."""
        return tuple(getattr(self, name) for name in ENGINE_SETTINGS)

    @staticmethod
    def from_env(env: dict[str, str] | None = None) -> Config:
        """Config() with every HOCC_* variable that is set (and not blank) applied, each through its row's parser."""
        env = dict(os.environ if env is None else env)
        given = {s.name: s.parse(env[s.env], s.env) for s in SETTINGS
                 if s.env is not None and env.get(s.env, "").strip()}
        return _apply(Config(), given)


def _apply(cfg: Config, values: dict[str, Any]) -> Config:
    """cfg with parsed values (Config fields, and 'planner.<field>'s on its planner); a topology file's
    fitted cost model goes into the planner whenever the topology is set, whichever way in."""
    top = {k: v for k, v in values.items() if "." not in k}
    cfg = replace(cfg, **top)
    planner = cfg.planner
    if top.get("topology"):
        calibrated = _calibrated_cost(top["topology"])
        if calibrated is not None:  # a topology file from `hocc calibrate`: its fitted cost model
            planner = replace(planner, params=calibrated)
    sub = {k.split(".", 1)[1]: v for k, v in values.items() if "." in k}
    return replace(cfg, planner=replace(planner, **sub) if sub else planner)


def _calibrated_cost(spec: str) -> CostParams | None:
    """The 'cost' section of a HOCC_TOPOLOGY file, if it has one (compact specs have none)."""
    from hocc.topology import parse_spec

    topo = parse_spec(spec)
    return CostParams.from_dict(topo.cost) if topo.cost else None


def settings_markdown() -> str:
    """docs/settings.md's table of every setting, from SETTINGS."""
    cfg = Config()
    rows = ["| setting | variable | read | default | what |", "| --- | --- | --- | --- | --- |"]
    for s in SETTINGS:
        if s.default_doc:
            default = s.default_doc
        else:
            value: Any = cfg
            for part in s.name.split("."):
                value = getattr(value, part)
            default = f"`{value}`"
        var = f"`{s.env}`" if s.env else "-"
        rows.append(f"| `{s.name}` | {var} | {s.when} | {default} | {s.doc} |")
    return "\n".join(rows) + "\n"


_config: Config | None = None


def get_config() -> Config:
    global _config
    if _config is None:
        _config = Config.from_env()
    return _config


_on_change: list[Callable[[], None]] = []


def on_change(fn: Callable[[], None]) -> None:
    """Call `fn` whenever the settings change (configure, reset_config): hocc.api.repeat's table of
    prepared calls, which runs them without asking get_config(), forgets them there."""
    _on_change.append(fn)


def _changed() -> None:
    for fn in _on_change:
        fn()


def configure(**changes: object) -> Config:
    """Change settings for this process, e.g. hocc.configure(algo="ho_ring").
    Every value goes through its row's parser, as the HOCC_* variables do:
    what one way refuses, the other does too. `chunks`, `min_chunk_bytes`
    and `max_chunks` set the planner's fields. Every engine, drop-in and
    backend alike, runs its next call under them (Config's docstring says
    how); calls already made keep theirs. Call it on every rank of a group,
    between the same two calls."""
    global _config
    parsed: dict[str, Any] = {}
    for name, value in changes.items():
        row = BY_NAME.get(name) or BY_NAME.get(f"planner.{name}")
        if row is None:
            known = ", ".join(s.name.removeprefix("planner.") for s in SETTINGS)
            raise ValueError(f"hocc.configure: no setting {name!r}; the settings are {known}")
        parsed[row.name] = row.parse(value, name)
    _config = _apply(get_config(), parsed)
    _changed()
    return _config


def reset_config() -> None:
    """Forget the settings: the next call reads the environment again (and runs under it, as after configure())."""
    global _config
    _config = None
    _changed()


__all__ = ["algo_choices", "BY_NAME", "CALL_SETTINGS", "ENGINE_SETTINGS", "NET_TRANSPORTS", "SETTINGS", "Config",
           "CostParams", "PlannerConfig", "Setting", "configure", "get_config", "reset_config", "settings_markdown"]
