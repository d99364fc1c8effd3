"""ParoDP: data parallelism under a PaRO strategy, over hocc's collectives.

The model's parameters become views of one flat buffer (padded to W blocks
of B elements); gradients land in a flat buffer of the same shape (autograd
adds into existing .grad views in place). The optimizer works on a flat fp32
master shard at the optimizer-state scope, so any element-wise optimizer runs
unchanged (SGD, AdamW, ...; not ones that need whole-tensor norms such as
LAMB). Each strategy runs the collectives of `Strategy.schedule()`, in that
order; `trace` records every call made, for tests and for the cost model.

    dp = ParoDP(model, "IIG", lambda ps: torch.optim.AdamW(ps, lr=1e-3))
    for micro in batches:            # gradient accumulation: any number per step
        dp.backward(loss_fn(dp(micro)))
    dp.step()                        # reduce, update, redistribute; zero the gradients

Parameters sharded (p = I or G) are gathered whole once per micro-step, kept
through backward and freed after it (one gather per micro-step: the flat
buffer is the whole model; per-layer gathering, as FSDP does, would gather
twice and hold less). Gradients averaged over ranks, summed over micro-steps
(DDP's result with no_sync accumulation).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

import hocc
from hocc.paro.layout import Groups, block_index, build_groups, intra_groups_of
from hocc.paro.strategy import Strategy, parse

OptimizerFactory = Callable[[list[nn.Parameter]], torch.optim.Optimizer]


def _free(t: torch.Tensor) -> None:
    t.untyped_storage().resize_(0)


def _alloc(t: torch.Tensor) -> None:
    need = t.numel() * t.element_size()
    if t.untyped_storage().nbytes() != need:
        t.untyped_storage().resize_(need)


class ParoDP(nn.Module):
    master: nn.Parameter  # the optimizer's flat fp32 shard at the optimizer-state scope

    def __init__(self, module: nn.Module, strategy: str | Strategy, optimizer: OptimizerFactory, *,
                 intra_groups: Sequence[Sequence[int]] | None = None, mesh: Any = None,
                 mesh_dim: str | int = -1, groups: Groups | None = None,
                 param_dtype: torch.dtype | None = None, comm: str = "hocc", algo: str | None = None) -> None:
        """strategy: 'NIG', 'IIG', ... (hocc/paro/strategy.py). The intra-group
        is the host (hocc's topology) unless `intra_groups` (rank lists) or a
        2-D DeviceMesh and its intra dimension `mesh_dim` say otherwise.
        param_dtype: e.g. torch.bfloat16 for mixed precision (parameters and
        gradients in it, fp32 master and optimizer states). comm: 'hocc' (the
        drop-in calls, `algo` passed on) or 'torch' (torch.distributed's own,
        for comparison). groups: reuse another ParoDP's `.groups` (no new process groups)."""
        super().__init__()
        self.strategy = parse(strategy)
        if comm not in ("hocc", "torch"):
            raise ValueError(f"comm must be 'hocc' or 'torch', got {comm!r}")
        self.module = module
        self.comm, self.algo = comm, algo
        if mesh is not None:
            intra_groups = intra_groups_of(mesh, mesh_dim if mesh_dim != -1 else 1)
        self.groups: Groups = groups if groups is not None else build_groups(intra_groups)
        params = list(module.parameters())
        self._check_params(params)
        g = self.groups
        dtype = param_dtype or params[0].dtype
        self.numel = sum(p.numel() for p in params)
        self.block = -(-self.numel // g.size) if self.numel else 1
        self.padded = self.block * g.size
        self._host_order = block_index(g.host_order())
        self._rail_blocks = block_index(g.rails[g.position])
        self.trace: list[tuple[str, str, str, str, int]] = []  # (op, where, when, state, elements sent in)
        self.micro_steps = 0

        full32 = torch.zeros(self.padded, dtype=torch.float32)
        torch.cat([p.detach().reshape(-1).float() for p in params], out=full32[:self.numel])
        dist.broadcast(full32, 0, group=g.world)  # every replica starts from rank 0's parameters
        self.full = full32.to(dtype) if dtype != torch.float32 else full32.clone()
        self.grad_full = torch.zeros(self.padded, dtype=dtype)
        off = 0
        for p in params:  # parameters and gradients become views of the flat buffers
            n = p.numel()
            p.data = self.full[off:off + n].view_as(p)
            p.grad = self.grad_full[off:off + n].view_as(p)
            off += n
        s = self.strategy
        self.param_shard = self.full if s.params == "N" else self._to_scope(self.full, s.params).clone()
        # the optimizer's own fp32 shard: not registered, so dp.parameters() are the model's
        object.__setattr__(self, "master", nn.Parameter(self._to_scope(full32, s.optim).clone()))
        self.optimizer = optimizer([self.master])
        self.grad_acc = None if s.grads == "N" else torch.zeros(self._scope_elems(s.grads), dtype=dtype)
        del full32
        if s.params != "N":
            _free(self.full)
        if s.grads != "N":
            _free(self.grad_full)
        self._gathered = s.params == "N"

    @staticmethod
    def _check_params(params: list[nn.Parameter]) -> None:
        if not params:
            raise ValueError("ParoDP: the module has no parameters")
        dtypes = {p.dtype for p in params}
        if len(dtypes) != 1 or not params[0].is_floating_point():
            raise ValueError(f"ParoDP needs parameters of one floating dtype, got {sorted(map(str, dtypes))}; "
                             f"cast the module first (module.float()), or pass param_dtype")
        if any(not p.requires_grad for p in params):
            raise ValueError("ParoDP: some parameters do not require grad; frozen parameters are not supported, "
                             "keep them outside the wrapped module")
        if any(p.device.type != "cpu" for p in params) and any(p.device.type == "cpu" for p in params):
            raise ValueError("ParoDP: parameters are on several devices; move the module to one device")
        if params[0].device.type != "cpu":
            raise ValueError("ParoDP runs CPU parameters (gloo) in this version; move the module to the CPU")

    # -- layout helpers ---------------------------------------------------------
    def _scope_elems(self, scope: str) -> int:
        return {"N": self.padded, "I": self.block * self.groups.n_groups, "G": self.block}[scope]

    def _to_scope(self, full: torch.Tensor, scope: str) -> torch.Tensor:
        """This rank's shard of a full flat vector (a view where it is contiguous)."""
        blocks = full.view(self.groups.size, self.block)
        if scope == "N":
            return full
        if scope == "G":
            return blocks[self.groups.rank]
        return blocks.index_select(0, self._rail_blocks).reshape(-1)

    # -- collectives (hocc's drop-in calls, or torch's for comparison) -----------
    def _group(self, where: str) -> dist.ProcessGroup:
        return {"host": self.groups.host, "rail": self.groups.rail, "world": self.groups.world}[where]

    def _all_gather(self, out: torch.Tensor, inp: torch.Tensor, where: str, when: str, state: str) -> None:
        self.trace.append(("all_gather", where, when, state, inp.numel()))
        if self.comm == "torch":
            dist.all_gather_single(out, inp, group=self._group(where))
        else:
            hocc.all_gather_into_tensor(out, inp, group=self._group(where), algo=self.algo)

    def _reduce_scatter(self, out: torch.Tensor, inp: torch.Tensor, where: str, when: str, state: str) -> None:
        self.trace.append(("reduce_scatter", where, when, state, inp.numel()))
        if self.comm == "torch":
            dist.reduce_scatter_single(out, inp, group=self._group(where))
        else:
            hocc.reduce_scatter_tensor(out, inp, group=self._group(where), algo=self.algo)

    def _all_reduce(self, t: torch.Tensor, where: str, when: str, state: str) -> None:
        self.trace.append(("all_reduce", where, when, state, t.numel()))
        if self.comm == "torch":
            dist.all_reduce(t, group=self._group(where))
        else:
            hocc.all_reduce(t, group=self._group(where), algo=self.algo)

    def _host_gather_into_full(self, shard: torch.Tensor, when: str, state: str) -> None:
        """I -> N: the host's I shards, laid out by member, put back in block order."""
        tmp = torch.empty(self.padded, dtype=shard.dtype)
        self._all_gather(tmp, shard, "host", when, state)
        self.full.view(self.groups.size, self.block).index_copy_(0, self._host_order,
                                                                 tmp.view(self.groups.size, self.block))

    def _host_reduce_scatter(self, full: torch.Tensor, when: str) -> torch.Tensor:
        """N -> I: the full gradients, blocks laid out by member, reduced over the host."""
        inp = full.view(self.groups.size, self.block).index_select(0, self._host_order).reshape(-1)
        out = torch.empty(self._scope_elems("I"), dtype=full.dtype)
        self._reduce_scatter(out, inp, "host", when, "grads")
        return out

    # -- training ---------------------------------------------------------------
    def _gather_params(self) -> None:
        if self._gathered:
            return
        _alloc(self.full)
        if self.strategy.params == "I":
            self._host_gather_into_full(self.param_shard, "micro", "params")
        else:
            self._all_gather(self.full, self.param_shard, "world", "micro", "params")
        self._gathered = True

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        self._gather_params()
        if self.strategy.grads != "N" and self.grad_full.untyped_storage().nbytes() == 0:
            _alloc(self.grad_full)
            self.grad_full.zero_()
        return self.module(*args, **kwargs)

    def backward(self, loss: torch.Tensor) -> None:
        """loss.backward(), then this micro-step's gradient reduction (g = I or G)."""
        loss.backward()
        self.micro_step_done()

    def micro_step_done(self) -> None:
        """For callers that run backward themselves: reduce this micro-step's gradients."""
        s = self.strategy
        if s.grads == "I":
            assert self.grad_acc is not None
            self.grad_acc += self._host_reduce_scatter(self.grad_full, "micro")
        elif s.grads == "G":
            assert self.grad_acc is not None
            out = torch.empty(self.block, dtype=self.grad_full.dtype)
            self._reduce_scatter(out, self.grad_full, "world", "micro", "grads")
            self.grad_acc += out
        if s.grads != "N":
            _free(self.grad_full)
        if s.params != "N":
            _free(self.full)
            self._gathered = False
        self.micro_steps += 1

    def _grads_at_optim_scope(self) -> torch.Tensor:
        s = self.strategy
        g, o = s.grads, s.optim
        if g == "N" and o == "N":
            self._all_reduce(self.grad_full, "world", "step", "grads")
            return self.grad_full
        if g == "N" and o == "I":
            out = self._host_reduce_scatter(self.grad_full, "step")
            self._all_reduce(out, "rail", "step", "grads")
            return out
        if g == "N":
            out = torch.empty(self.block, dtype=self.grad_full.dtype)
            self._reduce_scatter(out, self.grad_full, "world", "step", "grads")
            return out
        assert self.grad_acc is not None
        if g == "I" and o == "I":
            self._all_reduce(self.grad_acc, "rail", "step", "grads")
            return self.grad_acc
        if g == "I":
            out = torch.empty(self.block, dtype=self.grad_acc.dtype)
            self._reduce_scatter(out, self.grad_acc, "rail", "step", "grads")
            return out
        return self.grad_acc

    def _redistribute_params(self) -> None:
        s = self.strategy
        p, o = s.params, s.optim
        new = self.master.detach().to(self.full.dtype)
        if p == o:
            self.param_shard.copy_(new)
        elif o == "G" and p == "N":
            self._all_gather(self.full, new, "world", "step", "params")
        elif o == "G":
            self._all_gather(self.param_shard, new, "rail", "step", "params")
        else:  # o == I, p == N
            self._host_gather_into_full(new, "step", "params")

    def step(self) -> None:
        """End of an optimizer step: gradients to the optimizer's scope (mean
        over ranks), the update, parameters back to their scope, gradients zeroed."""
        if self.micro_steps == 0:
            raise RuntimeError("ParoDP.step() before any backward(): run at least one micro-step first")
        grad = self._grads_at_optim_scope()
        self.master.grad = grad.float().div_(self.groups.size)
        self.optimizer.step()
        self.master.grad = None
        self._redistribute_params()
        if self.grad_acc is not None:
            self.grad_acc.zero_()
        else:
            self.grad_full.zero_()
        self.micro_steps = 0

    # -- inspection -------------------------------------------------------------
    def full_parameters(self) -> torch.Tensor:
        """The whole flat parameter vector (unpadded), gathered if sharded; fp32."""
        if self.strategy.params == "N":
            return self.full[:self.numel].float().clone()
        out = torch.empty(self.padded, dtype=self.full.dtype)
        dist.all_gather_into_tensor(out, self.full_shard_at_g(), group=self.groups.world)
        return out[:self.numel].float()

    def full_shard_at_g(self) -> torch.Tensor:
        """This rank's G block of the current parameters (from its p shard)."""
        if self.strategy.params == "G":
            return self.param_shard
        if self.strategy.params == "N":
            return self.full.view(self.groups.size, self.block)[self.groups.rank]
        pos = self.groups.rails[self.groups.position].index(self.groups.rank)
        return self.param_shard.view(-1, self.block)[pos]

    def storage_bytes(self) -> dict[str, int]:
        """Bytes each model state holds now on this rank (distinct storages;
        optimizer: the fp32 master shard and every per-element state tensor;
        scalars such as Adam's step count are left out)."""
        def nbytes(ts: Iterator[torch.Tensor]) -> int:
            seen: dict[int, int] = {}
            for t in ts:
                st = t.untyped_storage()
                seen[st.data_ptr() or id(st)] = st.nbytes()
            return sum(seen.values())

        state = self.optimizer.state.get(self.master, {})
        per_elem = [v for v in state.values() if torch.is_tensor(v) and v.numel() == self.master.numel()]
        return {
            "params": nbytes(iter([self.full, self.param_shard])),
            "grads": nbytes(iter([self.grad_full] + ([self.grad_acc] if self.grad_acc is not None else []))),
            "optim": nbytes(iter([self.master.detach(), *per_elem])),
        }

    @contextmanager
    def gathered(self) -> Iterator[nn.Module]:
        """The module with whole parameters (e.g. for evaluation or saving)."""
        self._gather_params()
        try:
            yield self.module
        finally:
            if self.strategy.params != "N":
                _free(self.full)
                self._gathered = False
