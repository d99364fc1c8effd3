"""Spawn a real gloo world of N CPU processes and run a function on every rank.

Starting ranks costs seconds, so each test runs many cases inside one world. A
rank that raises fails the test with its traceback (torch.multiprocessing
reports it and ends the other ranks). Ranks start as hocc-bench's do, from a
forkserver that has imported torch (hocc/bench/launch.py)."""

from __future__ import annotations

import os
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from hocc.bench.launch import free_port, start_local_ranks


def hocc_env(topology: str, host_transport: str, chunks: str = "", shm_piece_bytes: str = "") -> dict[str, str]:
    """The HOCC_* settings of a multi-process test case ('' leaves a setting at its default)."""
    env = {"HOCC_TOPOLOGY": topology, "HOCC_HOST_TRANSPORT": host_transport}
    if chunks:
        env["HOCC_CHUNKS"] = chunks
    if shm_piece_bytes:
        env["HOCC_SHM_PIECE_BYTES"] = shm_piece_bytes
    return env




def _entry(rank: int, world: int, port: int, env: dict[str, str], timeout_s: float, backend: str,
           fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
    os.environ.update(env)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    import torch
    import torch.distributed as dist

    import hocc  # registers the "hocc" backend

    torch.set_num_threads(1)
    dist.init_process_group(backend, rank=rank, world_size=world, timeout=timedelta(seconds=timeout_s))
    try:
        fn(rank, world, *args)
    finally:
        hocc.reset_engines()
        dist.destroy_process_group()


def run_world(world: int, fn: Callable[..., Any], *args: Any, env: dict[str, str] | None = None,
              timeout_s: float = 300.0, backend: str = "gloo") -> None:
    """Run fn(rank, world, *args) on `world` spawned ranks (default group: `backend`)."""
    start_local_ranks(_entry, (world, free_port(), dict(env or {}), timeout_s, backend, fn, args), world)


def count_full_way(engine: Any) -> list[int]:
    """How many calls enter `engine`'s full way (Engine.run) from now on (the real method still runs): a
    call that runs from the table of repeated calls, or a prepared call, does not."""
    count = [0]
    real = engine.run

    def spy(*args: Any, **kw: Any) -> Any:
        count[0] += 1
        return real(*args, **kw)

    engine.run = spy
    return count

