#!/usr/bin/env python3
"""Plant a fault, run a short FSDP-like loop of hocc calls, and leave every
rank's flight-recorder dump for `hocc trace` to name the fault.

Faults (the victim is a rank, or for slow-nic a host the emulator shapes):
  busy      every rank computes (a busy loop) before each call, the victim
            6 times as long (a straggler: a slower core, a busy neighbour)
  stop      the victim stops itself (SIGSTOP) before call `calls // 2`; the
            others' call fails at the group's timeout and each writes its dump
            before the error reaches it. Rank 0 then copies the dumps aside
            (as an operator collects them at the failure) and lets the victim go
  slow-nic  nothing here: bench/cluster.py shapes one host's NIC slower
            (--host-rate); needs 3 hosts or more to tell which host it is

Each loop turn makes three calls: ho_ring all_gather and reduce_scatter
(their rail stage runs as a ring, whose exchanges the recorder times per
link) and all_reduce.

On the emulated cluster (root), ranks in torchrun's environment:
    bench/cluster.py 4x2 --host-rate 2=50mbit --script bench/planted_faults.py -- --fault slow-nic --dir D
    hocc trace D
The tests (tests/test_recorder.py) run busy and stop on local ranks.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import time
from datetime import timedelta


def spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def rank_main(rank: int, world: int, fault: str, directory: str, calls: int = 12, victim: int = 2,
              elems: int = 1 << 16, compute_s: float = 0.005, slow: float = 6.0) -> None:
    """The loop on one rank, inside an initialized default group; dumps land in `directory`."""
    import torch
    import torch.distributed as dist

    import hocc

    store = dist.distributed_c10d._get_default_store()
    x = torch.ones(elems)
    gathered = torch.empty(elems * world)
    out = torch.empty(elems)
    stop_at = calls // 2
    work = compute_s * (slow if fault == "busy" and rank == victim else 1.0)
    for i in range(calls):
        if fault == "stop" and rank == victim and i == stop_at:
            store.set("planted/victim_pid", str(os.getpid()))
            os.kill(os.getpid(), signal.SIGSTOP)
        try:  # some compute before each collective, as in a training step
            spin(work)
            hocc.all_gather_single(gathered, x, algo="ho_ring")
            spin(work)
            hocc.reduce_scatter_single(out, gathered, algo="ho_ring")
            spin(work)
            hocc.all_reduce(x, algo="ho_ring")
        except hocc.CollectiveError as e:
            if fault != "stop":
                raise
            if rank == victim:
                store.set("planted/victim_done", "1")
            else:
                _after_failure(rank, world, directory, store, e)
            return
        x.fill_(1.0)
    hocc.dump_record(directory)


def _after_failure(rank: int, world: int, directory: str, store: object, e: Exception) -> None:
    """A survivor: its dump must exist already (written before the error was raised); rank 0 then copies every
    survivor's aside, and lets the victim go on (its own call then fails too)."""
    mine = [n for n in os.listdir(directory) if n.startswith(f"rank{rank}.") and n.endswith(".json")]
    if not mine or "flight recorder is in" not in str(e):
        raise RuntimeError(f"rank {rank}: no recorder dump before the error: {os.listdir(directory)}; {e}")
    store.add("planted/dumped", 1)  # type: ignore[attr-defined]
    if rank != 0:
        return
    deadline = time.monotonic() + 60
    while store.add("planted/dumped", 0) < world - 1:  # type: ignore[attr-defined]
        if time.monotonic() > deadline:
            raise RuntimeError("survivors' dumps did not all come")
        time.sleep(0.05)
    aside = os.path.join(directory, "at-failure")
    os.makedirs(aside, exist_ok=True)
    for n in os.listdir(directory):
        if n.endswith(".json"):
            shutil.copy(os.path.join(directory, n), aside)
    os.kill(int(store.get("planted/victim_pid")), signal.SIGCONT)  # type: ignore[attr-defined]
    store.wait(["planted/victim_done"], timedelta(seconds=60))  # type: ignore[attr-defined]  # rank 0 holds the store


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--fault", choices=("busy", "stop", "slow-nic"), required=True)
    p.add_argument("--dir", required=True, help="where every rank's dump goes (HOCC_RECORD_DIR)")
    p.add_argument("--calls", type=int, default=12)
    p.add_argument("--victim", type=int, default=2, help="the slowed or stopped rank")
    p.add_argument("--elems", type=int, default=1 << 16, help="float32 elements per rank")
    p.add_argument("--timeout", type=float, default=5.0, help="the group's timeout (s)")
    a = p.parse_args()
    os.environ["HOCC_RECORD_DIR"] = a.dir
    import torch.distributed as dist

    import hocc  # noqa: F401  (reads HOCC_* at first use)

    dist.init_process_group("gloo", timeout=timedelta(seconds=a.timeout))
    try:
        rank_main(dist.get_rank(), dist.get_world_size(), a.fault, a.dir, a.calls, a.victim, a.elems)
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
