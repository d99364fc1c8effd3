"""Run a plan with every rank as a thread of this process (the C++ in-process
transport): for tests on the CPU, and for all ranks on one GPU. The executor
packs, runs and unpacks, exactly as for a multi-process group."""

from __future__ import annotations

from typing import Any

import torch

from hocc.executor import load
from hocc.executor.cpp_form import dtype_name, to_cpp
from hocc.plan.types import Plan


class InProcWorld:
    def __init__(self, size: int, device: str = "cpu", timeout_s: float = 60.0) -> None:
        self.size = size
        self.device = device
        self._world = load().InProcWorld(size, device, timeout_s)

    def run(self, plan: Plan, inputs: list[torch.Tensor], outputs: list[torch.Tensor], op_name: str = "sum",
            fail_rank: int = -1, absent_rank: int = -1, slow_rank: int = -1, slow_s: float = 0.0,
            cpp: Any = None) -> None:
        """One collective: rank r's input `inputs[r]`, result into `outputs[r]`
        (per-rank shapes as in torch.distributed). fail_rank makes that rank
        fail before its first step, absent_rank makes it never join, slow_rank
        makes it begin, then sleep slow_s seconds before its first step (to
        test that the others raise instead of hanging: a rank waits at most
        the world's timeout for a silent peer, then every rank raises; and
        whom they name). `cpp`: the plan's C++ form when made already (the
        engine's, hocc.engine.plan_cache, maybe a scaled unit)."""
        if len(inputs) != self.size or len(outputs) != self.size:
            raise ValueError(f"need {self.size} inputs and outputs, got {len(inputs)} and {len(outputs)}")
        if not all(t.is_contiguous() for t in (*inputs, *outputs)):
            raise ValueError("inputs and outputs must be contiguous")
        size = plan.layout.size if plan.work_at == "scratch" else 0
        works = [torch.empty(size, dtype=x.dtype, device=x.device) for x in inputs]
        cpp = cpp if cpp is not None else to_cpp(plan)
        self._world.run(cpp, [x.data_ptr() for x in inputs], [o.data_ptr() for o in outputs],
                        [w.data_ptr() for w in works], dtype_name(inputs[0].dtype), op_name, fail_rank,
                        absent_rank, slow_rank, slow_s)

    def last_record(self, rank: int) -> Any:
        """Rank `rank`'s RunRecord of the latest run (hocc._C.RunRecord: steps(), exchanges()), or None."""
        return self._world.last_record(rank)
