"""Which engine serves a group: one per (group, device type) for hocc's
drop-in calls on any group (groups of the "hocc" backend keep their own), and
the hooks that release them when torch ends their group."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from hocc.config import Config, get_config
from hocc.engine.engine import Engine
from hocc.engine.group import GroupInfo

_engines: dict[tuple[int, str], Engine] = {}
_engines_lock = threading.Lock()


def get_engine(group: dist.ProcessGroup, device: torch.device, cfg: Config | None = None) -> Engine:
    cfg = cfg or get_config()
    own = getattr(group, "hocc_engine", None)
    if own is not None:  # a group of the hocc backend keeps its own engines
        return own(device)
    key = (id(group), device.type)
    with _engines_lock:
        eng = _engines.get(key)
        if eng is not None and eng.group is group and eng.cfg.topology == cfg.topology:
            return eng
    release_destroyed()  # a new engine: first drop those of groups torch has ended
    eng = Engine(GroupInfo.of(group, device), device, cfg)
    eng.group = group
    with _engines_lock:
        old = _engines.get(key)
        _engines[key] = eng
    if old is not None:
        old.close()
    return eng


def find_engine(group: Any, device: torch.device) -> Engine | None:
    """The engine already serving `group` (a ProcessGroup, or a "hocc"
    backend object) for `device`, or None: never makes one (making one is
    collective, and this is asked from one rank, e.g. for stats)."""
    own = getattr(group, "_engines", None)
    if own is None and hasattr(group, "_get_backend"):
        try:
            own = getattr(group._get_backend(device), "_engines", None)
        except RuntimeError:
            own = None
    if isinstance(own, dict):
        return own.get(device.type)
    with _engines_lock:
        return _engines.get((id(group), device.type))


def reset_engines() -> None:
    """Forget every engine (after destroy_process_group, or to apply new settings)."""
    _release([k for k in list(_engines)], None)


def release_destroyed(why: str | None = None) -> None:
    """Release the engines of groups torch no longer knows (destroyed or
    aborted): aborted with `why`, else closed."""
    _release([k for k, e in list(_engines.items()) if not _known_to_torch(e.group)], why)


def release_group(group: dist.ProcessGroup | None, why: str | None = None) -> None:
    """Release the engines of `group` (None: every group, as destroying the
    world ends them all): aborted with `why`, else closed."""
    whole = group is None or group is dist.GroupMember.WORLD
    _release([k for k, e in list(_engines.items()) if whole or e.group is group], why)


def _release(keys: list[tuple[int, str]], why: str | None) -> None:
    with _engines_lock:
        engines = [e for e in (_engines.pop(k, None) for k in keys) if e is not None]
    for e in engines:
        if why is None:
            e.close()
        else:
            e.abort(why)


def _known_to_torch(group: dist.ProcessGroup | None) -> bool:
    if group is None:
        return False
    try:
        return group in dist.distributed_c10d._world.pg_map
    except (AttributeError, TypeError):  # torch's registry moved: keep the engine
        return True


def install_teardown_hooks() -> None:
    """Make torch's own teardown release hocc's engines of the groups it ends:
    dist.destroy_process_group closes them (after the calls made before have
    run) and dist.distributed_c10d._abort_process_group aborts them, before
    torch ends the group itself. Without this, an engine would keep a
    destroyed group's backend, its gloo sub-groups (threads, sockets) and its
    worker thread alive. Idempotent. (Groups of the "hocc" backend need no
    hook: torch calls their shutdown() and abort().)"""
    c10d = dist.distributed_c10d
    for name, why in (("destroy_process_group", None), ("_abort_process_group", "the process group was aborted")):
        orig = getattr(c10d, name, None)
        if orig is None or getattr(orig, "hocc_hooked", False):
            continue
        setattr(c10d, name, _hooked(orig, why))
        if getattr(dist, name, None) is orig:
            setattr(dist, name, getattr(c10d, name))


def _hooked(orig: Callable[..., Any], why: str | None) -> Callable[..., Any]:
    @functools.wraps(orig)
    def teardown(group: dist.ProcessGroup | None = None) -> Any:
        release_group(group, why)
        try:
            return orig(group)
        finally:
            release_destroyed(why)

    teardown.hocc_hooked = True  # type: ignore[attr-defined]
    return teardown
