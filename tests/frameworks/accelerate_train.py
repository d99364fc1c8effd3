#!/usr/bin/env python3
"""Hugging Face Accelerate on CPU on the given backend: training, gather_for_metrics under
torch.inference_mode(), save_state / load_state.

    torchrun --standalone --nproc-per-node 4 tests/frameworks/accelerate_train.py --backend hocc --out DIR

Accelerator(cpu=True) initializes the process group itself only with gloo (or mpi): on CPU it names the
backend "gloo" whatever it is asked for. So the script initializes the group with its backend first, and
Accelerate uses the group it finds (its state.backend still reads "gloo", which makes its gathers the
list-form all_gather).

Two epochs of DDP training, an evaluation (50 points: the last batch is padded across ranks, and
gather_for_metrics drops the padding), save_state, a third epoch ("continuous"), then load_state and the
third epoch again ("resumed"): both must end at the same parameters.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from accelerate import Accelerator
from common import Params, dataset, full_params, main, make_model
from torch.utils.data import DataLoader

import hocc  # noqa: F401  registers the "hocc" backend

BATCH = 4
EVAL_POINTS = 50  # not a multiple of BATCH * 4 ranks


def run(backend: str, out: Path) -> tuple[Params, dict[str, Any]]:
    if not dist.is_initialized():  # (run_all.py may have made it)
        dist.init_process_group(backend)  # before Accelerator(cpu=True), which would init gloo
    accelerator = Accelerator(cpu=True)
    assert dist.get_backend() == backend and accelerator.num_processes == 4, dist.get_backend()
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    train = DataLoader(dataset(64, seed=1), batch_size=BATCH)
    evaluate = DataLoader(dataset(EVAL_POINTS, seed=2), batch_size=BATCH)
    model, opt, train, evaluate = accelerator.prepare(model, opt, train, evaluate)
    metrics: dict[str, list[float]] = {}

    def log(name: str, value: float) -> None:
        metrics.setdefault(name, []).append(value)

    def epoch(tag: str) -> None:
        model.train()
        for x, y in train:
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            accelerator.backward(loss)
            opt.step()
            log(f"{tag}/loss_reduced", float(accelerator.reduce(loss.detach(), "mean")))
            log(f"{tag}/loss_gathered", float(accelerator.gather(loss.detach()).mean()))

    def evaluation(tag: str) -> None:
        model.eval()
        preds, labels = [], []
        with torch.inference_mode():
            for x, y in evaluate:
                p, t = accelerator.gather_for_metrics((model(x).argmax(dim=1), y))
                preds.append(p)
                labels.append(t)
        pred, label = torch.cat(preds), torch.cat(labels)
        log(f"{tag}/eval_points", float(label.numel()))
        log(f"{tag}/eval_accuracy", float((pred == label).float().mean()))
        log(f"{tag}/eval_label_sum", float(label.sum()))

    for _ in range(2):
        epoch("epochs12")
    evaluation("epochs12")
    accelerator.save_state(out / "state")
    epoch("continuous")
    evaluation("continuous")
    continuous = full_params(accelerator.unwrap_model(model))
    accelerator.load_state(out / "state")
    epoch("resumed")
    evaluation("resumed")
    # No accelerator.end_training() (it only finishes trackers, of which there are none, and destroys the
    # process group): the group would then live on in the DDP model alone, and its release at return run gloo's
    # destructor, which joins gloo's worker threads holding the GIL: a deadlock if one of them is still
    # releasing the last collective's tensors (a torch bug, seen here on plain gloo). common.release_group()
    # destroys it after.
    return {"continuous": continuous, "resumed": full_params(accelerator.unwrap_model(model))}, metrics


if __name__ == "__main__":
    main(run)
