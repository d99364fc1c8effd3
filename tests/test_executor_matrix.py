"""The executor matrix (world sizes 1-5 in `make test-fast`): every algorithm's plan, run by the
C++ executor with all ranks as threads of this process (the in-process
transport), over world sizes 1 to 9, counts 0, 1 and primes, in place and out
of place, with tiny chunks so that small tensors go through the pipeline.

Values are small integers, so every dtype's reduction is exact and the
expected results are computed here with torch; tests/test_native.py checks
the same executor against torch.distributed's own results on a real gloo
world."""

from __future__ import annotations

import itertools
import zlib

import pytest
import torch

from hocc.executor.inproc import InProcWorld
from hocc.plan.planner import PlannerConfig, make_plan
from hocc.topology import parse_spec
from tests.cases import assert_match, expected

COUNTS = (0, 1, 7, 31)
DTYPES = (torch.float32, torch.bfloat16, torch.int32)
# (algo, forced K, ring ops): the transport's own collectives and explicit rings, one and several chunks
VARIANTS = (("native", None, ()), ("ring", None, ()), ("ho_ring", 1, ()),
            ("ho_ring", 3, ("reduce_scatter", "all_gather", "all_reduce")))


def topologies(world: int) -> list[str]:
    """Flat, every uniform split, a scattered placement, and an unequal split."""
    specs = [str(world)]
    specs += [f"{h}x{world // h}" for h in range(2, world) if world % h == 0]
    if world >= 4 and world % 2 == 0:
        specs.append(f"2x{world // 2}:scattered")
    if world >= 3:
        specs.append(f"{world // 2}+{world - world // 2}")
    return specs


def ops_for(dtype: torch.dtype) -> tuple[str, ...]:
    """Every op somewhere, not every op everywhere (tests/test_native.py sweeps them all)."""
    return {torch.float32: ("sum", "avg", "min"), torch.bfloat16: ("sum", "max"),
            torch.int32: ("sum", "product")}[dtype]


def inputs(world: int, n: int, dtype: torch.dtype, op: str, seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    lo, hi = (1, 3) if op == "product" else (-4, 5)
    return [torch.randint(lo, hi, (n,), generator=gen).to(dtype) for _ in range(world)]


def close(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    assert_match(got, want.to(got.dtype), what)


@pytest.mark.parametrize("world", [*range(1, 6), *(pytest.param(w, marks=pytest.mark.slow) for w in range(6, 10))])
def test_every_plan_matches_torch(world: int) -> None:
    w = InProcWorld(world, timeout_s=30)
    runs = 0
    for spec, (algo, k, ring_ops) in itertools.product(topologies(world), VARIANTS):
        topo = parse_spec(spec)
        cfg = PlannerConfig(chunks=k, ring_ops=ring_ops, min_chunk_bytes=1)
        for n, dtype in itertools.product(COUNTS, DTYPES):
            for op in ops_for(dtype):
                seed = zlib.crc32(repr((spec, algo, k, n, str(dtype), op)).encode()) & 0xFFFF  # the same every run
                what = f"{spec} {algo} K={k} n={n} {dtype} {op}"
                xs = inputs(world, n, dtype, op, seed)
                want = expected(op, xs)
                # all_reduce, in place (its only form)
                plan = make_plan("all_reduce", n, xs[0].element_size(), topo, algo, cfg)
                outs = [x.clone() for x in xs]
                w.run(plan, outs, outs, op)
                for r in range(world):
                    close(outs[r], want, f"all_reduce {what} rank {r}")
                # reduce_scatter: rank r gets block r of the reduced (world * n) input
                big = inputs(world, world * n, dtype, op, seed + 1)
                want_rs = expected(op, big).view(world, n)
                plan = make_plan("reduce_scatter", n, big[0].element_size(), topo, algo, cfg)
                outs = [torch.full((n,), 99, dtype=dtype) for _ in range(world)]
                kept = [b.clone() for b in big]
                w.run(plan, big, outs, op)
                for r in range(world):
                    close(outs[r], want_rs[r], f"reduce_scatter {what} rank {r}")
                    assert torch.equal(big[r], kept[r]), f"reduce_scatter {what}: input changed"
                # ... and in place: the output is the rank's own block of the input
                ins = [b.clone() for b in kept]
                w.run(plan, ins, [ins[r][r * n:(r + 1) * n] for r in range(world)], op)
                for r in range(world):
                    close(ins[r][r * n:(r + 1) * n], want_rs[r], f"reduce_scatter in place {what} rank {r}")
                runs += 3
            # all_gather (no reduction): out of place, then in place (input = own block of the output)
            xs = inputs(world, n, dtype, "sum", n)
            want_ag = torch.cat(xs) if n else torch.empty(0, dtype=dtype)
            plan = make_plan("all_gather", n, xs[0].element_size(), topo, algo, cfg)
            outs = [torch.full((world * n,), 99, dtype=dtype) for _ in range(world)]
            w.run(plan, xs, outs)
            gathered = [torch.full((world * n,), 99, dtype=dtype) for _ in range(world)]
            for r in range(world):
                gathered[r][r * n:(r + 1) * n] = xs[r]
            w.run(plan, [gathered[r][r * n:(r + 1) * n] for r in range(world)], gathered)
            for r in range(world):
                assert torch.equal(outs[r], want_ag), f"all_gather {spec} {algo} n={n} {dtype} rank {r}"
                assert torch.equal(gathered[r], want_ag), f"all_gather in place {spec} {algo} n={n} rank {r}"
            runs += 2
    assert runs > 100
