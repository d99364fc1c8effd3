"""Arrays of other libraries in the drop-in calls (hocc.api.dlpack), on the
CPU with NumPy arrays (NumPy has __dlpack__), in a spawned gloo world: every
collective, list forms and async ones, against torch.distributed's own
result, in place in the caller's array; bad arrays raise before any byte
moves and leave the arrays as they were. bench/gpu_check.py runs CuPy arrays
through the same calls on the GPU."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.distributed as dist

import hocc
from tests.cases import OP_BY_NAME
from tests.worlds import run_world

SIZES = (0, 1, 7, 1031)
# every op somewhere, not every op everywhere (tests/test_collectives.py sweeps them on tensors)
OPS_OF = {np.float32: ("sum", "avg", "max", "min", "product"), np.float64: ("sum", "avg"),
          np.int32: ("sum", "product", "max"), np.int64: ("sum", "min")}
DTYPES = tuple(OPS_OF)


def values(rank: int, n: int, dtype: type, op: str, salt: int) -> np.ndarray:
    rng = np.random.default_rng(1000 * salt + rank)
    lo, hi = (1, 3) if op == "product" else (-5, 6)
    return rng.integers(lo, hi, n).astype(dtype)


def torch_all_reduce(x: np.ndarray, op: str, world: int) -> np.ndarray:
    """torch.distributed's result (gloo has no AVG: SUM, then divided)."""
    t = torch.from_numpy(x.copy())
    dist.all_reduce(t, OP_BY_NAME["sum" if op == "avg" else op])
    if op == "avg":
        t = t / world
    return t.numpy()


def check_collectives(rank: int, world: int) -> int:
    cases = 0
    for dtype in DTYPES:
        for op in OPS_OF[dtype]:
            for n in SIZES:
                x = values(rank, n, dtype, op, n)
                want = torch_all_reduce(x, op, world)
                buf = x.copy()
                assert hocc.all_reduce(buf, OP_BY_NAME[op]) is None
                np.testing.assert_allclose(buf, want, rtol=1e-6, err_msg=f"all_reduce {dtype} {op} n={n}")
                cases += 1
        for n in SIZES:
            x = values(rank, n, dtype, "sum", n + 1)
            # all_gather_into_tensor: the result lands in the caller's output array
            out = np.full(n * world, 99, dtype=dtype)
            want = torch.empty(n * world, dtype=torch.from_numpy(x).dtype)
            dist.all_gather_into_tensor(want, torch.from_numpy(x.copy()))
            hocc.all_gather_into_tensor(out, x)
            np.testing.assert_array_equal(out, want.numpy(), err_msg=f"all_gather {dtype} n={n}")
            # reduce_scatter_tensor, into a NumPy output
            big = values(rank, n * world, dtype, "sum", n + 2)
            rs_want = torch_all_reduce(big, "sum", world)[rank * n:(rank + 1) * n]
            rs_out = np.full(n, 99, dtype=dtype)
            hocc.reduce_scatter_tensor(rs_out, big)
            np.testing.assert_array_equal(rs_out, rs_want, err_msg=f"reduce_scatter {dtype} n={n}")
            cases += 2
    return cases


def check_forms(rank: int, world: int) -> None:
    n = 13
    # 2-D arrays, async: wait() and the caller's array holds the result
    x = values(rank, 4 * n, np.float32, "sum", 7).reshape(4, n)
    want = torch_all_reduce(x, "sum", world)
    work = hocc.all_reduce(x, async_op=True)
    assert work is not None and work.wait()
    np.testing.assert_array_equal(x, want)
    # list forms with NumPy arrays in the lists
    mine = values(rank, n, np.int64, "sum", 8)
    gathered = [np.zeros(n, np.int64) for _ in range(world)]
    hocc.all_gather(gathered, mine)
    ref = [torch.zeros(n, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(ref, torch.from_numpy(mine.copy()))
    for got, exp in zip(gathered, ref, strict=True):
        np.testing.assert_array_equal(got, exp.numpy())
    parts = [values(rank, n, np.float64, "sum", 9 + r) for r in range(world)]
    out = np.zeros(n, np.float64)
    hocc.reduce_scatter(out, parts)
    np.testing.assert_array_equal(out, torch_all_reduce(np.concatenate(parts), "sum", world)[rank * n:(rank + 1) * n])
    # a NumPy output with a torch input, and a read-only input (only read)
    ro = values(rank, n, np.float32, "sum", 10)
    ro.flags.writeable = False
    out32 = np.zeros(n * world, np.float32)
    hocc.all_gather_into_tensor(out32, torch.from_numpy(ro.copy()))
    hocc.all_gather_into_tensor(out32, ro)
    want32 = torch.empty(n * world)
    dist.all_gather_into_tensor(want32, torch.from_numpy(ro.copy()))
    np.testing.assert_array_equal(out32, want32.numpy())


def check_bad_arrays(rank: int, world: int) -> None:
    """Every rank makes the same bad call: each raises before communicating, arrays unchanged."""
    ints = values(rank, 9, np.int32, "sum", 11)
    kept = ints.copy()
    with pytest.raises(hocc.HoccError, match="unsupported reduction op"):
        hocc.all_reduce(ints, dist.ReduceOp.BAND)
    np.testing.assert_array_equal(ints, kept)
    out = np.full(5, 7, np.int32)
    with pytest.raises(hocc.HoccError, match="output_tensor has 5 elements"):
        hocc.all_gather_into_tensor(out, ints)
    np.testing.assert_array_equal(out, np.full(5, 7, np.int32))
    base = values(rank, 20, np.float32, "sum", 12)
    kept = base.copy()
    with pytest.raises(hocc.HoccError, match=r"non-contiguous numpy\.ndarray.*ascontiguousarray"):
        hocc.all_reduce(base[::2])
    np.testing.assert_array_equal(base, kept)
    frozen = base.copy()
    frozen.flags.writeable = False
    with pytest.raises(hocc.HoccError, match=r"read-only numpy\.ndarray"):
        hocc.all_reduce(frozen)
    np.testing.assert_array_equal(frozen, kept)
    with pytest.raises(hocc.HoccError, match=r"dtype torch\.bool"):
        hocc.all_reduce(np.ones(3, dtype=bool))
    with pytest.raises(hocc.HoccError, match=r"tensor_list\[1\] has 3 elements"):
        hocc.all_gather([np.zeros(4, np.float32), np.zeros(3, np.float32), np.zeros(4, np.float32)],
                        np.zeros(4, np.float32))


def _body(rank: int, world: int) -> None:
    assert check_collectives(rank, world) > 70
    check_forms(rank, world)
    check_bad_arrays(rank, world)
    # the group still works after the refused calls
    x = np.full(3, rank + 1, np.float32)
    hocc.all_reduce(x)
    np.testing.assert_array_equal(x, np.full(3, world * (world + 1) / 2, np.float32))


@pytest.mark.slow
def test_numpy_arrays_in_the_drop_in_calls() -> None:
    run_world(3, _body, env={"HOCC_TOPOLOGY": "3"})
