"""HO-Ring's stages on a GPU are NCCL calls on sub-communicators, so under
NCCL's costs they pay what hocc.plan.nccl_native charges NCCL's own calls
(pipeline fill, transport latency, handshakes): the same collective costs the
same on both sides, and a fill NCCL pays shows up in HO-Ring's price too.
Pure model evaluation."""

from __future__ import annotations

from dataclasses import replace

import pytest

from hocc.plan.cost import CostParams
from hocc.plan.nccl_defaults import NCCL_LINKS, NCCL_PARAMS, links_for
from hocc.plan.nccl_native import Summary, call_seconds, predict_nccl
from hocc.plan.planner import PlannerConfig, choose, predict_all, price_ho_ring
from hocc.topology import Topology, uniform, with_nics

MIB = 1 << 20
NO_FILL = replace(NCCL_PARAMS, pipeline_window=0.0)


def h100(hosts: int, gbit: int = 400) -> Topology:
    """DGX-H100-like hosts: 8 GPUs on an NVSwitch, 8 InfiniBand rail NICs."""
    nic = replace(NCCL_LINKS.nic, bandwidth=gbit * 1e9 / 8)
    return with_nics(uniform(hosts, 8, 1, links=links_for("IB", NCCL_LINKS.with_tier("nic", nic))), 8, "nvswitch")


def ho_ring_seconds(op: str, topo: Topology, nbytes: int, chunks: int, params: CostParams = NCCL_PARAMS) -> float:
    cfg = PlannerConfig(chunks=chunks, params=params)
    count = nbytes // 4 // (1 if op == "all_reduce" else topo.world_size)
    priced = price_ho_ring(op, topo, count, 4, cfg, chunks)
    assert priced is not None
    return priced[1].evaluate(topo.links, cfg.params)


@pytest.mark.parametrize("op", ["all_reduce", "all_gather"])
@pytest.mark.parametrize("nbytes", [64 << 10, 16 * MIB, 1 << 30])
def test_on_one_host_ho_ring_is_nccls_own_call_plus_its_copies(op: str, nbytes: int) -> None:
    """One host: HO-Ring is one native step over the whole host, the very call
    NCCL runs, so it costs NCCL's prediction plus HO-Ring's packing copies."""
    topo = h100(1)
    count = nbytes // 4 // (1 if op == "all_reduce" else topo.world_size)
    cfg = PlannerConfig(chunks=1, params=NCCL_PARAMS)
    priced = price_ho_ring(op, topo, count, 4, cfg, 1)
    assert priced is not None
    ho = priced[1].evaluate(topo.links, NCCL_PARAMS)
    copies = priced[1].copy_bytes / NCCL_PARAMS.copy_bandwidth
    assert ho == pytest.approx(predict_nccl(op, topo, count, 4, NCCL_PARAMS)[1] + copies, rel=1e-9)


def test_ho_ring_pays_the_fill_of_each_of_its_nccl_calls() -> None:
    """4 hosts, 64 MiB all-reduce in one chunk: a host reduce-scatter, a rail
    all-reduce (one GPU and one of 8 NICs per host), a host all-gather. Turning
    the pipeline window on must raise HO-Ring's time by what it raises those
    three calls' (as NCCL would run each); without the fill on HO-Ring's side
    it would not move at all."""
    topo, s = h100(4), 64 * MIB
    host = Summary(world=8, hosts=1, per_host=8, nics=8, switches=1, nvswitch=True)
    rail = Summary(world=4, hosts=4, per_host=1, nics=1, switches=1, nvswitch=True, channel_share=1 / 8)
    calls = [("reduce_scatter", host, s / 8), ("all_reduce", rail, s / 8), ("all_gather", host, s / 8)]

    def fill(op: str, sm: Summary, count: float) -> float:
        links = topo.links
        return call_seconds(op, sm, count, 1, NCCL_PARAMS, links) - call_seconds(op, sm, count, 1, NO_FILL, links)

    expected = sum(fill(*c) for c in calls)
    with_fill, without = ho_ring_seconds("all_reduce", topo, s, 1), ho_ring_seconds("all_reduce", topo, s, 1, NO_FILL)
    assert expected > 0.1 * with_fill  # the fill matters at this size, so forgetting it shows
    assert with_fill - without == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("chunks", [1, 4])
def test_the_fill_raises_ho_ring_as_it_raises_nccl(chunks: int) -> None:
    """Whatever the pipeline depth, NCCL's fill makes HO-Ring slower, never
    free: at 16 MiB on 4 hosts the window costs HO-Ring at least a tenth of
    what it costs NCCL's own all-reduce."""
    topo, s = h100(4), 16 * MIB
    count = s // 4
    nccl_gain = predict_nccl("all_reduce", topo, count, 4, NCCL_PARAMS)[1] - \
        predict_nccl("all_reduce", topo, count, 4, NO_FILL)[1]
    ho_gain = ho_ring_seconds("all_reduce", topo, s, chunks) - ho_ring_seconds("all_reduce", topo, s, chunks, NO_FILL)
    assert nccl_gain > 0 and ho_gain >= 0.1 * nccl_gain


@pytest.mark.parametrize("gbit", [200, 400])
def test_auto_keeps_nccl_for_a_two_host_all_reduce(gbit: int) -> None:
    """On 2 H100 hosts NCCL runs NVLS or a tree that HO-Ring's rings cannot
    beat at any size once both pay the same per-call costs (the asymmetric
    model had ho_ring 1.5-1.9x faster at 4-16 MiB, so auto left NCCL)."""
    topo = h100(2, gbit)
    cfg = PlannerConfig(params=NCCL_PARAMS)
    for nbytes in (MIB, 4 * MIB, 16 * MIB, 64 * MIB, 1 << 30):
        preds = predict_all("all_reduce", nbytes // 4, 4, topo, cfg)
        assert choose(preds, cfg, "all_reduce") == "native", (nbytes, preds)
