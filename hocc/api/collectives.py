"""Drop-in collectives: torch.distributed's signatures and semantics, plus
`algo` ('auto', 'native', 'ring', 'ho_ring'). Thin: validate, then hand the
call to the group's engine (hocc.engine.engine.Engine.run). Arrays of other
libraries (CuPy, NumPy) go through DLPack (hocc.api.dlpack); a call on a
stream being captured into a CUDA graph raises (hocc.api.capture).

A sync call of a shape its engine has prepared runs from C++ before anything
here (run_known, hocc.api.repeat): each tensor call's first line, so that a
repeated call makes no Python frame but that function's. The full way
(validation, DLPack, the engine) is the `_full` function beside it."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist

from hocc.api import validate as v
from hocc.api.capture import check_not_capturing
from hocc.api.dlpack import accepts_arrays
from hocc.api.repeat import ALL_GATHER, ALL_REDUCE, REDUCE_SCATTER, learn, run_known
from hocc.config import get_config
from hocc.engine.engine import Engine
from hocc.engine.group_engines import get_engine
from hocc.engine.work import Work, copy_out
from hocc.executor.cpp_form import dtype_name
from hocc.plan.types import Plan

ReduceOp = dist.ReduceOp


def _engine(group: dist.ProcessGroup, device: torch.device, refresh: bool = True) -> Engine:
    """The group's engine, made again first if the engine settings changed (refresh; hocc.config)."""
    return get_engine(group, device, get_config(), refresh)


def all_reduce(tensor: torch.Tensor, op: object = ReduceOp.SUM, group: dist.ProcessGroup | None = None,
               async_op: bool = False, *, algo: str | None = None) -> Work | None:
    """Reduce `tensor` across the group, in place on every rank."""
    if not async_op and run_known(ALL_REDUCE, tensor, tensor, op, group, algo):
        return None
    return _all_reduce_full(tensor, op, group, async_op, algo=algo)


@accepts_arrays("tensor", name="all_reduce")
def _all_reduce_full(tensor: torch.Tensor, op: object, group: dist.ProcessGroup | None, async_op: bool, *,
                     algo: str | None) -> Work | None:
    fn = "all_reduce"
    g = v.resolve_group(group, fn)
    v.check_tensor(tensor, "tensor", fn)
    name = v.check_op(op, fn)
    v.check_algo(algo or get_config().algo, fn)
    check_not_capturing(tensor, fn)
    eng = _engine(g, tensor.device)
    work = eng.run("all_reduce", tensor, tensor, name, algo, async_op)
    if not async_op:
        learn("all_reduce", tensor, tensor, op, group, algo, eng, name)
    return work


def all_gather_into_tensor(output_tensor: torch.Tensor, input_tensor: torch.Tensor,
                           group: dist.ProcessGroup | None = None, async_op: bool = False, *,
                           algo: str | None = None) -> Work | None:
    """Gather every rank's `input_tensor` into `output_tensor`, by group rank."""
    if not async_op and run_known(ALL_GATHER, input_tensor, output_tensor, None, group, algo):
        return None
    return _all_gather_full(output_tensor, input_tensor, group, async_op, algo=algo)


@accepts_arrays("output_tensor", name="all_gather_into_tensor")
def _all_gather_full(output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: dist.ProcessGroup | None,
                     async_op: bool, *, algo: str | None) -> Work | None:
    fn = "all_gather_into_tensor"
    g = v.resolve_group(group, fn)
    v.check_tensor(output_tensor, "output_tensor", fn)
    v.check_tensor(input_tensor, "input_tensor", fn)
    v.check_same([output_tensor, input_tensor], ["output_tensor", "input_tensor"], fn)
    v.check_sizes(output_tensor, input_tensor.numel() * dist.get_world_size(g), "output_tensor", fn)
    v.check_algo(algo or get_config().algo, fn)
    check_not_capturing(input_tensor, fn)
    eng = _engine(g, input_tensor.device)
    work = eng.run("all_gather", input_tensor, output_tensor, "sum", algo, async_op)
    if not async_op:
        learn("all_gather", input_tensor, output_tensor, None, group, algo, eng, "sum")
    return work


def reduce_scatter_tensor(output: torch.Tensor, input: torch.Tensor, op: object = ReduceOp.SUM,
                          group: dist.ProcessGroup | None = None, async_op: bool = False, *,
                          algo: str | None = None) -> Work | None:
    """Reduce `input` (world blocks) across the group; rank r gets block r in `output`."""
    if not async_op and run_known(REDUCE_SCATTER, input, output, op, group, algo):
        return None
    return _reduce_scatter_full(output, input, op, group, async_op, algo=algo)


@accepts_arrays("output", name="reduce_scatter_tensor")
def _reduce_scatter_full(output: torch.Tensor, input: torch.Tensor, op: object, group: dist.ProcessGroup | None,
                         async_op: bool, *, algo: str | None) -> Work | None:
    fn = "reduce_scatter_tensor"
    g = v.resolve_group(group, fn)
    v.check_tensor(output, "output", fn)
    v.check_tensor(input, "input", fn)
    v.check_same([output, input], ["output", "input"], fn)
    v.check_sizes(input, output.numel() * dist.get_world_size(g), "input", fn)
    name = v.check_op(op, fn)
    v.check_algo(algo or get_config().algo, fn)
    check_not_capturing(input, fn)
    eng = _engine(g, input.device)
    work = eng.run("reduce_scatter", input, output, name, algo, async_op)
    if not async_op:
        learn("reduce_scatter", input, output, op, group, algo, eng, name)
    return work


@accepts_arrays("tensor_list")
def all_gather(tensor_list: list[torch.Tensor], tensor: torch.Tensor, group: dist.ProcessGroup | None = None,
               async_op: bool = False, *, algo: str | None = None) -> Work | None:
    """List form of all_gather_into_tensor: tensor_list[r] receives rank r's tensor."""
    fn = "all_gather"
    g = v.resolve_group(group, fn)
    v.check_tensor(tensor, "tensor", fn)
    _check_list(tensor_list, tensor, dist.get_world_size(g), "tensor_list", fn)
    flat = torch.empty(tensor.numel() * len(tensor_list), dtype=tensor.dtype, device=tensor.device)
    work = all_gather_into_tensor(flat, tensor, group=g, async_op=True, algo=algo)
    assert work is not None
    return _then(work, lambda: copy_out(flat, tensor_list), tensor_list, async_op)


@accepts_arrays("output")
def reduce_scatter(output: torch.Tensor, input_list: list[torch.Tensor], op: object = ReduceOp.SUM,
                   group: dist.ProcessGroup | None = None, async_op: bool = False, *,
                   algo: str | None = None) -> Work | None:
    """List form of reduce_scatter_tensor: rank r gets the reduction of every rank's input_list[r]."""
    fn = "reduce_scatter"
    g = v.resolve_group(group, fn)
    v.check_tensor(output, "output", fn)
    _check_list(input_list, output, dist.get_world_size(g), "input_list", fn)
    flat = torch.cat([t.reshape(-1) for t in input_list]) if input_list else output.new_empty(0)
    work = reduce_scatter_tensor(output, flat, op=op, group=g, async_op=True, algo=algo)
    assert work is not None
    return _then(work, lambda: None, [output], async_op)


def all_gather_single(output_tensor: torch.Tensor, input_tensor: torch.Tensor,
                      group: dist.ProcessGroup | None = None, async_op: bool = False, *,
                      algo: str | None = None) -> Work | None:
    """torch 2.13's preferred name for all_gather_into_tensor."""
    if not async_op and run_known(ALL_GATHER, input_tensor, output_tensor, None, group, algo):
        return None
    return _all_gather_full(output_tensor, input_tensor, group, async_op, algo=algo)


def reduce_scatter_single(output: torch.Tensor, input: torch.Tensor, op: object = ReduceOp.SUM,
                          group: dist.ProcessGroup | None = None, async_op: bool = False, *,
                          algo: str | None = None) -> Work | None:
    """torch 2.13's preferred name for reduce_scatter_tensor."""
    if not async_op and run_known(REDUCE_SCATTER, input, output, op, group, algo):
        return None
    return _reduce_scatter_full(output, input, op, group, async_op, algo=algo)


def plan_for(collective: str, tensor: torch.Tensor, group: dist.ProcessGroup | None = None,
             algo: str | None = None) -> Plan:
    """The plan hocc would run for `collective` on `tensor` (per-rank count: the
    all_reduce tensor, the all_gather input, the reduce_scatter output)."""
    g = v.resolve_group(group, "plan_for")
    cfg = get_config()
    algo = v.check_algo(algo if algo is not None else cfg.algo, "plan_for")
    return _engine(g, tensor.device).plan(collective, tensor.numel(), tensor.element_size(), algo, cfg,
                                          dtype_name(tensor.dtype))


def last_plan(group: dist.ProcessGroup | None = None, device: str = "cpu") -> Plan | None:
    """The plan of this rank's latest call on `group` (None before any)."""
    g = v.resolve_group(group, "last_plan")
    return _engine(g, torch.device(device), refresh=False).last_plan  # the latest call's, whatever the settings now


# -- helpers -----------------------------------------------------------------
def _check_list(tensors: list[torch.Tensor], like: torch.Tensor, world: int, what: str, fn: str) -> None:
    if not isinstance(tensors, (list, tuple)) or len(tensors) != world:
        got = len(tensors) if isinstance(tensors, (list, tuple)) else type(tensors).__name__
        raise v.HoccError(f"hocc.{fn}: {what} must be a list of {world} tensors (one per rank), got {got}")
    for i, t in enumerate(tensors):
        v.check_tensor(t, f"{what}[{i}]", fn)
        v.check_same([like, t], ["tensor", f"{what}[{i}]"], fn)
        if t.numel() != like.numel():
            raise v.HoccError(f"hocc.{fn}: {what}[{i}] has {t.numel()} elements, expected {like.numel()} "
                              "like the other tensor; hocc needs equal sizes")


def _then(work: Work, after: Callable[[], None], result: list[torch.Tensor], async_op: bool) -> Work | None:
    """A Work that runs `after` once `work` finished."""
    out = work.then(after, result)
    if async_op:
        return out
    out.wait()
    return None
