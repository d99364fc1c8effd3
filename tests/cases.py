"""What the correctness tests share: reduction-op tables, inputs that keep
every op exact or well scaled, tolerances per dtype, a reference reduction,
and the per-rank bodies of the multi-process tests (every op x algo x dtype x
reduction op x size, each compared with torch.distributed's own result)."""

from __future__ import annotations

import torch
import torch.distributed as dist

import hocc
from hocc.bench.collectives import reduce_ref
from hocc.engine.dtypes import FLOAT_DTYPES

ALGOS = ("native", "ring", "ho_ring", "auto")
ALL_OPS = (dist.ReduceOp.SUM, dist.ReduceOp.AVG, dist.ReduceOp.MIN, dist.ReduceOp.MAX, dist.ReduceOp.PRODUCT)
DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.int32, torch.int64,
          torch.uint8)
SIZES = (1, 13, 1031)  # one, a prime below the world size's multiples, a large prime
OP_NAMES = {dist.ReduceOp.SUM: "sum", dist.ReduceOp.AVG: "avg", dist.ReduceOp.MIN: "min",
            dist.ReduceOp.MAX: "max", dist.ReduceOp.PRODUCT: "product"}
OP_BY_NAME = {name: op for op, name in OP_NAMES.items()}


def tolerance(dtype: torch.dtype) -> float:
    """rtol = atol for a float result against a float64 reference (half precision
    rounds each partial sum); 0 for integers, which must match exactly."""
    if dtype not in FLOAT_DTYPES:
        return 0.0
    return {torch.float16: 2e-2, torch.bfloat16: 8e-2}.get(dtype, 1e-5)


def expected(op: str, xs: list[torch.Tensor]) -> torch.Tensor:
    """The reduction of `xs` by op name, in float64 (hocc.bench.collectives' reference)."""
    return reduce_ref(xs, op)


def ops_for(dtype: torch.dtype) -> tuple[dist.ReduceOp, ...]:
    if dtype in (torch.float32, torch.int32):
        return tuple(o for o in ALL_OPS if dtype in FLOAT_DTYPES or o != dist.ReduceOp.AVG)
    return (dist.ReduceOp.SUM, dist.ReduceOp.MAX) + ((dist.ReduceOp.AVG,) if dtype in FLOAT_DTYPES else ())


def make(n: int, dtype: torch.dtype, gen: torch.Generator, op: dist.ReduceOp) -> torch.Tensor:
    if dtype in FLOAT_DTYPES:
        x = torch.rand(n, generator=gen, dtype=torch.float64) + 0.5  # away from 0: products stay well scaled
        if op != dist.ReduceOp.PRODUCT:
            x = torch.randn(n, generator=gen, dtype=torch.float64)
        return x.to(dtype)
    lo, hi = (0, 4) if dtype == torch.uint8 else (-3, 4)
    return torch.randint(lo, hi, (n,), generator=gen, dtype=torch.int64).to(dtype)


def assert_match(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    if got.dtype in FLOAT_DTYPES:
        tol = tolerance(got.dtype)
        if not torch.allclose(got.double(), want.double(), rtol=tol, atol=tol):
            diff = (got.double() - want.double()).abs().max().item()
            raise AssertionError(f"{what}: max difference {diff}")
    elif not torch.equal(got, want):
        bad = (got != want).nonzero().flatten()[:5].tolist()
        raise AssertionError(f"{what}: differs at {bad}")


def check_all(rank: int, world: int, group: dist.ProcessGroup | None = None, algos: tuple[str, ...] = ALGOS,
              dtypes: tuple[torch.dtype, ...] = DTYPES, sizes: tuple[int, ...] = SIZES) -> int:
    """Every collective against torch.distributed on `group`; returns the case count."""
    n_group = dist.get_world_size(group)
    me = dist.get_rank(group)
    gen = torch.Generator().manual_seed(1000 + rank)
    cases = 0
    for dtype in dtypes:
        for op in ops_for(dtype):
            for n in sizes:
                x = make(n, dtype, gen, op)
                big = make(n * n_group, dtype, gen, op)
                ref_ar = x.clone()
                dist.all_reduce(ref_ar, op=op, group=group)
                ref_rs = torch.empty(n, dtype=dtype)
                dist.reduce_scatter_single(ref_rs, big, op=op, group=group)
                ref_ag = torch.empty(n * n_group, dtype=dtype)
                dist.all_gather_single(ref_ag, x, group=group)
                for algo in algos:
                    tag = f"rank {me} {algo} {dtype} {op} n={n}"
                    y = x.clone()
                    hocc.all_reduce(y, op=op, group=group, algo=algo)
                    assert_match(y, ref_ar, f"all_reduce {tag} [{hocc.last_plan(group).summary()}]")
                    out = torch.full((n,), 77, dtype=dtype)
                    big_before = big.clone()
                    hocc.reduce_scatter_tensor(out, big, op=op, group=group, algo=algo)
                    assert_match(out, ref_rs, f"reduce_scatter {tag} [{hocc.last_plan(group).summary()}]")
                    assert torch.equal(big, big_before), f"reduce_scatter changed its input: {tag}"
                    if op == dist.ReduceOp.SUM:
                        ag = torch.zeros(n * n_group, dtype=dtype)
                        hocc.all_gather_into_tensor(ag, x, group=group, algo=algo)
                        assert_match(ag, ref_ag, f"all_gather {tag} [{hocc.last_plan(group).summary()}]")
                    cases += 3
    return cases


def check_list_forms(rank: int, world: int, group: dist.ProcessGroup | None = None) -> None:
    """all_gather / reduce_scatter (list forms), the *_single names, async work objects."""
    n_group = dist.get_world_size(group)
    gen = torch.Generator().manual_seed(rank)
    for algo in ("native", "ho_ring"):
        x = torch.randn(5, 3, generator=gen)
        outs = [torch.empty(5, 3) for _ in range(n_group)]
        refs = [torch.empty(5, 3) for _ in range(n_group)]
        dist.all_gather(refs, x, group=group)
        hocc.all_gather(outs, x, group=group, algo=algo)
        for a, b in zip(outs, refs, strict=True):
            assert torch.equal(a, b)
        ins = [torch.randn(4, generator=gen) for _ in range(n_group)]
        ref = torch.empty(4)
        dist.reduce_scatter_single(ref, torch.cat(ins), group=group)
        out = torch.empty(4)
        hocc.reduce_scatter(out, ins, group=group, algo=algo)
        assert_match(out, ref, "reduce_scatter list form")
        out2 = torch.empty(4)
        hocc.reduce_scatter_single(out2, torch.cat(ins), group=group, algo=algo)
        assert_match(out2, ref, "reduce_scatter_single")
        ag = torch.empty(15 * n_group)
        hocc.all_gather_single(ag, x.reshape(-1), group=group, algo=algo)
        assert torch.equal(ag, torch.cat([r.reshape(-1) for r in refs]))
        # several async calls in flight, completed in order
        ts = [torch.full((33,), float(rank + i)) for i in range(4)]
        works = [hocc.all_reduce(t, group=group, async_op=True, algo=algo) for t in ts]
        fut = works[-1].get_future()
        for i, (w, t) in enumerate(zip(works, ts, strict=True)):
            assert w.wait()
            assert w.is_completed()
            want = sum(float(r + i) for r in dist.get_process_group_ranks(group or dist.group.WORLD))
            assert torch.all(t == want), (t[:3], want)
        assert torch.equal(fut.wait()[0], ts[-1])
