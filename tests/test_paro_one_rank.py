"""PaRO-DP on a world of one, every strategy equal to plain training
(tests/paro_one_rank.py): on the CPU here, and on a GPU where one is present,
where it checks the ordering of the worker's stream against the caller's
(bench/gpu_check.sh runs the same check as its paro section)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

import hocc
from tests.paro_one_rank import check


@pytest.fixture
def world_of_one(request: pytest.FixtureRequest) -> Iterator[str]:
    device = request.param
    backend = "nccl" if device.startswith("cuda") else "gloo"
    if device.startswith("cuda"):
        torch.cuda.set_device(torch.device(device))
    dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timedelta(seconds=60))
    try:
        yield device
    finally:
        hocc.reset_engines()
        dist.destroy_process_group()


@pytest.mark.parametrize("world_of_one", ["cpu"], indirect=True)
def test_every_strategy_equals_plain_training_cpu(world_of_one: str) -> None:
    res = check(world_of_one)
    assert res["ok"], res["failures"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (bench/gpu_check.sh on a lent one)")
@pytest.mark.parametrize("world_of_one", ["cuda:0"], indirect=True)
def test_every_strategy_equals_plain_training_cuda(world_of_one: str) -> None:
    res = check(world_of_one)
    assert res["ok"], res["failures"]
