"""PaRO-DP on one rank, every strategy against plain training: the check the
suite runs on the CPU (tests/test_paro_one_rank.py) and bench/gpu_check.sh's
paro section runs on a GPU, where it is the check of the CUDA ordering of
hocc/paro/moves.py: the worker thread's moves run on a stream of their own,
ordered against the caller's stream by events.

On one rank every scope move is a copy (and the step's mean a division by
one), so a wrong order between the caller's stream and the worker's shows as
a wrong result, not as noise. To make such a race likely, the caller's
stream is kept busy before each backward and each optimizer step
(`busy`), so the host runs far ahead of the device; and one case runs the
whole loop on a stream of the caller's own, not the default one.

The model ties its output head to its embedding (the root owns both), has
blocks that are units of their own, and trains with gradient accumulation
(no_sync), clipping and AdamW."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

import torch
from torch import nn

from hocc.paro import all_strategies, paro_shard

VOCAB, DIM, BLOCKS, STEPS, MICRO = 512, 128, 3, 3, 2


class TiedLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.LayerNorm(DIM), nn.Linear(DIM, 4 * DIM), nn.GELU(), nn.Linear(4 * DIM, DIM))
            for _ in range(BLOCKS))
        self.head = nn.Linear(DIM, VOCAB, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.emb(ids)
        for b in self.blocks:
            x = x + b(x)
        out: torch.Tensor = self.head(x)
        return out


def _model(device: str) -> TiedLM:
    torch.manual_seed(0)
    return TiedLM().to(device)


def _train(model: nn.Module, device: str, busy: Callable[[], None], sharded: bool) -> None:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    gen = torch.Generator(device=device).manual_seed(1)
    for _ in range(STEPS):
        for micro in range(MICRO):
            ids = torch.randint(0, VOCAB, (4, 16), generator=gen, device=device)
            last = micro == MICRO - 1
            ctx = model.no_sync() if sharded and not last else nullcontext()  # type: ignore[operator]
            with ctx:
                loss = nn.functional.cross_entropy(model(ids).reshape(-1, VOCAB), ids.reshape(-1)) / MICRO
                busy()
                loss.backward()
        busy()
        if sharded:
            model.clip_grad_norm_(1.0)  # type: ignore[operator]
        else:
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()


def _busy(device: str) -> Callable[[], None]:
    """Queue about 5 ms of waiting on the current stream (CUDA), nothing on the CPU."""
    if not device.startswith("cuda"):
        return lambda: None
    torch.cuda.synchronize()
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(1_000_000)
    end.record()
    end.synchronize()
    cycles = int(1_000_000 * 5.0 / max(start.elapsed_time(end), 1e-3))  # elapsed_time is in ms
    return lambda: torch.cuda._sleep(cycles)


def check(device: str, strategies: list[str] | None = None, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Every strategy (and, on CUDA, IIG on a stream of the caller's own)
    after STEPS steps against plain training of the same model; needs a
    torch.distributed world of one. Returns ok, failures and a one-line summary."""
    busy = _busy(device)
    ref = _model(device)
    _train(ref, device, busy, sharded=False)
    want = {k: v.detach().float().cpu() for k, v in ref.state_dict().items()}
    cases: list[tuple[str, str, dict[str, Any]]] = [(s, s, {}) for s in (strategies or all_strategies())]
    if device.startswith("cuda"):
        cases.append(("IIG on a stream of the caller's own", "IIG", {"stream": True}))
    failures: list[str] = []
    for label, strategy, how in cases:
        model = _model(device)
        for b in model.blocks:
            paro_shard(b, strategy)
        paro_shard(model, strategy)
        stream = torch.cuda.Stream() if how.get("stream") else None
        with torch.cuda.stream(stream) if stream is not None else nullcontext():
            _train(model, device, busy, sharded=True)
            got = model.paro_state_dict()  # type: ignore[operator]
        if stream is not None:
            stream.synchronize()
        tol = 1e-4
        worst = max(((g.float().cpu() - want[k]).abs().max().item() / (want[k].abs().max().item() + 1e-12), k)
                    for k, g in got.items())
        same_names = list(got) == list(want)
        line = f"{label}: worst relative difference {worst[0]:.2e} ({worst[1]})"
        if worst[0] > tol or not same_names:
            failures.append(line + ("" if same_names else "; names differ from the plain model's"))
        log(("ok   " if worst[0] <= tol and same_names else "FAIL ") + line)
    n = len(cases)
    return {"cases": n, "failures": failures, "ok": not failures,
            "summary": f"{n - len(failures)} of {n} equal to plain training after {STEPS} steps "
                       f"(accumulation, clipping, AdamW, tied head)"}
