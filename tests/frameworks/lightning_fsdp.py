#!/usr/bin/env python3
"""Lightning's ModelParallelStrategy with FSDP2 (fully_shard in configure_model) on CPU on the given backend,
resumed from a sharded (distributed) checkpoint and from a full one.

    torchrun --standalone --nproc-per-node 4 tests/frameworks/lightning_fsdp.py --backend hocc --out DIR

Four fits of the same model from the same seed:
- "continuous": 3 epochs; a callback saves a sharded checkpoint (a folder, torch.distributed.checkpoint) at
  the end of epoch 2.
- a 2-epoch fit that saves a full checkpoint (one file, gathered on rank 0) at its end: the same state.
- "resumed_sharded", "resumed_full": a fresh model fitted to 3 epochs from either checkpoint (the full one
  loads with set_model_state_dict / set_optimizer_state_dict(broadcast_from_rank0=True)).
Both resumed runs must end where the continuous one does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from common import Params, dataset, full_params, main, make_model
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.strategies import ModelParallelStrategy
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader

import hocc  # noqa: F401  registers the "hocc" backend

BATCH = 4


class Sharded(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = make_model()

    def configure_model(self) -> None:
        mesh = self.device_mesh["data_parallel"]
        for layer in self.net:
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(self.net, mesh=mesh)

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.cross_entropy(self.net(x), y)
        self.log("train_loss", loss, on_step=True, on_epoch=True, sync_dist=True)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=0.01)


class SaveAfter(Callback):
    def __init__(self, epochs: int, path: Path) -> None:
        self.epochs, self.path = epochs, path

    def on_train_epoch_end(self, trainer: L.Trainer, *args: object) -> None:
        if trainer.current_epoch + 1 == self.epochs:
            trainer.save_checkpoint(self.path)


class Losses(Callback):
    def __init__(self) -> None:
        self.steps: list[float] = []
        self.epochs: list[float] = []

    def on_train_batch_end(self, trainer: L.Trainer, *args: object) -> None:
        self.steps.append(float(trainer.callback_metrics["train_loss_step"]))

    def on_train_epoch_end(self, trainer: L.Trainer, *args: object) -> None:
        self.epochs.append(float(trainer.callback_metrics["train_loss_epoch"]))


def fit(backend: str, out: Path, epochs: int, *, sharded_save: bool = True, callbacks: tuple[Callback, ...] = (),
        ckpt_path: Path | None = None) -> tuple[L.Trainer, Sharded, Losses]:
    L.seed_everything(0, verbose=False)
    losses = Losses()
    strategy = ModelParallelStrategy(data_parallel_size=4, tensor_parallel_size=1,
                                     save_distributed_checkpoint=sharded_save, process_group_backend=backend)
    trainer = L.Trainer(accelerator="cpu", devices=4, strategy=strategy, max_epochs=epochs,
                        callbacks=[losses, *callbacks], logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, log_every_n_steps=1,
                        default_root_dir=out)
    model = Sharded()
    trainer.fit(model, DataLoader(dataset(64, seed=1), batch_size=BATCH, shuffle=True), ckpt_path=ckpt_path)
    return trainer, model, losses


def run(backend: str, out: Path) -> tuple[Params, dict[str, Any]]:
    sharded, full = out / "sharded.ckpt", out / "full.ckpt"
    _, cont, cont_losses = fit(backend, out, 3, callbacks=(SaveAfter(2, sharded),))
    assert torch.distributed.get_backend() == backend, torch.distributed.get_backend()
    trainer, two, _ = fit(backend, out, 2, sharded_save=False)
    trainer.save_checkpoint(full)
    assert sharded.is_dir() and full.is_file(), (sharded, full)
    _, from_sharded, sharded_losses = fit(backend, out, 3, ckpt_path=sharded)
    _, from_full, full_losses = fit(backend, out, 3, ckpt_path=full)
    params = {"continuous": full_params(cont.net), "two_epochs": full_params(two.net),
              "resumed_sharded": full_params(from_sharded.net), "resumed_full": full_params(from_full.net)}
    per_epoch = len(cont_losses.steps) // 3
    metrics = {"continuous/train_loss_step": cont_losses.steps, "continuous/train_loss_epoch": cont_losses.epochs,
               # a resumed fit runs (and logs) only the third epoch
               "continuous/epoch3/train_loss_step": cont_losses.steps[-per_epoch:],
               "resumed_sharded/epoch3/train_loss_step": sharded_losses.steps,
               "resumed_full/epoch3/train_loss_step": full_losses.steps}
    return params, metrics


if __name__ == "__main__":
    main(run)
