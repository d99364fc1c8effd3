"""What the framework phases share: a tiny classifier, its data, and how each rank hands its results back.

Each phase (lightning_ddp.py, lightning_fsdp.py, accelerate_train.py, fsdp_dcp.py) has a
`run(backend, out) -> (params, metrics)`: params {tag: {name: full tensor}}, metrics {name: float | list of
floats}, the same on every rank. run_all.py runs them one after another in one torchrun launch (the imports
of torch and Lightning on 4 ranks cost more than the training) and writes each phase's results to
OUT/<phase>/rank<r>.pt; each file also runs alone under torchrun (`--backend gloo|hocc --out DIR`).
tests/test_frameworks.py compares a "hocc" launch's results with a gloo launch's, and the tags of one run with
each other (a resumed run against the uninterrupted one).
"""

from __future__ import annotations

import argparse
import gc
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

FEATURES, HIDDEN, CLASSES = 8, 16, 3


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", required=True, help="torch.distributed backend: gloo or hocc")
    parser.add_argument("--out", required=True, type=Path, help="where each rank writes rank<r>.pt")
    return parser.parse_args()


def make_model(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, HIDDEN), nn.Tanh(),
                         nn.Linear(HIDDEN, CLASSES))


def dataset(n: int, seed: int) -> torch.utils.data.TensorDataset:
    """n labelled points: the class is which of CLASSES fixed directions a point is nearest."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, FEATURES, generator=g)
    centres = torch.randn(CLASSES, FEATURES, generator=torch.Generator().manual_seed(1234))
    y = (x @ centres.T).argmax(dim=1)
    return torch.utils.data.TensorDataset(x, y)


def full_params(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter whole (a DTensor's full_tensor() all-gathers it: call on every rank)."""
    out = {}
    for name, p in model.named_parameters():
        full = p.full_tensor() if hasattr(p, "full_tensor") else p
        out[name.removeprefix("module.")] = full.detach().clone().cpu()
    return out


Params = dict[str, dict[str, torch.Tensor]]
Phase = Callable[[str, Path], tuple[Params, dict[str, Any]]]


def dump(out: Path, params: Params, metrics: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    rank = int(os.environ["RANK"])
    torch.save({"params": params, "metrics": metrics}, out / f"rank{rank}.pt")
    print(f"rank {rank}: results in {out}", flush=True)


def release_group() -> None:
    """Destroys the default process group, if any, once nothing is in flight on it. ProcessGroupGloo's
    destructor joins its worker threads holding the GIL, and a worker still releasing a finished collective's
    tensors needs the GIL (a torch deadlock, seen here on gloo): so first the phase's garbage goes (its DDP
    models hold the group too) while the group lives on, then a pause lets the workers finish."""
    gc.collect()
    time.sleep(0.2)
    if dist.is_initialized():
        dist.destroy_process_group()


def main(phase: Phase) -> None:
    """One phase alone: `torchrun ... <phase>.py --backend B --out DIR`."""
    args = parse_args()
    dump(args.out, *phase(args.backend, args.out))
    release_group()
