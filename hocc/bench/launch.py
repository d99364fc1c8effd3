"""Local CPU ranks for hocc-bench --nprocs (and the multi-process tests).

Ranks start from a forkserver that has imported torch once, not as fresh
interpreters: 8 spawned ranks that each import torch cost about 8 s of CPU on a
2-core machine before any collective runs (an 8-rank test world: 12.4 s with
spawn, 3.9 s from the forkserver). torch is preloaded, and torch._dynamo,
which DDP and FSDP import when first built (about 1.9 s of CPU per rank: 10 s
for an 8-rank world on 2 cores). Each rank gets the
caller's environment of the moment (the server keeps the one it started with)
before the caller's function runs; hocc, imported as the rank unpickles this
module's entry, reads its HOCC_* settings only at first use, so a rank behaves
as a spawned one would.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from typing import Any

import torch.multiprocessing as mp

START_METHOD = "forkserver"
mp.get_context(START_METHOD).set_forkserver_preload(["torch", "torch.distributed", "torch._dynamo"])


def _entry(rank: int, env: dict[str, str], fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
    os.environ.clear()
    os.environ.update(env)
    fn(rank, *args)


def start_local_ranks(fn: Callable[..., Any], args: tuple[Any, ...], nprocs: int) -> None:
    """fn(rank, *args) on `nprocs` local processes; returns when all have ended
    (raises, as torch.multiprocessing.spawn does, if one failed)."""
    mp.start_processes(_entry, args=(dict(os.environ), fn, args), nprocs=nprocs, join=True,
                       start_method=START_METHOD)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now, for a local world's MASTER_PORT (the tests', the benchmarks')."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
