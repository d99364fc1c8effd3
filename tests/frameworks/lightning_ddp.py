#!/usr/bin/env python3
"""Lightning DDP on CPU on the given backend: fit with a validation loop, then trainer.validate().

    torchrun --standalone --nproc-per-node 4 tests/frameworks/lightning_ddp.py --backend hocc --out DIR

What it exercises on the process group: DDP's gradient all-reduce; `self.log(..., sync_dist=True)` (an
all-reduce per logged value: on a backend other than gloo Lightning asks for ReduceOp.AVG, also of the
integer batch-size count of an epoch-level mean); torchmetrics metrics synced across ranks when computed
(list-form all_gathers of their states), in training and in validation; and validation, which Lightning
runs under torch.inference_mode() on every backend but gloo (there it uses no_grad).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from common import CLASSES, Params, dataset, full_params, main, make_model
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.strategies import DDPStrategy
from torch.utils.data import DataLoader
from torchmetrics.classification import MulticlassAccuracy

import hocc  # noqa: F401  registers the "hocc" backend

BATCH = 4  # per rank: 64 training points are 4 steps an epoch on 4 ranks


class Classifier(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = make_model()
        self.train_acc = MulticlassAccuracy(num_classes=CLASSES)
        self.val_acc = MulticlassAccuracy(num_classes=CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        logits = self(x)
        loss = F.cross_entropy(logits, y)
        self.log("train_loss", loss, on_step=True, on_epoch=True, sync_dist=True)
        self.train_acc(logits, y)
        self.log("train_acc", self.train_acc, on_step=False, on_epoch=True)
        return loss

    def validation_step(self, batch: list[torch.Tensor], batch_idx: int) -> None:
        x, y = batch
        logits = self(x)
        self.log("val_loss", F.cross_entropy(logits, y), sync_dist=True)
        self.val_acc(logits, y)
        self.log("val_acc", self.val_acc)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)


class Record(Callback):
    """Every logged value as the trainer holds it: after each training step and after each validation."""

    def __init__(self) -> None:
        self.metrics: dict[str, list[float]] = {}

    def _take(self, trainer: L.Trainer, prefix: str) -> None:
        for name, value in sorted(trainer.callback_metrics.items()):
            if name.startswith(prefix):
                self.metrics.setdefault(name, []).append(float(value))

    def on_train_batch_end(self, trainer: L.Trainer, *args: object) -> None:
        self._take(trainer, "train_loss_step")

    def on_train_epoch_end(self, trainer: L.Trainer, *args: object) -> None:
        self._take(trainer, "train_")  # the epoch's train_loss_epoch and train_acc are there from now on

    def on_validation_end(self, trainer: L.Trainer, *args: object) -> None:
        if not trainer.sanity_checking:
            self._take(trainer, "val_")


def run(backend: str, out: Path) -> tuple[Params, dict[str, Any]]:
    L.seed_everything(0, verbose=False)
    record = Record()
    trainer = L.Trainer(accelerator="cpu", devices=4, strategy=DDPStrategy(process_group_backend=backend),
                        max_epochs=2, callbacks=[record], logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, log_every_n_steps=1,
                        default_root_dir=out)
    model = Classifier()
    train = DataLoader(dataset(64, seed=1), batch_size=BATCH, shuffle=True)
    val = DataLoader(dataset(48, seed=2), batch_size=BATCH)
    trainer.fit(model, train, val)
    assert torch.distributed.get_backend() == backend, torch.distributed.get_backend()
    (validated,) = trainer.validate(model, val, verbose=False)
    metrics: dict[str, object] = dict(record.metrics)
    metrics.update({f"validate/{k}": float(v) for k, v in sorted(validated.items())})
    return {"fit": full_params(model.net)}, metrics


if __name__ == "__main__":
    main(run)
