"""The PaRO guideline without ranks: the memory model's arithmetic, the
communication model's volumes and its pricing by hocc's planner, the ranking,
and `hocc paro advise`."""

from __future__ import annotations

import pytest

from hocc.paro import all_strategies
from hocc.paro.advisor import evaluate
from hocc.paro.comm import comm_per_step, planner_config
from hocc.paro.memory import StateBytes, UnitSize, memory_per_rank, peak_per_rank
from hocc.plan.planner import choose, predict_all
from hocc.tools.cli import main
from hocc.tools.paro_cli import parse_memory
from hocc.topology import parse_spec

P = 7_000_000_000  # a multiple of 8: no padding


def test_memory_model_arithmetic() -> None:
    m = memory_per_rank("NIG", P, 8, 4)
    assert (m.params, m.grads, m.optim) == (2 * P, 2 * P // 4, 12 * P // 8)
    assert memory_per_rank("GGG", P, 8, 4).total == 16 * P // 8
    assert memory_per_rank("NNN", P, 8, 4).total == 16 * P
    # fp32 III: the optimizer's parameters are the parameters themselves (same scope, same dtype)
    assert memory_per_rank("III", P, 8, 4, StateBytes(4, 4, 12)).total == (4 + 4 + 8) * P // 4
    assert memory_per_rank("NIG", P, 8, 4, StateBytes(4, 4, 12)).optim == 12 * P // 8
    assert memory_per_rank("GGG", 13, 8, 4).params == 2 * 2  # 13 elements: blocks of 2


def test_volumes_per_tier() -> None:
    topo = parse_spec("2x4@nic=200mbit")
    es, blk, accum = 2, P // 8, 4
    iig = comm_per_step("IIG", P, topo, accum, es)
    # between hosts only once per step: a rail reduce-scatter and a rail all-gather of one block each
    assert iig.per("micro")["inter_bytes"] == 0
    assert iig.per("step")["inter_bytes"] == 2 * (2 - 1) * blk * es
    assert iig.total("inter_rounds") == 2
    # inside the host, per micro-step: all-gather of the I shard (2 blocks) and reduce-scatter to it
    assert iig.per("micro")["intra_bytes"] == 2 * 3 * 2 * blk * es
    ggg = comm_per_step("GGG", P, topo, accum, es)
    assert ggg.per("micro")["inter_bytes"] == 2 * blk * es  # world all-gather + reduce-scatter, rail stage
    assert ggg.total("inter_bytes") == accum * 2 * blk * es
    assert comm_per_step("NNN", P, topo, accum, es).total("inter_bytes") == pytest.approx(2 * 0.5 * P / 4 * es)


def test_priced_by_the_planner() -> None:
    """A move between scopes G and N is priced as Moves runs it, a rail call then a host call, each
    with the planner's own prediction (an all-reduce over the world: one world call); rails run all
    four at once through one NIC, so each costs more than a lone rail."""
    from hocc.paro.comm import _shared

    topo = parse_spec("2x4@nic=200mbit")
    ggg = comm_per_step("GGG", 8 << 20, topo, 1, 4)
    ag = ggg.items[0]
    assert (ag.coll.op, ag.coll.where) == ("all_gather", "world")
    cfg = planner_config(topo, "gloo")
    rail, rail_cfg = _shared(topo.restrict(topo.rails()[0]), 4, cfg)
    host = topo.restrict(topo.host_groups()[0])
    by_rail = predict_all("all_gather", ag.count, 4, rail, rail_cfg)
    by_host = predict_all("all_gather", ag.count * 2, 4, host, cfg)
    a, b = choose(by_rail, rail_cfg, "all_gather"), choose(by_host, cfg, "all_gather")
    assert ag.algo == f"rail:{a}+host:{b}"
    assert ag.seconds == pytest.approx(by_rail[a].seconds + by_host[b].seconds)
    whole = predict_all("all_gather", ag.count, 4, topo, cfg)
    assert ag.seconds != pytest.approx(min(p.seconds for p in whole.values()))  # not one world call
    ar = next(p for p in comm_per_step("NNN", 8 << 20, topo, 1, 4).items if p.coll.op == "all_reduce")
    preds = predict_all("all_reduce", ar.count, 4, topo, cfg)
    assert ar.algo == choose(preds, cfg, "all_reduce") and ar.seconds == preds[ar.algo].seconds
    rs = next(p for p in comm_per_step("IIG", 8 << 20, topo, 1, 4).items if p.coll.where == "rail")
    lone = topo.restrict(topo.rails()[0])
    lone_preds = predict_all("reduce_scatter", rs.count, 4, lone, planner_config(lone, "gloo"))
    assert rs.seconds > 2 * min(p.seconds for p in lone_preds.values())


def test_ranking_follows_the_paper() -> None:
    """Memory too tight for full replicas: a partially redundant strategy
    beats ZeRO-3 (GGG) on slow NICs, and its edge grows with accumulation.
    Wrapped as one unit, nothing fits: the whole model is gathered at once."""
    topo = parse_spec("2x4@nic=200mbit")
    budget = 5 * P  # bytes per rank: rules out N parameters (14 GB) with unsharded gradients
    units = [P // 1000 // 32] * 32  # 32 blocks: a pass holds a few of them whole
    opts = evaluate(P // 1000, topo, accum=8, memory_budget=budget / 1000, units=units)
    fitting = [o.strategy for o in opts if o.fits]
    assert "NNN" not in fitting and "GGG" in fitting
    assert fitting.index("GGG") > 0 and fitting[0] in ("IIG", "NIG", "ING", "III", "IGG", "GIG")
    edge = [next(o for o in evaluate(P // 1000, topo, accum=a) if o.strategy == "GGG").seconds
            / next(o for o in evaluate(P // 1000, topo, accum=a) if o.strategy == "IIG").seconds for a in (1, 8)]
    assert edge[1] > edge[0]
    assert len(evaluate(1000, topo)) == len(all_strategies())
    assert not any(o.fits for o in evaluate(P // 1000, topo, accum=8, memory_budget=budget / 1000))


def test_advise_cli(capsys: pytest.CaptureFixture[str], tmp_path: object) -> None:
    assert main(["paro", "advise", "--params", "7e9", "--topology", "2x4@nic=200mbit", "--memory", "80GB",
                 "--accum", "8"]) == 0
    out = capsys.readouterr().out
    assert "wins:" in out and "| 1 |" in out and "NNN" in out
    assert main(["paro", "advise", "--params", "7e9", "--topology", "2x4", "--memory", "eighty"]) == 2
    assert "cannot parse memory" in capsys.readouterr().err
    assert main(["paro", "advise", "--params", "7e9", "--topology", "2x4", "--strategies", "NGN"]) == 2
    assert "gradients it does not hold" in capsys.readouterr().err
    assert parse_memory("80GB") == 80e9 and parse_memory("1GiB") == 2 ** 30 and parse_memory("8e10") == 8e10


def test_peak_counts_what_a_pass_gathers() -> None:
    """The peak adds the units a pass holds whole to the sharded states: more
    for smaller parts of a model held at a time, nothing for N parameters."""
    units, root = [P // 32] * 32, 8  # the root: one element per rank
    rest = memory_per_rank("GGG", P, 8, 4)
    peak = peak_per_rank("GGG", units, root, 8, 4)
    assert peak.optim == rest.optim + 12 and peak.params == rest.params + 2 + 2 * (P // 32) * 2 + 8 * 2
    # at the backward of the second unit: its gradients whole, the third's too with the part at G (bf16) its
    # reduction in flight writes, 30 units' results at G in the optimizer's dtype, and the root's whole
    assert peak.grads == 2 * (P // 32) * 2 + (P // 32 // 8) * 2 + 30 * (P // 32 // 8) * 4 + 8 * 2
    coarse = peak_per_rank("GGG", [P // 4] * 4, root, 8, 4)
    assert coarse.total > peak.total
    assert peak_per_rank("NNN", units, root, 8, 4).params == memory_per_rank("NNN", P + 8, 8, 4).params


def test_frozen_weights_keep_a_unit_whole_and_hold_no_optimizer_state() -> None:
    """LoRA-like units (a tenth of each trains): every unit stays gathered from its backward to the end
    of backward, so the last backward holds all 32 whole; optimizer states only for the trainable tenth
    (as many as one rank's G part can take)."""
    u, root = P // 32, 8
    rest = memory_per_rank("GGG", P, 8, 4)
    lora = peak_per_rank("GGG", [UnitSize(u, u // 10)] * 32, root, 8, 4)
    assert lora.params == rest.params + 2 + 32 * u * 2 + root * 2
    assert lora.optim == rest.optim + 12 - 32 * 8 * (u // 8 - u // 10)
    plain = peak_per_rank("GGG", [u] * 32, root, 8, 4)
    assert plain == peak_per_rank("GGG", [UnitSize(u)] * 32, root, 8, 4) == peak_per_rank(
        "GGG", [UnitSize(u, u)] * 32, root, 8, 4)
    assert lora.params > plain.params and lora.optim < plain.optim


def test_advise_with_units_and_compute(capsys: pytest.CaptureFixture[str], tmp_path: object) -> None:
    assert main(["paro", "advise", "--params", "7e9", "--units", "32", "--topology", "2x4@nic=200mbit",
                 "--memory", "80GB", "--accum", "8", "--compute-ms", "500"]) == 0
    out = capsys.readouterr().out
    assert "peak GB" in out and "compute overlapped" in out
    # with compute slower than every micro-step's communication, the step time is the compute and the step's part
    opts = evaluate(7_000_000, parse_spec("2x4@nic=200mbit"), accum=4, units=[1_000_000] * 7, compute_s=100.0)
    assert all(o.seconds == pytest.approx(400.0 + o.comm.per("step")["seconds"]) for o in opts)
    # with no overlap (ranks that share their cores with their communication) compute and communication add
    added = evaluate(7_000_000, parse_spec("2x4@nic=200mbit"), accum=4, units=[1_000_000] * 7, compute_s=100.0,
                     overlap=0.0)
    assert all(o.seconds == pytest.approx(4 * (100.0 + o.comm.per("micro")["seconds"]) + o.comm.per("step")["seconds"])
               for o in added)
    with pytest.raises(ValueError, match="overlap is a share"):
        evaluate(7_000_000, parse_spec("2x4"), overlap=1.5)
    model = tmp_path / "m.py"  # type: ignore[operator]
    model.write_text("from torch import nn\n"
                     "def build(frozen=False):\n"
                     "    blocks = nn.ModuleList([nn.Linear(10, 10) for _ in range(4)])\n"
                     "    for b in blocks:\n"
                     "        b.weight.requires_grad_(not frozen)\n"
                     "    return nn.Sequential(blocks, nn.Linear(10, 2))\n"
                     "def build_frozen():\n"
                     "    return build(frozen=True)\n")
    for fn, says in (("build", "462 parameters in"), ("build_frozen", "462 parameters (62 trainable) in")):
        assert main(["paro", "advise", "--model", f"{model}:{fn}", "--topology", "2x4", "--json", "-"]) == 0
        assert says in capsys.readouterr().out
    from hocc.tools.paro_cli import model_units
    assert model_units(f"{model}:build_frozen") == (462, 62, [UnitSize(110, 10)] * 4)
