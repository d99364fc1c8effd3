#!/usr/bin/env python3
"""The framework phases one after another in one launch, each on a process group of its own.

    torchrun --standalone --nproc-per-node 4 tests/frameworks/run_all.py --backend hocc --out DIR [--phases a,b]

Each phase writes OUT/<phase>/started, then its results (OUT/<phase>/rank<r>.pt) or, where it raised, the
traceback (OUT/<phase>/error-rank<r>.txt). Each phase has a process group of its own, destroyed after it, so
that one phase's failure leaves the next a fresh group: the first phase creates it as it would alone (Lightning
from its strategy's process_group_backend, the others with init_process_group), and before each later one this
script creates it on a store prefix of that phase's own (the frameworks then use the group they find). A
second init_process_group("env://") in a process would reuse the first one's store keys (torch names every
default group "0"), and gloo's rendezvous could read the previous group's addresses. Exits 1 when any phase
failed.
"""

from __future__ import annotations

import argparse
import faulthandler
import importlib
import os
import sys
import time
import traceback
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist
from common import Phase, dump, release_group

import hocc  # noqa: F401  registers the "hocc" backend

STUCK_S = 120  # a phase still running after this long prints every rank's stacks (and goes on)
# phase: its module here (imported when the phase runs: Lightning alone takes 8 CPU-seconds a rank)
PHASES = {"lightning_ddp": "lightning_ddp", "lightning_fsdp": "lightning_fsdp", "accelerate": "accelerate_train",
          "fsdp_dcp": "fsdp_dcp"}


def fresh_group(backend: str, name: str) -> None:
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                          timeout=timedelta(minutes=5))
    dist.init_process_group(backend, store=dist.PrefixStore(f"frameworks/{name}", store),
                            rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", required=True)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--phases", default=",".join(PHASES))
    args = parser.parse_args()
    rank = int(os.environ["RANK"])
    failed = []
    for i, name in enumerate(args.phases.split(",")):
        out = args.out / name
        out.mkdir(parents=True, exist_ok=True)
        (out / "started").touch()
        print(f"rank {rank}: phase {name} on {args.backend} at {time.strftime('%H:%M:%S')}", flush=True)
        faulthandler.dump_traceback_later(STUCK_S)
        try:
            if i:
                fresh_group(args.backend, name)
            phase: Phase = importlib.import_module(PHASES[name]).run
            dump(out, *phase(args.backend, out))
        except Exception:  # noqa: BLE001 - recorded for the test, which fails the phase with it
            failed.append(name)
            text = traceback.format_exc()
            (out / f"error-rank{rank}.txt").write_text(text)
            print(f"rank {rank}: phase {name} failed:\n{text}", file=sys.stderr, flush=True)
        release_group()
        faulthandler.cancel_dump_traceback_later()
    print(f"rank {rank}: failed phases: {', '.join(failed) or 'none'} at {time.strftime('%H:%M:%S')}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
