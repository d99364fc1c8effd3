"""Run a plan with every rank as a thread of this process (the C++ in-process
transport): for tests on the CPU, and for all ranks on one GPU."""

from __future__ import annotations

import torch

from hocc.engine.layout import pack, unpack
from hocc.native import load
from hocc.native.plans import to_native
from hocc.plan.types import Plan


class InProcWorld:
    def __init__(self, size: int, device: str = "cpu", timeout_s: float = 60.0) -> None:
        self.size = size
        self.device = device
        self._world = load().InProcWorld(size, device, timeout_s)

    def run(self, plan: Plan, inputs: list[torch.Tensor], outputs: list[torch.Tensor], op_name: str = "sum",
            fail_rank: int = -1) -> None:
        """One collective: rank r's input `inputs[r]`, result into `outputs[r]`
        (per-rank shapes as in torch.distributed). fail_rank makes that rank
        fail before its first step (to test that the others do not hang)."""
        if len(inputs) != self.size or len(outputs) != self.size:
            raise ValueError(f"need {self.size} inputs and outputs, got {len(inputs)} and {len(outputs)}")
        works = [pack(plan.collective, plan.layout, x.contiguous(), r) for r, x in enumerate(inputs)]
        dtype = str(inputs[0].dtype).removeprefix("torch.")
        self._world.run(to_native(plan), [w.data_ptr() for w in works], dtype, op_name, fail_rank)
        for r, (w, out) in enumerate(zip(works, outputs, strict=True)):
            if op_name == "avg" and plan.collective != "all_gather":
                w.div_(self.size)
            unpack(plan.collective, plan.layout, w, out, r)
