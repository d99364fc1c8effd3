"""The flight recorder from a user's side (hocc/record/): dump it now, or
read live per-tier throughput and arrival skew."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from hocc.api.validate import HoccError
from hocc.engine.group_engines import find_engine
from hocc.record.dump import dump_all
from hocc.record.stats import engine_stats


def dump_record(directory: str | None = None) -> list[str]:
    """Write every hocc engine's recorder in this process to `directory`
    (default HOCC_RECORD_DIR, else <tmp>/hocc-record); returns the paths.
    Local: no other rank is involved (call it on each, or send SIGUSR1)."""
    return dump_all("hocc.dump_record()", directory)


def stats(group: dist.ProcessGroup | None = None, device: str | torch.device = "cpu") -> dict[str, Any]:
    """This rank's running per-tier throughput and the group's arrival skew
    for hocc's calls on `group` (default: the world) with `device` tensors.
    Never waits for another rank (hocc/record/stats.py says how)."""
    if not dist.is_initialized():
        raise HoccError("hocc.stats: torch.distributed is not initialized; call init_process_group first")
    g = group if group is not None else dist.group.WORLD
    dev = torch.device(device)
    engine = find_engine(g, dev)
    if engine is None:
        raise HoccError(f"hocc.stats: no hocc call on {dev.type} tensors has run on this group yet; "
                        "stats follow the calls hocc has made")
    if not engine.recorder.on:
        raise HoccError("hocc.stats: the flight recorder is off (HOCC_RECORD=0); set HOCC_RECORD to a number "
                        "of calls to keep")
    return engine_stats(engine)
