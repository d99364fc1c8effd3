"""One entry per collective, as nccl-tests has one file each: how a size maps
to per-rank counts, the input data, the expected result, and the bus-bandwidth
factor (docs/algorithms.md)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

import hocc
from hocc.plan.volumes import bus_factor

OP_NAMES = {"sum": dist.ReduceOp.SUM, "prod": dist.ReduceOp.PRODUCT, "min": dist.ReduceOp.MIN,
            "max": dist.ReduceOp.MAX, "avg": dist.ReduceOp.AVG}


CHECK_CHUNK = 1 << 18  # elements compared at a time: the check's memory stays a few MiB at any size


def value(rank: int, n: int, dtype: torch.dtype, start: int = 0) -> torch.Tensor:
    """Elements start..start+n of `rank`'s data: small integers, exact in
    every dtype and under every op for 8+ ranks. They repeat every 5, so the
    tensor is built by repeating 5 values (no int64 temporaries of n)."""
    period = ((torch.arange(start, start + 5, dtype=torch.int64) * 3 + rank * 7) % 5 + 1).to(dtype)
    return period.repeat((n + 4) // 5)[:n]


def reduce_ref(tensors: list[torch.Tensor], op: str) -> torch.Tensor:
    """The exact reduction of `tensors` by op name ('sum', 'avg', 'prod' or 'product', 'min', 'max'), in
    float64: the reference every check of a result is made against (the suite, hocc-bench, the GPU check)."""
    x = torch.stack([t.double() for t in tensors])
    if op == "sum":
        return x.sum(0)
    if op == "avg":
        return x.mean(0)
    if op in ("prod", "product"):
        return x.prod(0)
    if op == "min":
        return x.min(0).values
    return x.max(0).values


def reference(collective: str, ins: list[torch.Tensor], op: str = "sum") -> list[torch.Tensor]:
    """Each rank's exact result of `collective` over the ranks' inputs `ins` (reductions in float64; a
    reduce_scatter's input is the ranks' equal parts in rank order, an all_gather's output their concatenation)."""
    world = len(ins)
    if collective == "all_gather":
        return [torch.cat(ins)] * world
    total = reduce_ref(ins, op)
    if collective == "all_reduce":
        return [total] * world
    n = total.numel() // max(world, 1)
    return [total[r * n:(r + 1) * n] for r in range(world)]


@dataclass(frozen=True)
class BenchCollective:
    name: str
    reduces: bool

    def counts(self, size: int, elem: int, world: int) -> tuple[int, int]:
        """(elements per rank in, out) for a buffer of `size` bytes (nccl-tests' size column)."""
        total = size // elem
        if self.name == "all_reduce":
            return total, total
        per = total // world
        return (per, per * world) if self.name == "all_gather" else (per * world, per)

    def buffers(self, size: int, dtype: torch.dtype, world: int, rank: int,
                device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        elem = torch.empty(0, dtype=dtype).element_size()
        n_in, n_out = self.counts(size, elem, world)
        inp = value(rank, n_in, dtype).to(device)
        out = inp if self.name == "all_reduce" else torch.empty(n_out, dtype=dtype, device=device)
        return inp, out

    def launch(self, inp: torch.Tensor, out: torch.Tensor, op: str, algo: str, async_op: bool = False) -> object:
        rop = OP_NAMES[op]
        if self.name == "all_reduce":
            return hocc.all_reduce(inp, op=rop, async_op=async_op, algo=algo)
        if self.name == "all_gather":
            return hocc.all_gather_single(out, inp, async_op=async_op, algo=algo)
        return hocc.reduce_scatter_single(out, inp, op=rop, async_op=async_op, algo=algo)

    def wrong(self, out: torch.Tensor, op: str, world: int, rank: int) -> int:
        """Elements of `out` that differ from the expected result (after one
        call on fresh inputs from `buffers`), compared a chunk at a time: the
        expected values of every rank at once, in float64, would be 16 times
        the output (3 GB per rank at 64 MiB on 8 ranks)."""
        n = out.numel()
        flat = out.detach().reshape(-1)
        per = n // world if world else 0
        wrong = 0
        for start in range(0, n, CHECK_CHUNK):
            stop = min(n, start + CHECK_CHUNK)
            if self.name == "all_reduce":
                want = reduce_ref([value(r, stop - start, out.dtype, start) for r in range(world)], op)
            elif self.name == "all_gather":
                parts = []  # output element k is element k % per of rank k // per
                k = start
                while k < stop:
                    r, off = divmod(k, per)
                    take = min(stop - k, per - off)
                    parts.append(value(r, take, out.dtype, off).double())
                    k += take
                want = torch.cat(parts)
            else:
                want = reduce_ref([value(r, stop - start, out.dtype, rank * n + start) for r in range(world)], op)
            wrong += self._differ(flat[start:stop].cpu().double(), want, out.dtype)
        return wrong

    @staticmethod
    def _differ(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> int:
        want = want.to(dtype).double()  # the dtype's own rounding of the exact answer
        tol = 1e-2 if dtype in (torch.float16, torch.bfloat16) else 1e-6
        return int((~torch.isclose(got, want, rtol=tol, atol=tol)).sum().item())


COLLECTIVES: dict[str, BenchCollective] = {
    "all_reduce": BenchCollective("all_reduce", True),
    "all_gather": BenchCollective("all_gather", False),
    "reduce_scatter": BenchCollective("reduce_scatter", True),
}


def bandwidths(collective: str, size: int, seconds: float, world: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s for `size` bytes in `seconds` (nccl-tests' definitions)."""
    if seconds <= 0:
        return 0.0, 0.0
    algbw = size / seconds / 1e9
    return algbw, algbw * bus_factor(collective, world)
