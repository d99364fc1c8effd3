"""The "hocc" torch.distributed backend: DDP, FSDP2 and the DDP hook train to
the same parameters as gloo; every collective returns what gloo returns;
sub-groups and a 2-D device mesh get their own hierarchy."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import hocc
from tests.worlds import run_world

STEPS = 4


def _model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(37, 64), torch.nn.ReLU(), torch.nn.Linear(64, 5))


def _batches(rank: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(100 + rank)
    return [(torch.randn(8, 37, generator=g), torch.randn(8, 5, generator=g)) for _ in range(STEPS)]


def _train(model: torch.nn.Module, rank: int) -> list[torch.Tensor]:
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for x, y in _batches(rank):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return [p.detach().full_tensor() if hasattr(p, "full_tensor") else p.detach().clone()
            for p in model.parameters()]


def _same(a: list[torch.Tensor], b: list[torch.Tensor], what: str) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert torch.allclose(x, y, rtol=1e-5, atol=1e-6), f"{what}: max diff {(x - y).abs().max().item()}"


def _training_body(rank: int, world: int) -> None:
    from torch.nn.parallel import DistributedDataParallel as DDP

    assert dist.get_backend() == "hocc"
    gloo = dist.new_group(backend="gloo")
    ref = _train(DDP(_model(), process_group=gloo), rank)
    got = _train(DDP(_model()), rank)  # default group: hocc
    _same(got, ref, "DDP on hocc")
    plan = hocc.last_plan()
    assert plan is not None and plan.collective == "all_reduce", "DDP's gradients did not go through hocc"

    hooked = DDP(_model(), process_group=gloo)
    hooked.register_comm_hook(gloo, hocc.ddp_comm_hook)
    _same(_train(hooked, rank), ref, "DDP with hocc.ddp_comm_hook")

    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    def fsdp(group: dist.ProcessGroup) -> list[torch.Tensor]:
        mesh = DeviceMesh.from_group(group, "cpu")
        m = _model()
        for layer in m:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(m, mesh=mesh)
        return _train(m, rank)

    on_hocc = fsdp(dist.group.WORLD)
    plan = hocc.last_plan()
    assert plan is not None and plan.collective in ("all_gather", "reduce_scatter"), "FSDP2 bypassed hocc"
    _same(on_hocc, fsdp(gloo), "FSDP2 on hocc")
    _same(on_hocc, ref, "FSDP2 on hocc against DDP on gloo")


@pytest.mark.slow
def test_ddp_fsdp_and_hook_train_like_gloo() -> None:
    run_world(4, _training_body, env={"HOCC_TOPOLOGY": "2x2"}, backend="hocc")


def _collectives_body(rank: int, world: int) -> None:
    """Every torch.distributed collective once on the hocc group, against gloo."""
    gloo = dist.new_group(backend="gloo")
    hg = dist.group.WORLD

    def both(fn):  # type: ignore[no-untyped-def]
        return fn(hg), fn(gloo)

    def eq(a, b, what):  # type: ignore[no-untyped-def]
        if isinstance(a, (list, tuple)):
            for x, y in zip(a, b, strict=True):
                eq(x, y, what)
        else:
            assert torch.allclose(a, b), f"{what}: {a} != {b}"

    x = torch.arange(10.0) + rank

    def all_reduce(g):  # type: ignore[no-untyped-def]
        t = x.clone()
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=g)
        return t

    def broadcast(g):  # type: ignore[no-untyped-def]
        t = x.clone()
        dist.broadcast(t, src=2, group=g)
        return t

    def reduce(g):  # type: ignore[no-untyped-def]
        t = x.clone()
        dist.reduce(t, dst=1, group=g)
        return t

    def all_gather(g):  # type: ignore[no-untyped-def]
        out = [torch.empty(10) for _ in range(world)]
        dist.all_gather(out, x, group=g)
        return out

    def all_gather_single(g):  # type: ignore[no-untyped-def]
        out = torch.empty(10 * world)
        dist.all_gather_single(out, x, group=g)
        return out

    def gather(g):  # type: ignore[no-untyped-def]
        out = [torch.empty(10) for _ in range(world)] if rank == 0 else None
        dist.gather(x, out, dst=0, group=g)
        return out if out is not None else [x]

    def scatter(g):  # type: ignore[no-untyped-def]
        out = torch.empty(10)
        dist.scatter(out, [x + i for i in range(world)] if rank == 3 else None, src=3, group=g)
        return out

    def reduce_scatter(g):  # type: ignore[no-untyped-def]
        out = torch.empty(10)
        dist.reduce_scatter(out, [x * (i + 1) for i in range(world)], group=g)
        return out

    def reduce_scatter_single(g):  # type: ignore[no-untyped-def]
        out = torch.empty(3)
        dist.reduce_scatter_single(out, torch.arange(3.0 * world) * (rank + 1), op=dist.ReduceOp.MIN, group=g)
        return out

    def all_to_all(g):  # type: ignore[no-untyped-def]
        out = [torch.empty(2) for _ in range(world)]
        dist.all_to_all(out, [torch.full((2,), 10.0 * rank + i) for i in range(world)], group=g)
        return out

    def all_to_all_single(g):  # type: ignore[no-untyped-def]
        out = torch.empty(2 * world)
        dist.all_to_all_single(out, torch.arange(2.0 * world) + 100 * rank, group=g)
        return out

    def p2p(g):  # type: ignore[no-untyped-def]
        nxt, prv = (rank + 1) % world, (rank - 1) % world
        got = torch.empty(10)
        if rank % 2 == 0:
            dist.send(x, nxt, group=g)
            dist.recv(got, prv, group=g)
        else:
            dist.recv(got, prv, group=g)
            dist.send(x, nxt, group=g)
        got2 = torch.empty(10)
        ops = [dist.P2POp(dist.isend, x * 2, nxt, group=g), dist.P2POp(dist.irecv, got2, prv, group=g)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        return [got, got2]

    def objects(g):  # type: ignore[no-untyped-def]
        objs = [None] * world
        dist.all_gather_object(objs, {"rank": rank}, group=g)
        lst = [f"from {rank}"]
        dist.broadcast_object_list(lst, src=1, group=g)
        assert lst == ["from 1"] and objs == [{"rank": r} for r in range(world)]
        return torch.zeros(1)

    for fn in (all_reduce, broadcast, reduce, all_gather, all_gather_single, gather, scatter, reduce_scatter,
               reduce_scatter_single, all_to_all, all_to_all_single, p2p, objects):
        a, b = both(fn)
        eq(a, b, fn.__name__)
    dist.barrier(group=hg)
    w = dist.all_reduce(x.clone(), group=hg, async_op=True)
    assert w.wait() and w.is_completed()
    assert torch.allclose(w.get_future().wait()[0], sum(torch.arange(10.0) + r for r in range(world)))
    assert hocc.last_plan() is not None


def test_every_collective_matches_gloo() -> None:
    run_world(4, _collectives_body, env={"HOCC_TOPOLOGY": "2x2"}, backend="hocc")


def _groups_body(rank: int, world: int) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    sub = dist.new_group([1, 2, 3], backend="hocc")
    if rank in (1, 2, 3):
        assert sub.hocc_engine(torch.device("cpu")).topology.shape() == "1+2"
        t = torch.full((7,), float(rank))
        dist.all_reduce(t, group=sub)
        assert torch.all(t == 6.0)
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"), backend_override={"dp": "hocc",
                                                                                             "tp": "hocc"})
    dp, tp = mesh.get_group("dp"), mesh.get_group("tp")
    assert dp.hocc_engine(torch.device("cpu")).topology.shape() == "2x1"   # dp spans the two hosts
    assert tp.hocc_engine(torch.device("cpu")).topology.shape() == "1x2"   # tp stays on one
    for g in (dp, tp):
        t = torch.arange(5.0) * (rank + 1)
        ref = t.clone()
        dist.all_reduce(t, group=g)
        members = dist.get_process_group_ranks(g)
        assert torch.allclose(t, ref / (rank + 1) * sum(r + 1 for r in members))
    mixed = dist.new_group(backend="cpu:gloo,cuda:hocc")
    t = torch.ones(3)
    before = hocc.last_plan(mixed)
    dist.all_reduce(t, group=mixed)
    assert torch.all(t == world)
    assert hocc.last_plan(mixed) is before, "CPU tensors of a cpu:gloo group went through hocc"


@pytest.mark.slow
def test_subgroups_and_device_mesh() -> None:
    run_world(4, _groups_body, env={"HOCC_TOPOLOGY": "2x2"}, backend="hocc")


def test_bad_device_map() -> None:
    pg = hocc.HoccProcessGroup.__new__(hocc.HoccProcessGroup)
    pg._device_map = {"cpu": "mpi"}
    with pytest.raises(RuntimeError, match="cannot serve"):
        pg._backend_for(torch.device("cpu"))
