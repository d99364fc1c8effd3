"""PaRO-DP on a spawned 2x4 gloo world: every strategy, trained with gradient
accumulation, ends where DDP ends (SGD with momentum and AdamW); each
strategy's collectives are those its schedule lists; the measured storage of
every state equals the memory model's prediction. Strategy parsing and
rejection without ranks."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn

from hocc.paro import PAPER_STRATEGIES, all_strategies, parse
from hocc.paro.memory import StateBytes, memory_per_rank
from tests.worlds import run_world

STEPS, ACCUM = 3, 3


def _model() -> nn.Module:
    torch.manual_seed(0)  # 7*13+13+13*5+5 = 174 parameters: not a multiple of 8, so shards are padded
    return nn.Sequential(nn.Linear(7, 13), nn.Tanh(), nn.Linear(13, 5))


def _batches(rank: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(100 + rank)
    return [(torch.randn(4, 7, generator=gen), torch.randn(4, 5, generator=gen)) for _ in range(STEPS * ACCUM)]


OPTIMIZERS = {
    "sgd": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=0.01, weight_decay=0.1),
}


def _ddp_reference(rank: int, opt: str) -> torch.Tensor:
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = DDP(_model())
    optim = OPTIMIZERS[opt](list(model.parameters()))
    batches = _batches(rank)
    for s in range(STEPS):
        for m in range(ACCUM):
            x, y = batches[s * ACCUM + m]
            if m < ACCUM - 1:
                with model.no_sync():
                    nn.functional.mse_loss(model(x), y).backward()
            else:
                nn.functional.mse_loss(model(x), y).backward()
        optim.step()
        optim.zero_grad()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def _expected_trace(strategy: str, numel: int, world: int, hosts: int) -> list[tuple[str, str, str, str, int]]:
    """The calls the schedule lists, with the elements each sends in."""
    block = -(-numel // world)
    size = {"N": block * world, "I": block * hosts, "G": block}
    per_step: list[tuple[str, str, str, str, int]] = []
    sched = parse(strategy).schedule()
    for _ in range(ACCUM):
        per_step += [(c.op, c.where, c.when, c.state, size[c.src]) for c in sched if c.when == "micro"]
    per_step += [(c.op, c.where, c.when, c.state, size[c.src]) for c in sched if c.when == "step"]
    return per_step * STEPS


def _train_all(rank: int, world: int) -> None:
    from hocc.paro import ParoDP

    groups = None
    hosts = 2
    for opt in OPTIMIZERS:
        want = _ddp_reference(rank, opt)
        for strat in all_strategies():
            dp = ParoDP(_model(), strat, OPTIMIZERS[opt], groups=groups)
            groups = dp.groups
            assert groups.n_groups == hosts and groups.group_size == 4, (groups.hosts, groups.rails)
            batches = _batches(rank)
            for s in range(STEPS):
                for m in range(ACCUM):
                    x, y = batches[s * ACCUM + m]
                    dp.backward(nn.functional.mse_loss(dp(x), y))
                dp.step()
                if s == 0 and opt == "adamw":
                    got = dp.storage_bytes()
                    pred = memory_per_rank(strat, dp.numel, world, 4, StateBytes(4, 4, 12))
                    assert got == pred.as_dict(), f"{strat}: measured {got}, model {pred.as_dict()}"
            got = dp.full_parameters()
            if not torch.allclose(got, want, rtol=1e-4, atol=1e-5):
                diff = (got - want).abs().max().item()
                raise AssertionError(f"rank {rank} {strat} {opt}: parameters differ from DDP's by {diff}")
            assert dp.trace == _expected_trace(strat.name, dp.numel, world, hosts), (strat, dp.trace[:8])
        dist.barrier()
    _mixed_precision(rank, world, want, groups)
    _other_intra_groups(rank, world, want)


def _train(dp: object, rank: int) -> torch.Tensor:
    batches = _batches(rank)
    for s in range(STEPS):
        for m in range(ACCUM):
            x, y = batches[s * ACCUM + m]
            dp.backward(nn.functional.mse_loss(dp(x), y))  # type: ignore[operator, attr-defined]
        dp.step()  # type: ignore[attr-defined]
    return dp.full_parameters()  # type: ignore[attr-defined, no-any-return]


def _other_intra_groups(rank: int, world: int, want: torch.Tensor) -> None:
    """Intra-groups that are not hocc's hosts: explicit strided rank lists, and
    a dimension of a 2-D DeviceMesh (here its columns: groups of 2)."""
    from torch.distributed.device_mesh import init_device_mesh

    from hocc.paro import ParoDP

    with pytest.raises(ValueError, match="equal size"):  # refused before any group is made
        ParoDP(_model(), "IIG", OPTIMIZERS["adamw"], intra_groups=[[0, 1, 2], [3, 4, 5, 6, 7]])
    with pytest.raises(ValueError, match="sharded less than gradients"):
        ParoDP(_model(), "IGI", OPTIMIZERS["adamw"])
    dp = ParoDP(_model(), "IIG", OPTIMIZERS["adamw"], intra_groups=[[0, 2, 4, 6], [1, 3, 5, 7]])
    assert {id(p) for p in dp.parameters()} == {id(p) for p in dp.module.parameters()}
    assert dp.groups.rails == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert torch.allclose(_train(dp, rank), want, rtol=1e-4, atol=1e-5), "strided intra-groups"
    mesh = init_device_mesh("cpu", (2, 4), mesh_dim_names=("a", "b"))
    dp = ParoDP(_model(), "NIG", OPTIMIZERS["adamw"], mesh=mesh, mesh_dim="a")
    assert dp.groups.hosts == [(0, 4), (1, 5), (2, 6), (3, 7)]
    assert torch.allclose(_train(dp, rank), want, rtol=1e-4, atol=1e-5), "mesh dimension as intra-group"


def _mixed_precision(rank: int, world: int, want: torch.Tensor, groups: object) -> None:
    """bf16 parameters and gradients, fp32 master: 2/2/12 bytes per parameter,
    and training tracks fp32 DDP (AdamW) loosely."""
    from hocc.paro import ParoDP

    for strat in ("IIG", "GGG"):
        dp = ParoDP(_model(), strat, OPTIMIZERS["adamw"], param_dtype=torch.bfloat16, groups=groups)
        batches = _batches(rank)
        for s in range(STEPS):
            for m in range(ACCUM):
                x, y = batches[s * ACCUM + m]
                dp.backward(nn.functional.mse_loss(dp(x.bfloat16()).float(), y))
            dp.step()
        assert dp.storage_bytes() == memory_per_rank(strat, dp.numel, world, 4).as_dict()
        got = dp.full_parameters()
        assert torch.allclose(got, want, atol=3e-2), (strat, (got - want).abs().max().item())


def test_every_strategy_matches_ddp_on_2x4() -> None:
    """One world: 14 strategies x (SGD, AdamW), then two in bf16."""
    run_world(8, _train_all, env={"HOCC_TOPOLOGY": "2x4"})


def test_parse_and_reject() -> None:
    assert parse("nig").name == "NIG"
    assert set(PAPER_STRATEGIES) <= {s.name for s in all_strategies()}
    assert len(all_strategies()) == 14
    with pytest.raises(ValueError, match="three letters"):
        parse("NX")
    with pytest.raises(ValueError, match="gradients it does not hold"):
        parse("NGN")
    with pytest.raises(ValueError, match="parameters it does not keep"):
        parse("GNN")


def test_schedules() -> None:
    """The paper's trade in the schedule: gradients cross hosts once per step
    unless g = G; parameters cross hosts per micro-step only when p = G."""
    for s in all_strategies():
        sched = s.schedule()
        inter_micro = [c for c in sched if c.when == "micro" and c.where != "host"]
        assert bool(inter_micro) == ("G" in (s.params, s.grads)), (s, sched)
        assert all(c.where == "host" for c in sched if c.when == "micro" and "G" not in (s.params, s.grads))
    assert [c.describe() for c in parse("IIG").schedule()] == [
        "all_gather(params I->N) over host, per micro", "reduce_scatter(grads N->I) over host, per micro",
        "reduce_scatter(grads I->G) over rail, per step", "all_gather(params G->I) over rail, per step"]
