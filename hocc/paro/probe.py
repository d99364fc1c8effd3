"""Measure what a PaRO model's states hold, during forward and backward.

A Probe attached to a model is sampled at every hook of a pass (each unit's
forward and backward, each reduction, the end of backward): it adds up the
distinct storages the units hold (parameters gathered or sharded, gradient
buffers, the optimizer's copy) and the optimizer's state tensors, and keeps
the largest total seen. That is the measurement `peak_per_rank`
(hocc/paro/memory.py) predicts; activations are not in either. A
reduction's buffers are in its unit's `inflight` from its submission, so a
sample sees what the worker is writing whether or not it has begun."""

from __future__ import annotations

from typing import Any

import torch

from hocc.paro.memory import Memory, StateBytes, UnitSize, peak_per_rank


class Probe:
    def __init__(self, model: Any, optimizer: torch.optim.Optimizer | None = None) -> None:
        self.model, self.optimizer = model, optimizer
        self.peak = Memory(0, 0, 0)
        self.where = ""

    def __enter__(self) -> Probe:
        self.model._paro_pass.probe = self
        return self

    def __exit__(self, *exc: object) -> None:
        self.model._paro_pass.probe = None

    def held(self) -> Memory:
        """Bytes held now, by kind; a storage shared by two kinds counts once, in the first."""
        seen: set[int] = set()
        out = {"params": 0, "grads": 0, "optim": 0}

        def add(kind: str, t: torch.Tensor) -> None:
            st = t.untyped_storage()
            if st.nbytes() and st.data_ptr() not in seen:
                seen.add(st.data_ptr())
                out[kind] += st.nbytes()

        units = self.model._paro_pass.units
        for u in units:
            for kind, t in u.storages():
                add(kind, t)
        if self.optimizer is not None:
            for u in units:
                for sp in u.sharded:
                    for v in self.optimizer.state.get(sp, {}).values():
                        if torch.is_tensor(v) and v.dim() > 0:
                            add("optim", v)
        return Memory(out["params"], out["grads"], out["optim"])

    def predicted(self, per_param: StateBytes, accum: int) -> Memory:
        """What the guideline predicts for this model: peak_per_rank of its
        strategy, its units (the root last, as paro_shard adds it) and groups."""
        units = [UnitSize(u.layout.numel, sum(sl.numel for sl in u.slots if sl.trainable))
                 for u in self.model._paro_pass.units]
        first = self.model._paro_pass.units[0]
        return peak_per_rank(first.strategy, units[:-1], units[-1], first.groups.size, first.groups.group_size,
                             per_param, accum)

    def sample(self, where: str) -> None:
        now = self.held()
        if now.total > self.peak.total:
            self.peak, self.where = now, where
