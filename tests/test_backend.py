"""The "hocc" torch.distributed backend: DDP, FSDP2 and the DDP hook train to
the same parameters as gloo; every collective returns what gloo returns;
sub-groups and a 2-D device mesh get their own hierarchy."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

import hocc
from hocc.backend.process_group import PLANNED_BROADCAST_BYTES
from hocc.bench.launch import free_port
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
    _ops_and_modes(rank, world, hg, gloo)


def _ops_and_modes(rank: int, world: int, hg: dist.ProcessGroup, gloo: dist.ProcessGroup) -> None:
    """What gloo cannot do and NCCL does (integer AVG: the sum, divided toward zero; PREMUL_SUM: the sum
    of the inputs times the factor), calls in every autograd mode, and torch's view of the group."""
    for dtype in (torch.int8, torch.uint8, torch.int32, torch.int64):
        for n in (1, 13, 1031):
            x = (torch.arange(n) * (rank + 3) % 11 - (0 if dtype == torch.uint8 else 5)).to(dtype)
            want = x.to(torch.int64, copy=True)
            dist.all_reduce(want, group=gloo)
            want = torch.div(want, world, rounding_mode="trunc").to(dtype)
            for algo in ("native", "ring", "ho_ring", "auto"):
                got = x.clone()
                hocc.all_reduce(got, dist.ReduceOp.AVG, algo=algo)
                assert torch.equal(got, want), (dtype, n, algo)
            got = x.clone()
            dist.all_reduce(got, dist.ReduceOp.AVG, group=hg)
            assert torch.equal(got, want), (dtype, n, "backend")
            rs = torch.empty(n, dtype=dtype)
            dist.reduce_scatter_single(rs, x.repeat(world), dist.ReduceOp.AVG, group=hg)
            assert torch.equal(rs, want), (dtype, n, "reduce_scatter")
    for factor in (0.25, torch.tensor([3.0])):
        x = torch.arange(7.0) * (rank + 1)
        want = x.clone()
        dist.all_reduce(want, group=gloo)
        got = x.clone()
        dist.all_reduce(got, dist._make_nccl_premul_sum(factor), group=hg)
        assert torch.allclose(got, want * factor), factor
        rs = torch.empty(7)
        dist.reduce_scatter_single(rs, x.repeat(world), dist._make_nccl_premul_sum(factor), group=hg)
        assert torch.allclose(rs, want * factor), factor
    # tensors made under inference_mode or no_grad, called in and out of those modes (the list forms
    # copy into the caller's tensors on hocc's worker thread)
    for make_mode in (torch.inference_mode, torch.no_grad):
        with make_mode():
            x = torch.arange(5.0) + rank
            outs = [torch.zeros(5) for _ in range(world)]
        for call_mode in (make_mode, torch.enable_grad):
            with call_mode():
                dist.all_gather(outs, x, group=hg)
                assert all(torch.equal(o, torch.arange(5.0) + r) for r, o in enumerate(outs))
                outs2 = [torch.zeros(5) for _ in range(world)]
                hocc.all_gather(outs2, x, group=gloo)
                assert all(torch.equal(o, torch.arange(5.0) + r) for r, o in enumerate(outs2))
                work = dist.all_gather(outs, x, group=hg, async_op=True)
                work.wait()
                t = x.clone()
                dist.all_reduce(t, group=hg)
                assert torch.equal(t, sum(torch.arange(5.0) + r for r in range(world)))
    # devices reported as torch's built-ins report theirs (DCP, _get_pg_default_device read them)
    assert torch.device("cpu") in hg._device_types
    assert dist.distributed_c10d._get_object_coll_device(hg) == "cpu"


def test_every_collective_matches_gloo() -> None:
    run_world(4, _collectives_body, env={"HOCC_TOPOLOGY": "2x2"}, backend="hocc")


def _broadcast_body(rank: int, world: int) -> None:
    """broadcast returns the root's bytes exactly, for every dtype, size and root, NaN payloads and -0.0
    included; it is planned (a sum of the root's bytes and zeros) from PLANNED_BROADCAST_BYTES, and for the
    dtypes gloo has no broadcast for. A strided view gets the root's elements (gloo's own broadcast returns
    the first bytes of its storage there)."""
    gloo = dist.new_group(backend="gloo")
    hg = dist.new_group(backend="hocc")
    specials = torch.tensor([float("nan"), -0.0, float("inf"), -float("inf"), 1e-40])

    def tensor(of: int, dtype: torch.dtype, n: int) -> torch.Tensor:  # rank `of`'s input
        g = torch.Generator().manual_seed(1000 * of + n)
        if dtype == torch.bool:
            return torch.rand(n, generator=g) > 0.5
        x = (torch.randn(n, generator=g) * 100).to(dtype)
        if dtype.is_floating_point and n >= len(specials):
            x[:len(specials)] = specials.to(dtype)
        return x

    def calls() -> int:  # hocc's calls on hg so far
        try:
            return int(hocc.stats(hg)["calls"])
        except hocc.HoccError:  # none yet
            return 0

    def check(sizes: tuple[int, ...]) -> None:
        for dtype in (torch.float32, torch.bfloat16, torch.float64, torch.complex64, torch.bool, torch.int8,
                      torch.int16, torch.uint8, torch.int64):
            for n in sizes:
                for root in (0, world - 1):
                    got = tensor(rank, dtype, n)
                    before = calls()
                    dist.broadcast(got, root, group=hg)
                    planned = calls() > before
                    # int16 is planned at any size (gloo has no int16 broadcast), the others from the threshold
                    assert planned == (dtype == torch.int16 or got.nbytes >= PLANNED_BROADCAST_BYTES), \
                        (dtype, n, planned)
                    want = tensor(root, dtype, n)
                    assert torch.equal(got.view(torch.uint8), want.view(torch.uint8)), (dtype, n, root)
                    if dtype in (torch.float32, torch.float64, torch.int64):  # and what gloo's own returns
                        ref = tensor(rank, dtype, n)
                        dist.broadcast(ref, root, group=gloo)
                        assert torch.equal(got.view(torch.uint8), ref.view(torch.uint8)), (dtype, n, root)

    assert PLANNED_BROADCAST_BYTES < 70001
    check((0, 1, 3, 13, 1031, 70001, 81919))
    plan = hocc.last_plan(hg)
    assert plan is not None and plan.collective == "all_reduce", "broadcast did not go through hocc"
    strided = (torch.arange(40000.0) + rank)[::2]
    work = dist.broadcast(strided, 1, group=hg, async_op=True)
    work.wait()
    assert torch.equal(strided, torch.arange(40000.0)[::2] + 1), strided


def test_broadcast_is_planned_and_exact() -> None:
    run_world(4, _broadcast_body, env={"HOCC_TOPOLOGY": "2x2"}, backend="hocc")


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


def _sync_here_body(rank: int, world: int) -> None:
    g = dist.group.WORLD
    assert isinstance(g, hocc.HoccProcessGroup)
    queue = g.hocc_engine(torch.device("cpu"))._queue
    t = torch.ones(3)
    dist.all_reduce(t)  # the first call of a size sets up its communicators
    pushed: list[str] = []
    real_run, real_prepared = queue.push_run, queue.push_prepared
    queue.push_run = lambda *a, **k: pushed.append("run") or real_run(*a, **k)  # type: ignore[method-assign]
    queue.push_prepared = (  # type: ignore[method-assign]  # a prepared shape's run, queued
        lambda *a, **k: pushed.append("prepared") or real_prepared(*a, **k))
    for op, want in ((dist.ReduceOp.SUM, world), (dist._make_nccl_premul_sum(0.5), 0.5 * world)):
        t = torch.ones(3)
        dist.all_reduce(t, op=op)  # torch's sync call (opts.asyncOp False): run here, nothing queued
        assert pushed == [] and torch.all(t == want), (pushed, t)
    out = [torch.empty(3) for _ in range(world)]
    dist.all_gather(out, torch.full((3,), float(rank)))  # the list form's copy-out, here too
    assert pushed == [] and all(torch.all(o == r) for r, o in enumerate(out))
    t = torch.ones(3)
    work = dist.all_reduce(t, async_op=True)  # async: queued (as its plan, or its prepared run), whoever runs it
    assert work is not None and len(pushed) == 1, pushed
    work.wait()
    assert torch.all(t == world)


def test_sync_calls_run_on_the_callers_thread() -> None:
    """torch calls a backend async and waits at once for a sync call; hocc reads opts.asyncOp and runs
    such a call here (the hand-off to its worker and back cost a 4-byte all_reduce about 120 us)."""
    run_world(2, _sync_here_body, backend="hocc")


class _SlowStore(dist.Store):
    """The store a slow rank's gloo sees: its wait for the last rank's address takes 2 s, so it is still
    inside connectFullMesh when the other ranks have finished theirs."""

    def __init__(self, inner: dist.Store, last: str) -> None:
        super().__init__()
        self.inner, self.last = inner, last

    def set(self, key: str, value: Any) -> None:
        self.inner.set(key, value)

    def get(self, key: str) -> bytes:
        if key.endswith(self.last):
            time.sleep(2.0)
        return self.inner.get(key)

    def add(self, key: str, n: int) -> int:
        return self.inner.add(key, n)

    def wait(self, keys: list[str], *timeout: Any) -> None:
        self.inner.wait(keys, *timeout)

    def check(self, keys: list[str]) -> bool:
        return self.inner.check(keys)


def _slow_gloo_body(rank: int, world: int) -> None:
    import torch.distributed.distributed_c10d as c10d

    if rank == 0:
        built = c10d.ProcessGroupGloo

        class SlowGloo(built):  # type: ignore[misc, valid-type]
            def __init__(self, store: dist.Store, *args: Any, **kwargs: Any) -> None:
                super().__init__(_SlowStore(store, str(world - 1)), *args, **kwargs)

        c10d.ProcessGroupGloo = SlowGloo
    mixed = dist.new_group(backend="cpu:gloo,cuda:hocc")
    t = torch.ones(3)
    dist.all_reduce(t, group=mixed)
    assert torch.all(t == world)


def test_mixed_group_waits_for_a_slow_rank() -> None:
    """A "cpu:gloo,cuda:hocc" group: torch builds gloo for CPU, then drops it for the group hocc's
    creator returns. A rank that dropped it while rank 0 was still connecting made rank 0 fail
    ("Connection closed by peer"); the creator now waits for every rank first. Rank 0 is made slow
    inside gloo's own set-up, where the failure was (it came and went with load before)."""
    run_world(4, _slow_gloo_body, backend="hocc")


def test_bad_device_map() -> None:
    pg = hocc.HoccProcessGroup.__new__(hocc.HoccProcessGroup)
    pg._device_map = {"cpu": "mpi"}
    with pytest.raises(RuntimeError, match="cannot serve"):
        pg._backend_for(torch.device("cpu"))


SPAWN_SCRIPT = '''
import os, sys
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

def child(rank, port):
    assert "hocc" not in sys.modules  # torch's "torch.backends" entry point registered the backend
    dist.init_process_group("hocc", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    t = torch.full((5,), float(rank + 1))
    dist.all_reduce(t)
    assert torch.equal(t, torch.full((5,), 3.0)), t
    dist.destroy_process_group()

if __name__ == "__main__":
    mp.spawn(child, args=(int(sys.argv[1]),), nprocs=2)
    print("spawned ok")
'''


def test_backend_known_without_importing_hocc(tmp_path: Path) -> None:
    """A script that never imports hocc (mp.spawn children of a script that imports it only inside
    main(), a framework's launcher) still finds the "hocc" backend."""
    script = tmp_path / "spawned.py"
    script.write_text(SPAWN_SCRIPT)
    env = {k: v for k, v in os.environ.items() if k != "TORCH_DEVICE_BACKEND_AUTOLOAD"}
    done = subprocess.run([sys.executable, str(script), str(free_port())], capture_output=True, text=True,
                          timeout=120, env=env)
    assert done.returncode == 0 and "spawned ok" in done.stdout, done.stderr[-3000:]
