"""PaRO-DP on models whose output head reuses the embedding's weight, as
every GPT-style model does: a small tied model of our own and transformers'
GPT-2 (a tiny config, random weights, nothing downloaded), on a spawned 2x2
gloo world over hocc's collectives (paro_shard's default). Under all 14
strategies each trains equal to DDP; its paro_state_dict() has every name of
a plain model's state_dict(), the tied ones included, and loads into a plain
model with torch's strict load_state_dict; a plain model's state_dict() loads
back into a wrapped one; torch's strict rules hold (a missing alias or an
extra key raises, strict=False reports them); GPT-2's save_pretrained /
from_pretrained round trip goes through paro_state_dict; and the tied model's
DCP checkpoint saved under IIG loads under GGG and trains on equal, and
dcp_to_torch_save makes of it a file a plain model's strict load_state_dict
takes."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

from hocc.paro import all_strategies
from tests.worlds import run_world

TOL = {"rtol": 1e-4, "atol": 1e-5}
STEPS = 2


class TiedNet(nn.Module):
    """An embedding, two blocks and an output head tied to the embedding (the root owns both)."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.emb = nn.Embedding(11, 6)
        self.blocks = nn.ModuleList([nn.Sequential(nn.Linear(6, 6), nn.Tanh()) for _ in range(2)])
        self.head = nn.Linear(6, 11, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.emb(ids)
        for b in self.blocks:
            x = b(x)
        out: torch.Tensor = self.head(x)
        return out


def gpt2(seed: int = 0) -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    cfg = GPT2Config(vocab_size=37, n_positions=16, n_embd=8, n_layer=2, n_head=2, resid_pdrop=0.0,
                     embd_pdrop=0.0, attn_pdrop=0.0)
    model = GPT2LMHeadModel(cfg)
    assert model.lm_head.weight is model.transformer.wte.weight
    return model


def blocks(model: nn.Module) -> list[nn.Module]:
    return list(model.transformer.h) if hasattr(model, "transformer") else list(model.blocks)  # type: ignore[union-attr]


def loss_of(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    if hasattr(model, "transformer") or hasattr(getattr(model, "module", None), "transformer"):
        out: torch.Tensor = model(input_ids=ids, labels=ids).loss
        return out
    logits = model(ids)
    return nn.functional.cross_entropy(logits.reshape(-1, 11), ids.reshape(-1))


def train(model: nn.Module, rank: int, vocab: int, opt: torch.optim.Optimizer | None = None) -> None:
    opt = opt or torch.optim.AdamW(model.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(7 + rank)
    for _ in range(STEPS):
        loss_of(model, torch.randint(0, vocab, (2, 5), generator=gen)).backward()
        opt.step()
        opt.zero_grad()


def wrap(make: Callable[[int], nn.Module], strategy: str, seed: int = 0) -> Any:
    from hocc.paro import paro_shard

    model = make(seed)
    for b in blocks(model):
        paro_shard(b, strategy)
    return paro_shard(model, strategy)


def assert_same(what: str, got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert list(got) == list(want), f"{what}: keys {list(got)} != {list(want)}"
    for k, v in want.items():
        if not torch.allclose(got[k].float(), v.float(), **TOL):  # type: ignore[arg-type]
            raise AssertionError(f"{what}: {k} differs by {(got[k].float() - v.float()).abs().max().item()}")


def _tied(rank: int, world: int, root: str) -> None:
    from torch.nn.parallel import DistributedDataParallel as DDP

    for make, vocab in ((TiedNet, 11), (gpt2, 37)):
        plain = make(0)
        train(DDP(plain), rank, vocab)
        want = plain.state_dict()
        tied = [k for k in want if k in ("head.weight", "lm_head.weight")]
        assert len(tied) == 1, list(want)
        for strat in [s.name for s in all_strategies()]:
            model = wrap(make, strat)
            train(model, rank, vocab)
            got = model.paro_state_dict()
            assert_same(f"{make.__name__} {strat}: paro_state_dict against DDP", got, want)
            fresh = make(1)  # a plain model takes it with torch's strict load_state_dict
            fresh.load_state_dict(got)
            assert_same(f"{make.__name__} {strat}: loaded into a plain model", fresh.state_dict(), want)
            back = wrap(make, strat, seed=2)  # and a plain model's state_dict() loads back
            back.load_paro_state_dict(fresh.state_dict())
            assert_same(f"{make.__name__} {strat}: a plain state_dict loaded back", back.paro_state_dict(), want)
        model = wrap(make, "IIG", seed=3)
        without = {k: v for k, v in want.items() if k != tied[0]}
        with pytest.raises(RuntimeError, match=rf'Missing key\(s\) in state_dict: "{tied[0]}"'):
            model.load_paro_state_dict(without)
        with pytest.raises(RuntimeError, match=r'Unexpected key\(s\) in state_dict: "extra"'):
            model.load_paro_state_dict({**want, "extra": torch.zeros(1)})
        keys = model.load_paro_state_dict({**without, "extra": torch.zeros(1)}, strict=False)
        assert keys.missing_keys == [tied[0]] and keys.unexpected_keys == ["extra"], keys
        assert_same(f"{make.__name__}: strict=False loads the first name of a tied weight", model.paro_state_dict(),
                    want)
        if make is gpt2:
            _pretrained(rank, model, want, root)
    _tied_checkpoint(rank, root)
    dist.barrier()


def _tied_checkpoint(rank: int, root: str) -> None:
    """DCP save under IIG and load under GGG of the tied model, optimizer included: the same parameters
    under both names, and one more step equal on both."""
    from hocc.paro.checkpoint import load, save

    model = wrap(TiedNet, "IIG")
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    train(model, rank, 11, opt)
    save(model, opt, f"{root}/tied-ckpt")
    other = wrap(TiedNet, "GGG", seed=5)
    other_opt = torch.optim.AdamW(other.parameters(), lr=0.01)
    load(other, other_opt, f"{root}/tied-ckpt")
    saved = model.paro_state_dict()
    assert_same("tied, DCP IIG -> GGG", other.paro_state_dict(), saved)
    if rank == 0:  # read without hocc: both names of the tied weight, as a plain model's strict load takes them
        from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

        dcp_to_torch_save(f"{root}/tied-ckpt", f"{root}/tied.pt")
        plain = TiedNet(seed=6)
        plain.load_state_dict(torch.load(f"{root}/tied.pt")["model"])
        assert plain.head.weight is plain.emb.weight
        assert_same("tied, dcp_to_torch_save", plain.state_dict(), saved)
    train(model, rank, 11, opt)
    train(other, rank, 11, other_opt)
    assert_same("tied, DCP IIG -> GGG, then a step", other.paro_state_dict(), model.paro_state_dict())


def _pretrained(rank: int, model: Any, want: dict[str, torch.Tensor], root: str) -> None:
    """save_pretrained(state_dict=paro_state_dict()) on rank 0, from_pretrained on every rank, and
    the loaded model's state_dict() back into a wrapped one."""
    from transformers import GPT2LMHeadModel

    sd = model.paro_state_dict()
    if rank == 0:
        model.save_pretrained(Path(root, "gpt2"), state_dict=sd)
    dist.barrier()
    loaded = GPT2LMHeadModel.from_pretrained(Path(root, "gpt2"))
    assert loaded.lm_head.weight is loaded.transformer.wte.weight
    assert_same("from_pretrained", loaded.state_dict(), want)
    again = wrap(gpt2, "GGG", seed=4)
    again.load_paro_state_dict(loaded.state_dict())
    assert_same("from_pretrained, loaded into a wrapped model", again.paro_state_dict(), want)


@pytest.mark.slow
def test_tied_weights_round_trip_under_every_strategy(tmp_path: Path) -> None:
    run_world(4, _tied, str(tmp_path), env={"HOCC_TOPOLOGY": "2x2"})
