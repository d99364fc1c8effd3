"""The C++ executor (hocc._C): its build, its host reduction kernels, and every
plan run on the in-process transport (all ranks as threads), compared with
torch.distributed's own results from a real gloo world."""

from __future__ import annotations

import subprocess
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from hocc import executor
from hocc.engine.dtypes import FLOAT_DTYPES
from hocc.executor.inproc import InProcWorld
from hocc.plan.planner import PlannerConfig, make_plan
from hocc.topology import parse_spec
from tests.cases import DTYPES, OP_NAMES, assert_match, make, ops_for
from tests.worlds import run_world

TOPOLOGIES = ("2x4", "4x2", "2x4:scattered", "2x2x2", "3+5", "8")
# (algo, forced K, ring_ops): ho_ring both with the transport's own collectives and with explicit rings
VARIANTS = (("native", None, ()), ("ring", None, ()), ("ho_ring", 1, ()),
            ("ho_ring", 3, ("reduce_scatter", "all_gather", "all_reduce")))
SIZES = (1, 13, 1031)


def test_one_build_for_every_device_links_no_cuda() -> None:
    """GPUs are driven through torch (its NCCL backend, its kernels), so hocc._C itself links no CUDA or NCCL
    library: the same build loads on a CPU-only torch and on a CUDA one."""
    c = executor.load()
    linked = subprocess.run(["ldd", c.__file__], capture_output=True, text=True, check=True).stdout
    assert "libtorch" in linked or "libc10" in linked, linked
    for lib in ("cudart", "nccl", "cuda.so"):
        assert lib not in linked, f"hocc._C links {lib}:\n{linked}"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", ["sum", "product", "min", "max"])
def test_host_reduce_kernels_match_torch(dtype: torch.dtype, op: str) -> None:
    c = executor.load()
    gen = torch.Generator().manual_seed(7)
    torch_op = {"sum": torch.add, "product": torch.mul, "min": torch.minimum, "max": torch.maximum}[op]
    for n in (0, 1, 7, 1031, 70001):
        a = make(n, dtype, gen, dist.ReduceOp.PRODUCT if op == "product" else dist.ReduceOp.SUM)
        b = make(n, dtype, gen, dist.ReduceOp.PRODUCT if op == "product" else dist.ReduceOp.SUM)
        if dtype in FLOAT_DTYPES and n > 3:
            b[:3] = torch.tensor([1e-7, -65000.0, 3.0e38]).to(dtype)  # subnormal, large, overflow in fp16
        want = torch_op(a, b)
        got = a.clone()
        c.reduce(got.data_ptr(), b.data_ptr(), n, str(dtype)[6:], op)
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8)) or torch.equal(got, want), \
            f"{dtype} {op} n={n}: {got[:5]} vs {want[:5]}"
        # many sources, the destination being one of them (not the first)
        srcs = [make(n, dtype, gen, dist.ReduceOp.SUM) for _ in range(5)]
        want_many = srcs[0]
        for s in srcs[1:]:
            want_many = torch_op(want_many, s)
        dst = srcs[3]
        c.reduce_many(dst.data_ptr(), [s.data_ptr() for s in srcs], n, str(dtype)[6:], op)
        if op in ("min", "max") or dtype not in FLOAT_DTYPES:
            assert torch.equal(dst, want_many), f"reduce_many {dtype} {op} n={n}"
        else:  # summation order may differ
            assert_match(dst, want_many, f"reduce_many {dtype} {op} n={n}")


def _references(rank: int, world: int) -> list[tuple]:
    """Every case's inputs and torch.distributed's results, for every rank."""
    gen = torch.Generator().manual_seed(500 + rank)
    mine = []
    for dtype in DTYPES:
        for op in ops_for(dtype):
            for n in SIZES:
                x, big = make(n, dtype, gen, op), make(n * world, dtype, gen, op)
                ar = x.clone()
                dist.all_reduce(ar, op=op)
                rs = torch.empty(n, dtype=dtype)
                dist.reduce_scatter_single(rs, big, op=op)
                ag = torch.empty(n * world, dtype=dtype)
                dist.all_gather_single(ag, x)
                mine.append((dtype, op, n, x, big, ar, rs, ag))
    everyone: list[list[tuple]] = [[] for _ in range(world)]
    dist.all_gather_object(everyone, mine)
    return [tuple(zip(*per_case, strict=True)) for per_case in zip(*everyone, strict=True)]


def _inproc_body(rank: int, world: int) -> None:
    cases = _references(rank, world)  # per case: (dtypes, ops, ns, xs, bigs, ars, rss, ags), one entry per rank
    plans: dict[tuple, object] = {}
    combos = [(t, v) for t in TOPOLOGIES for v in VARIANTS]
    checked = 0
    worlds = {}
    for i, (spec, (algo, chunks, ring_ops)) in enumerate(combos):
        if i % world != rank:  # ranks share the work; each checks every rank's output
            continue
        topo = parse_spec(spec)
        cfg = PlannerConfig(chunks=chunks, ring_ops=ring_ops, min_chunk_bytes=1)
        w = worlds.setdefault(world, InProcWorld(world, timeout_s=60))
        for dtypes, ops, ns, xs, bigs, ars, rss, ags in cases:
            dtype, op, n = dtypes[0], ops[0], ns[0]
            name = OP_NAMES[op]
            for coll, ins, refs, out_n in (("all_reduce", xs, ars, n), ("reduce_scatter", bigs, rss, n),
                                           ("all_gather", xs, ags, n * world)):
                if coll == "all_gather" and op != dist.ReduceOp.SUM:
                    continue
                key = (spec, algo, chunks, ring_ops, coll, n)
                if key not in plans:
                    plans[key] = make_plan(coll, n, 4, topo, algo, cfg)
                plan = plans[key]
                outs = [torch.full((out_n,), 77, dtype=dtype) for _ in range(world)]
                before = [x.clone() for x in ins]
                w.run(plan, list(ins), outs, name)
                for r in range(world):
                    assert_match(outs[r], refs[r], f"{spec} {plan.summary()} {dtype} {name} n={n} rank {r}")
                    assert torch.equal(ins[r], before[r]), "the executor changed an input"
                checked += 1
    assert checked > 100, checked


@pytest.mark.slow
def test_inproc_executor_matches_torch_distributed() -> None:
    run_world(8, _inproc_body, timeout_s=600)


def test_inproc_failure_in_one_rank_fails_all_promptly() -> None:
    topo = parse_spec("2x4")
    plan = make_plan("all_reduce", 4096, 4, topo, "ho_ring", PlannerConfig(chunks=2))
    w = InProcWorld(8, timeout_s=30)
    ins = [torch.ones(4096) for _ in range(8)]
    outs = [torch.full((4096,), 5.0) for _ in range(8)]
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="rank 5 failed on purpose"):
        w.run(plan, ins, outs, "sum", fail_rank=5)
    assert time.monotonic() - start < 10, "peers waited out their timeout instead of being woken"
    assert all(torch.equal(o, torch.full((4096,), 5.0)) for o in outs), "outputs written after a failure"
    w.run(plan, ins, outs, "sum")  # the world is usable again
    assert all(torch.equal(o, torch.full((4096,), 8.0)) for o in outs)


def test_c10d_comm_called_directly_again_and_again() -> None:
    """A comm's collectives from Python (as the GPU check calls NCCL's): in place, so the comm's scratch is
    used, and again, so the scratch kept from the last call is too (it once outlived its device)."""
    c = executor.load()
    pg = dist.ProcessGroupGloo(dist.HashStore(), 0, 1, timedelta(seconds=30))
    comm = c.c10d_comm(pg, 0, 1, "cpu")
    for n in (5, 1031, 3):
        x = torch.arange(n, dtype=torch.float32)
        comm.all_gather(x.data_ptr(), n, "float32")
        comm.reduce_scatter(x.data_ptr(), n, "float32", "sum")
        comm.all_reduce(x.data_ptr(), n, "float32", "max")
        assert torch.equal(x, torch.arange(n, dtype=torch.float32)), n
    y, src = torch.empty(7), torch.full((7,), 2.0)
    comm.all_reduce(y.data_ptr(), 7, "float32", "sum", src=src.data_ptr())
    assert torch.equal(y, src)


def test_inproc_rejects_mismatched_buffers() -> None:
    topo = parse_spec("2x4")
    plan = make_plan("all_reduce", 16, 4, topo, "ho_ring")
    with pytest.raises(ValueError, match="need 8 inputs"):
        InProcWorld(8).run(plan, [torch.ones(16)] * 7, [torch.ones(16)] * 7)
    with pytest.raises(RuntimeError, match="plan is for 8 ranks"):
        InProcWorld(4).run(plan, [torch.ones(16)] * 4, [torch.ones(16)] * 4)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error path on a machine without a GPU")
def test_cuda_transport_without_cuda_torch_raises_clearly() -> None:
    c = executor.load()
    with pytest.raises(RuntimeError, match="this build of torch has no cuda support, so hocc cannot run on cuda:0"):
        c.GroupTransport(0, 1, "cuda:0")
    with pytest.raises(RuntimeError, match="hocc"):
        c.InProcWorld(2, "cuda:0")
    with pytest.raises(RuntimeError):
        c.GroupTransport(0, 1, "no-such-device")
    assert not c.GroupTransport(0, 1, "cpu").is_async
