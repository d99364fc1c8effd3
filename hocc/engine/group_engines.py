"""Which engine serves a group: one per (group, device type) for hocc's
drop-in calls on any group (groups of the "hocc" backend keep their own),
made again at a call when the engine settings changed (hocc.config), and
released when torch ends their group.

Releasing patches nothing of torch's. torch tells a group's backends that it
ends the group (destroy_process_group calls shutdown(), _abort_process_group
abort()), which a "hocc" backend group acts on itself; a group of another
backend (gloo, NCCL) gives hocc no such call, so its drop-in engines go with
the group object: an engine holds its group weakly, and when torch has ended
the group and nothing else holds it (torch drops its own references when it
ends a group), a finalizer closes the engine, after the calls made before have
run. An engine whose group torch no longer knows but something still holds is
closed before the next engine is made, or by reset_engines()."""

from __future__ import annotations

import threading
import weakref

import torch
import torch.distributed as dist

from hocc.config import Config, get_config
from hocc.engine.engine import Engine
from hocc.engine.group import GroupInfo

_engines: dict[tuple[int, str], Engine] = {}
# each key's finalizer on its group (one per group and device, whatever engines it has had)
_watched: dict[tuple[int, str], weakref.finalize[[tuple[int, str]], dist.ProcessGroup]] = {}
# reentrant: a finalizer runs wherever its group's last reference goes, maybe under this lock (in a collection)
_engines_lock = threading.RLock()


def get_engine(group: dist.ProcessGroup, device: torch.device, cfg: Config | None = None,
               refresh: bool = True) -> Engine:
    """The engine serving `group`'s `device` tensors, made now if there is none
    or (refresh) if the one there was made under other engine settings than
    `cfg`'s: that one first ends the calls made before (close), so a call in
    flight finishes where it started. Making one is collective over the group,
    as a call is; refresh=False keeps a stale engine (asking what its last call
    ran: no collective)."""
    cfg = cfg or get_config()
    key = (id(group), device.type)
    eng = _engines.get(key)  # first, no lock (a dict read is atomic): every call asks, for the same group mostly
    if eng is not None and eng.group is group:
        if not (refresh and eng.stale(cfg)):
            return eng
        _release([key], None)  # stale: its calls end under the settings they were made with, then it goes
    own = getattr(group, "hocc_engine", None)
    if own is not None:  # a group of the hocc backend keeps its own engines (never in _engines)
        return own(device, refresh)
    release_destroyed()  # a new engine: first drop those of groups torch has ended
    eng = Engine(GroupInfo.of(group, device), device, cfg)
    eng.group = group
    with _engines_lock:
        old = _engines.get(key)
        _engines[key] = eng
        if key not in _watched:
            _watched[key] = fin = weakref.finalize(group, _group_gone, key)
            fin.atexit = False  # at exit, engines go as before: with the process
    if old is not None:
        old.close()
    return eng


def find_engine(group: object, device: torch.device) -> Engine | None:
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
    """Close every drop-in engine (each after the calls made before): their
    groups' next calls make new ones."""
    _release(list(_engines), None)


def release_destroyed(why: str | None = None) -> None:
    """Release the engines of groups torch no longer knows (destroyed or
    aborted, but still held somewhere): aborted with `why`, else closed."""
    _release([k for k, e in list(_engines.items()) if not _known_to_torch(e.group)], why)


def _group_gone(key: tuple[int, str]) -> None:
    """A group with drop-in engines was freed (torch ended it and nothing holds it): close its
    engine (now, so that its resources are gone when the collection that freed the group ends;
    Engine.close hands off to a thread where waiting here could deadlock)."""
    with _engines_lock:
        _watched.pop(key, None)
        eng = _engines.get(key)
        if eng is None or eng.group is not None:  # none left, or another group's under a reused id
            return
        del _engines[key]
    eng.close()


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
