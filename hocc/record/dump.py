"""Writing the recorders out: one JSON file per rank and engine.

When: on a failed call (the engine writes before it raises, on every rank
the failure reaches), on SIGUSR1 (every engine of the process), and on
hocc.dump_record(). Where: HOCC_RECORD_DIR, else <tmp>/hocc-record; the file
is rank<global rank>.<group>.<device>.json, replaced by each dump (so a
directory holds one job's latest state per rank, and never grows).

The format (docs/recorder.md): {"format": "hocc-record", "version": 1,
"reason", "dumped_ns", the header (rank, global rank, group, size, its global
ranks, hostname, pid, the hosts of the group's ranks), "calls": [...]}.

SIGUSR1 must work while the main thread is blocked inside a call (a hang,
where it matters most), so a Python handler cannot do it: it would only run
once the call returned. hocc._C's handler writes a byte to a pipe, and a
thread of hocc's reads it and dumps.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import socket
import tempfile
import threading
import time
import weakref
from typing import Any

from hocc.config import get_config
from hocc.executor import load
from hocc.executor.lifecycle import at_fork_in_child
from hocc.record.recorder import Recorder

log = logging.getLogger("hocc")

_recorders: weakref.WeakSet[Recorder] = weakref.WeakSet()
_signal_lock = threading.Lock()
_signal_pid = 0  # the process whose SIGUSR1 thread runs (a forked child starts its own)


def record_dir(configured: str | None) -> str:
    return configured or os.path.join(tempfile.gettempdir(), "hocc-record")


def dump_path(directory: str, header: dict[str, Any]) -> str:
    group = re.sub(r"[^A-Za-z0-9_.-]", "_", str(header["group"]))
    return os.path.join(directory, f"rank{header['global_rank']}.{group}.{header['device']}.json")


def write(rec: Recorder, reason: str, directory: str) -> str:
    """Write one recorder's dump now; returns its path."""
    header = rec.header()
    doc = {**header, "reason": reason, "dumped_ns": time.time_ns(), "calls": rec.snapshot()}
    os.makedirs(directory, exist_ok=True)
    path = dump_path(directory, header)
    tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, separators=(",", ":"))
    os.replace(tmp, path)  # readers never see half a file
    return path


def header(info: Any, device: Any, topology: Any) -> dict[str, Any]:
    """Who a recorder belongs to, for its dumps: an engine's GroupInfo, device and topology."""
    import torch.distributed as dist

    glob = dist.get_rank() if dist.is_initialized() else info.global_ranks[info.rank]
    ranks = range(topology.world_size)
    return {"rank": info.rank, "global_rank": glob, "group": info.name, "size": info.size,
            "global_ranks": list(info.global_ranks), "device": device.type, "hostname": socket.gethostname(),
            "pid": os.getpid(), "hosts": [topology.host_of(r) for r in ranks],
            "switches": [topology.switch_of(r) for r in ranks]}


def on_failure(rec: Recorder, reason: str, configured_dir: str | None) -> str:
    """Write `rec` out after a failed call; the sentence its error gets about the dump ('' if it could not)."""
    try:
        path = write(rec, reason, record_dir(configured_dir))
    except Exception as e:  # noqa: BLE001 - the collective's error matters more than its dump's
        log.warning("hocc: could not write the flight recorder's dump: %s", e)
        return ""
    return f". This rank's flight recorder is in {path} (read every rank's with: hocc trace DIR)"


def register(rec: Recorder) -> None:
    """Track a live recorder for SIGUSR1 and dump_record(); install the
    signal's reader thread in this process if SIGUSR1 is still unclaimed."""
    if not rec.on:
        return
    _recorders.add(rec)
    _install_signal()


def unregister(rec: Recorder) -> None:
    """A closed engine's recorder: no longer dumped on SIGUSR1 (its group's
    next engine writes to the same file)."""
    _recorders.discard(rec)


def dump_all(reason: str, directory: str | None = None) -> list[str]:
    """Dump every live recorder of this process; returns the paths written."""
    where = directory or record_dir(get_config().record_dir)
    paths = []
    for rec in list(_recorders):
        try:
            paths.append(write(rec, reason, where))
        except Exception as e:  # noqa: BLE001 - a dump must never take the process down
            log.warning("hocc: could not write a recorder dump to %s: %s", where, e)
    return paths


def _install_signal() -> None:
    global _signal_pid
    with _signal_lock:
        if _signal_pid == os.getpid():
            return
        _signal_pid = os.getpid()
        current = signal.getsignal(signal.SIGUSR1)  # a Python handler of the caller's, if any
        if current not in (signal.SIG_DFL, None):
            log.debug("hocc: SIGUSR1 has a handler already; recorder dumps on it are off")
            return
        r, w = os.pipe()
        load().install_dump_signal(w, int(signal.SIGUSR1))
        threading.Thread(target=_signal_reader, args=(r,), name="hocc-record-signal", daemon=True).start()


def _signal_reader(fd: int) -> None:
    while True:
        try:
            got = os.read(fd, 64)
        except OSError:
            return
        if not got:
            return
        paths = dump_all("SIGUSR1")
        log.warning("hocc: SIGUSR1: wrote %d recorder dump(s): %s", len(paths), ", ".join(paths))


def _after_fork() -> None:
    global _signal_pid, _recorders
    _signal_pid = 0  # the reader thread did not survive the fork
    _recorders = weakref.WeakSet()


at_fork_in_child(_after_fork)
