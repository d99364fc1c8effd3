"""PaRO checkpoints on spawned gloo worlds: a model trained under one strategy
on 2x4 ranks, saved with torch.distributed.checkpoint (DTensors, each rank its
torch.chunk of every parameter, with no ShardedTensor's deprecation warning)
and loaded under another strategy, holds the same parameters and, after one
more step, still the same (the optimizer state moved too); saved on 8 ranks
and loaded on 4 (2x2), parameters and optimizer state are the saved ones under
every strategy, and the next step is an unwrapped model's from the same state;
plain torch reads it (dcp.load into an unwrapped model, dcp_to_torch_save,
FSDP2's fully_shard with its optimizer), and PaRO reads FSDP2's; a checkpoint
of the ShardedTensor form hocc wrote before still loads; a full state dict of
an unwrapped model loads into a wrapped one. Without ranks: checkpoint.py
imports no ShardedTensor, and the checkpoint's G owners match the layout's."""

from __future__ import annotations

import ast
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

from hocc.paro import all_strategies
from tests.worlds import run_world

RTOL, ATOL = 1e-5, 1e-6
# (saved under, loaded under) on 2x4: from each optimizer scope, to I and G (N: from 2x4 to 2x2 below)
PAIRS = [("IIG", "GGG"), ("NNG", "III"), ("NNN", "IGG"), ("III", "NIG")]


class Block(nn.Module):
    def __init__(self, n_in: int, n_out: int) -> None:
        super().__init__()
        self.lin = nn.Linear(n_in, n_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.lin(x))


class Net(nn.Module):
    """Three block units (104, 154, 108 parameters) and a root with a BatchNorm (buffers) and a head
    (68): none a multiple of 8 or 4, and the head's bias lies in one rank's G shard."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.blocks = nn.ModuleList([Block(7, 13), Block(13, 11), Block(11, 9)])
        self.norm = nn.BatchNorm1d(9)
        self.head = nn.Linear(9, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        out: torch.Tensor = self.head(self.norm(x))
        return out


def wrap(strategy: str, seed: int = 0) -> Any:
    """On hocc's collectives, paro_shard's default."""
    from hocc.paro import paro_shard

    net = Net(seed)
    for b in net.blocks:
        paro_shard(b, strategy)
    return paro_shard(net, strategy)


def adamw(model: nn.Module, lr: float) -> torch.optim.Optimizer:
    """Two parameter groups by name (no weight decay on biases)."""
    named = list(model.named_parameters())
    return torch.optim.AdamW([{"params": [p for n, p in named if not n.endswith("bias")], "weight_decay": 0.1},
                              {"params": [p for n, p in named if n.endswith("bias")], "weight_decay": 0.0}], lr=lr)


def train(model: nn.Module, opt: torch.optim.Optimizer, rank: int, steps: range) -> None:
    for s in steps:
        gen = torch.Generator().manual_seed(1000 * s + rank)
        x, y = torch.randn(6, 7, generator=gen), torch.randn(6, 5, generator=gen)
        torch.autograd.backward(nn.functional.mse_loss(model(x), y))
        opt.step()
        opt.zero_grad()


def assert_equal(what: str, got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert set(got) == set(want), (what, sorted(set(got) ^ set(want)))
    for k, v in want.items():
        assert torch.equal(got[k], v), f"{what}: {k} differs by {(got[k].double() - v.double()).abs().max()}"


def rank0_buffers(full: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`full` with its buffers as rank 0 has them: what a checkpoint holds (each rank's BatchNorm
    statistics are of its own batches until the next forward takes rank 0's)."""
    for k in ("norm.running_mean", "norm.running_var", "norm.num_batches_tracked"):
        dist.broadcast(full[k], 0)
    return full


def full_optim(model: Any, opt: torch.optim.Optimizer) -> dict[str, Any]:
    """Every parameter's optimizer state whole (per-element states assembled from every rank's
    DTensor chunks, in the parameter's shape), and the groups' learning rates: to compare across
    worlds."""
    from torch.distributed.tensor import DTensor

    from hocc.paro.checkpoint import optim_state_dict

    sd = optim_state_dict(model, opt)
    out: dict[str, Any] = {"lr": [g["lr"] for g in sd["param_groups"]]}
    for name, st in sd["state"].items():
        for key, v in st.items():
            out[f"{name}.{key}"] = v.full_tensor() if isinstance(v, DTensor) else v
    return out


def _check_shards(rank: int, world: int, model: Any, opt: torch.optim.Optimizer) -> None:
    """Each parameter a DTensor in its own shape, Shard(0) over the world, whose local tensor is
    this rank's torch.chunk of the whole (empty past the last chunk: head.bias has 5 rows for 8
    ranks), and its optimizer states the same; made by one all_to_all per unit in which a rank
    sends no more than its G block."""
    from torch.distributed.tensor import DTensor, Shard

    from hocc.paro.checkpoint import full_state_dict, optim_state_dict, sharded_state_dict

    units = model.paro_units()
    before = len(units[0].moves.trace)
    sd, full = sharded_state_dict(model), rank0_buffers(full_state_dict(model))
    sent = [t for t in list(units[0].moves.trace)[before:] if t.op == "all_to_all"]
    assert len(sent) == len(units) and all(t.elems <= u.layout.block for t, u in zip(sent, units, strict=True)), sent
    assert set(sd) == set(model.state_dict()), sorted(set(sd) ^ set(model.state_dict()))
    for name, v in sd.items():
        if not name.startswith("norm.running") and name != "norm.num_batches_tracked":
            assert isinstance(v, DTensor) and v.placements == (Shard(0),), name
            assert v.shape == full[name].shape and v.device_mesh.mesh.tolist() == list(range(world)), name
            chunks = torch.chunk(full[name], world)
            want = chunks[rank] if rank < len(chunks) else full[name][:0]
            assert torch.equal(v.to_local(), want), name
        else:
            assert torch.equal(v, full[name]), name
    assert sd["head.bias"].to_local().numel() == (rank < 5)
    state = optim_state_dict(model, opt)["state"]["blocks.1.lin.weight"]
    assert isinstance(state["exp_avg"], DTensor) and state["exp_avg"].shape == (11, 13)
    assert not isinstance(state["step"], DTensor) and state["step"].dim() == 0


@contextmanager
def no_sharded_tensor() -> Iterator[None]:
    """Nothing inside warns of ShardedTensor's deprecation (a FutureWarning torch gives for every
    one made): the checkpoint is DTensors."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield
    bad = [f"{w.category.__name__}: {w.message}" for w in caught
           if issubclass(w.category, FutureWarning) or "ShardedTensor" in str(w.message)]
    assert not bad, bad[:3]


def _reshard(rank: int, world: int, root: str) -> None:
    with no_sharded_tensor():
        _reshard_cases(rank, world, root)


def _reshard_cases(rank: int, world: int, root: str) -> None:
    from torch.distributed.checkpoint.state_dict_loader import load as dcp_load  # = dcp.load
    from torch.distributed.checkpoint.state_dict_saver import save as dcp_save  # = dcp.save

    from hocc.paro.checkpoint import (
        full_state_dict,
        load,
        load_optim_state_dict,
        load_sharded_state_dict,
        optim_state_dict,
        save,
        sharded_state_dict,
    )

    for n, (a, b) in enumerate(PAIRS):
        src = wrap(a)
        opt = adamw(src, lr=0.01)
        train(src, opt, rank, range(3))
        path = f"{root}/{a}-{b}"
        dst = wrap(b, seed=1)
        dopt = adamw(dst, lr=0.5)
        if n == 0:  # by hand: dcp into templates the same functions make for the other model
            _check_shards(rank, world, src, opt)
            dcp_save({"model": sharded_state_dict(src), "optim": optim_state_dict(src, opt)}, checkpoint_id=path)
            sd = {"model": sharded_state_dict(dst), "optim": optim_state_dict(dst, dopt)}
            dcp_load(sd, checkpoint_id=path)
            load_sharded_state_dict(dst, sd["model"])
            load_optim_state_dict(dst, dopt, sd["optim"])
        else:
            save(src, opt, path)
            load(dst, dopt, path)
        assert_equal(f"{a} -> {b}", full_state_dict(dst), rank0_buffers(full_state_dict(src)))
        assert [g["lr"] for g in dopt.param_groups] == [0.01, 0.01]
        assert all(float(st["step"]) == 3 for st in dopt.state.values()) and len(dopt.state) == 10
        if n == 0:  # the check below can fail: without the optimizer's state the next step differs
            bare = wrap(b, seed=1)
            load(bare, None, path)
            bopt = adamw(bare, lr=0.01)
            train(bare, bopt, rank, range(3, 4))
        train(src, opt, rank, range(3, 4))
        train(dst, dopt, rank, range(3, 4))
        want, got = full_state_dict(src), full_state_dict(dst)
        for k, v in want.items():
            assert torch.allclose(got[k], v, rtol=RTOL, atol=ATOL), f"{a} -> {b}, a step after loading: {k} differs"
        if n == 0:
            moved = full_state_dict(bare)
            assert not torch.allclose(moved["head.weight"], want["head.weight"], rtol=RTOL, atol=ATOL)
    _save_for_4(rank, root)
    dist.barrier()


def _save_for_4(rank: int, root: str) -> None:
    from hocc.paro.checkpoint import full_state_dict, save

    model = wrap("IIG")
    opt = adamw(model, lr=0.01)
    train(model, opt, rank, range(3))
    save(model, opt, f"{root}/ckpt")
    ref = {"model": rank0_buffers(full_state_dict(model)), "optim": full_optim(model, opt)}
    if rank == 0:
        torch.save(ref, f"{root}/ref.pt")


def plain_twin(ref: dict[str, Any]) -> tuple[Net, torch.optim.Optimizer]:
    """An unwrapped Net and its AdamW holding the saved parameters and optimizer state."""
    net = Net(seed=3)
    net.load_state_dict(ref["model"])
    opt = adamw(net, lr=0.5)
    order = [id(p) for g in opt.param_groups for p in g["params"]]
    names = {id(p): n for n, p in net.named_parameters()}
    sd = opt.state_dict()
    sd["state"] = {i: {k: ref["optim"][f"{names[pid]}.{k}"].clone() for k in ("step", "exp_avg", "exp_avg_sq")}
                   for i, pid in enumerate(order)}
    for g, lr in zip(sd["param_groups"], ref["optim"]["lr"], strict=True):
        g["lr"] = lr
    opt.load_state_dict(sd)
    return net, opt


def plain_step(net: nn.Module, opt: torch.optim.Optimizer, world: int, s: int) -> dict[str, torch.Tensor]:
    """train()'s step `s` on `world` ranks, on one unwrapped model: the mean of the ranks' gradients."""
    for r in range(world):
        gen = torch.Generator().manual_seed(1000 * s + r)
        x, y = torch.randn(6, 7, generator=gen), torch.randn(6, 5, generator=gen)
        (nn.functional.mse_loss(net(x), y) / world).backward()
    opt.step()
    opt.zero_grad()
    return {n: p.detach().clone() for n, p in net.named_parameters()}


def assert_close(what: str, got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    for k, v in want.items():
        assert torch.allclose(got[k], v, rtol=RTOL, atol=ATOL), f"{what}: {k} differs"


def _load_on_4(rank: int, world: int, root: str) -> None:
    with no_sharded_tensor():
        _load_on_4_cases(rank, world, root)


def _load_on_4_cases(rank: int, world: int, root: str) -> None:
    from hocc.paro.checkpoint import full_state_dict, load, load_full_state_dict

    ref = torch.load(f"{root}/ref.pt")
    twin, twin_opt = plain_twin(ref)
    stepped = plain_step(twin, twin_opt, world, 3)  # the saved model's next step on 4 ranks, without DCP
    for strat in [s.name for s in all_strategies()]:  # every strategy loads what 2x4 ranks saved under IIG
        model = wrap(strat, seed=1)
        opt = adamw(model, lr=0.5)
        load(model, opt, f"{root}/ckpt")
        assert_equal(f"8 -> 4 ranks, {strat}: parameters", full_state_dict(model), ref["model"])
        got = full_optim(model, opt)
        assert got.pop("lr") == ref["optim"]["lr"] == [0.01, 0.01]
        assert_equal(f"8 -> 4 ranks, {strat}: optimizer state", got,
                     {k: v for k, v in ref["optim"].items() if k != "lr"})
        if strat in ("NNN", "III", "NGG", "IIG"):  # and it trains on as the unwrapped model does
            train(model, opt, rank, range(3, 4))
            assert_close(f"8 -> 4 ranks, {strat}: a step after loading", full_state_dict(model), stepped)
    _plain_readers(rank, world, root, ref, stepped)
    # a checkpoint hocc wrote before DTensors (ShardedTensors over flattened parameters; 2x4 ranks, IIG)
    old = Path(__file__).parent / "fixtures" / "paro_sharded_tensor_ckpt"
    old_ref = torch.load(old / "ref.pt")
    for strat in ("GGG", "NNN"):
        model = wrap(strat, seed=1)
        opt = adamw(model, lr=0.5)
        load(model, opt, old)
        assert_equal(f"an old checkpoint, {strat}: parameters", full_state_dict(model), old_ref["model"])
        got = full_optim(model, opt)
        assert got.pop("lr") == old_ref["optim"].pop("lr") == [0.01, 0.01]
        assert_equal(f"an old checkpoint, {strat}: optimizer state", got, old_ref["optim"])
        old_ref["optim"]["lr"] = [0.01, 0.01]
    # a full state dict: an unwrapped model's (buffers moved off their defaults) into a wrapped one
    plain = Net(seed=2)
    plain(torch.randn(6, 7))
    plain.eval()
    model = wrap("IIG")
    model.eval()
    x = torch.randn(3, 7, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        before = model(x)
        load_full_state_dict(model, plain.state_dict())
        after, want = model(x), plain(x)
    assert_equal("full state dict", full_state_dict(model), plain.state_dict())
    assert torch.allclose(after, want, rtol=RTOL, atol=ATOL)
    assert not torch.allclose(before, want, rtol=RTOL, atol=ATOL)
    with pytest.raises(RuntimeError, match=r'Missing key\(s\) in state_dict: "head.bias"'):
        load_full_state_dict(model, {k: v for k, v in plain.state_dict().items() if k != "head.bias"})
    dist.barrier()


def _plain_readers(rank: int, world: int, root: str, ref: dict[str, Any], stepped: dict[str, torch.Tensor]) -> None:
    """What 8 ranks saved, read without hocc: dcp.load into an unwrapped model's state_dict();
    dcp_to_torch_save, whose file an unwrapped model's strict load_state_dict takes; and FSDP2
    (fully_shard on 4 ranks), model and optimizer through torch's get/set_state_dict, which then
    steps as the unwrapped model does. And back: what FSDP2 saves, PaRO loads, and FSDP2's
    state_dict() too."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
    from torch.distributed.checkpoint.state_dict_saver import save as dcp_save
    from torch.distributed.fsdp import fully_shard

    from hocc.paro.checkpoint import full_state_dict, load

    plain = Net(seed=3)
    sd = {"model": plain.state_dict()}
    dcp_load(sd, checkpoint_id=f"{root}/ckpt")
    assert_equal("dcp.load into an unwrapped model", plain.state_dict(), ref["model"])
    if rank == 0:
        dcp_to_torch_save(f"{root}/ckpt", f"{root}/ckpt.pt")
        saved = torch.load(f"{root}/ckpt.pt")
        plain = Net(seed=3)
        plain.load_state_dict(saved["model"])  # strict: the names are model.state_dict()'s
        assert_equal("dcp_to_torch_save", plain.state_dict(), ref["model"])
        assert torch.equal(saved["optim"]["state"]["head.weight"]["exp_avg"], ref["optim"]["head.weight.exp_avg"])
    fsdp = Net(seed=3)
    for b in fsdp.blocks:
        fully_shard(b)
    fully_shard(fsdp)
    fopt = adamw(fsdp, lr=0.5)
    msd, osd = get_state_dict(fsdp, fopt)
    dcp_load({"model": msd, "optim": osd}, checkpoint_id=f"{root}/ckpt")
    set_state_dict(fsdp, fopt, model_state_dict=msd, optim_state_dict=osd)
    whole = {n: p.full_tensor() for n, p in fsdp.named_parameters()}
    assert_equal("FSDP2 loads it", whole, {n: v for n, v in ref["model"].items() if n in whole})
    assert [g["lr"] for g in fopt.param_groups] == [0.01, 0.01]
    train(fsdp, fopt, rank, range(3, 4))
    assert_close("FSDP2, a step after loading", {n: p.full_tensor() for n, p in fsdp.named_parameters()}, stepped)
    dcp_save(dict(zip(("model", "optim"), get_state_dict(fsdp, fopt), strict=True)), checkpoint_id=f"{root}/fsdp")
    model = wrap("IIG", seed=4)
    opt = adamw(model, lr=0.5)
    load(model, opt, f"{root}/fsdp")
    assert_equal("FSDP2's checkpoint into PaRO", {k: v for k, v in full_state_dict(model).items() if k in stepped},
                 {n: p.full_tensor() for n, p in fsdp.named_parameters()})
    direct = wrap("GGG", seed=5)  # and FSDP2's DTensors themselves, without DCP
    direct.load_paro_state_dict(fsdp.state_dict())
    assert_equal("FSDP2's state_dict() into PaRO", {k: v for k, v in full_state_dict(direct).items() if k in stepped},
                 {n: p.full_tensor() for n, p in fsdp.named_parameters()})
    got, want = full_optim(model, opt), dict(get_state_dict(fsdp, fopt)[1])
    assert got.pop("lr") == [0.01, 0.01]
    assert_equal("FSDP2's optimizer state into PaRO", got, {f"{n}.{k}": v.full_tensor() if k != "step" else v
                                                           for n, st in want["state"].items() for k, v in st.items()})


@pytest.mark.slow
def test_checkpoint_across_strategies_and_world_sizes(tmp_path: Path) -> None:
    """2x4 ranks: IIG -> GGG (by hand with dcp), NNG -> III, NNN -> IGG, III -> NIG (save / load), and
    IIG saved for 2x2 ranks, where NNN, III and NGG load it; then an unwrapped model's state_dict into
    a wrapped one. Two worlds in one test: starting ranks is most of its time."""
    run_world(8, _reshard, str(tmp_path), env={"HOCC_TOPOLOGY": "2x4"})
    run_world(4, _load_on_4, str(tmp_path), env={"HOCC_TOPOLOGY": "2x2"})


def test_checkpoint_builds_on_dtensor_alone() -> None:
    """checkpoint.py imports nothing of torch.distributed._shard (ShardedTensor, deprecated)."""
    import hocc.paro.checkpoint as ck

    tree = ast.parse(Path(ck.__file__).read_text())
    mods = {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    mods |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert "torch.distributed.tensor" in mods and not [m for m in mods if "_shard" in m], mods
    assert "ShardedTensor" not in vars(ck)


@pytest.mark.parametrize("hosts", [[(0, 1, 2, 3), (4, 5, 6, 7)], [(0, 3), (1, 2)], [(0, 5, 6), (1, 2, 7), (3, 4, 8)]])
def test_shard_owners_follow_the_layout(hosts: list[tuple[int, ...]]) -> None:
    """The rank the checkpoint names as each G block's holder is the one whose ShardLayout puts its G
    range there, also when a rail's rank order is not its hosts' order ((0, 3), (1, 2): rail (2, 3))."""
    from hocc.paro.checkpoint import _rank_of_block
    from hocc.paro.layout import Groups, ShardLayout

    rails = [tuple(sorted(h[pos] for h in hosts)) for pos in range(len(hosts[0]))]
    size = sum(map(len, hosts))
    owner = _rank_of_block(tuple(hosts), tuple(rails))
    for r in range(size):
        g = Groups(None, None, None, hosts, rails, r, size)  # type: ignore[arg-type]
        lay = ShardLayout.of(5 * size - 1, g)
        assert owner[lay.range("G")[0] // lay.block] == r, (hosts, r)
