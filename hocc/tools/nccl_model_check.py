"""The GPU cost model against bench/published_nccl_tests.py, as numbers:
each figure's predicted busbw (one set of defaults for every row, each
transport's hop latency), the acceptance targets, and the calibration check
(fit on one cluster's 2-node rows only, predict its 4 and 8 node rows). Pure
model evaluation, no GPU; bench/gpu_report.py writes it up and
tests/test_nccl_published.py holds it to the targets."""

from __future__ import annotations

from dataclasses import dataclass, replace

from hocc.plan.cost import CostParams
from hocc.plan.nccl_defaults import NCCL_PARAMS, links_for
from hocc.plan.nccl_native import predict_nccl
from hocc.plan.volumes import bus_factor
from hocc.tools.calibrate_nccl import GpuFit, Point, fit
from hocc.tools.plan_cli import per_rank_count
from hocc.tools.published_nccl_tests import CALIBRATION_CLUSTER, FIGURES, Figure
from hocc.topology import LinkModel, parse_spec

MIB = 1 << 20
CARRY_FROM = 128 * MIB  # the calibration check's sizes: 128 MiB and up


def predicted_busbw(f: Figure, params: CostParams = NCCL_PARAMS, links: LinkModel | None = None) -> tuple[str, float]:
    """The model's pick and busbw (GB/s) for a figure's cluster, its transport's hop latency included."""
    topo = parse_spec(f.spec, links or links_for(f.transport))
    w = topo.world_size
    algo, secs = predict_nccl(f.op, topo, per_rank_count(f.op, f.size, 4, w), 4, replace(params, **f.over))  # type: ignore[arg-type]  # f.over: CostParams fields
    return algo, f.size / secs * bus_factor(f.op, w) / 1e9


def within_target(f: Figure, ratio: float) -> bool:
    """Within 20% at 64 MiB and up, within a factor of 2 at 1 MiB and below."""
    return 0.8 <= ratio <= 1.2 if f.size >= 64 * MIB else 0.5 <= ratio <= 2.0


def hit_rates() -> dict[str, tuple[int, int]]:
    """'big' (64 MiB and up) and 'small' (1 MiB and below): (rows within target, rows)."""
    out = {"big": [0, 0], "small": [0, 0]}
    for f in FIGURES:
        key = "big" if f.size >= 64 * MIB else "small"
        out[key][0] += within_target(f, predicted_busbw(f)[1] / f.busbw)
        out[key][1] += 1
    return {k: (v[0], v[1]) for k, v in out.items()}


def hosts(f: Figure) -> int:
    return len(parse_spec(f.spec).host_infos())


def _point(f: Figure) -> Point:
    topo = parse_spec(f.spec, links_for(f.transport))
    w = topo.world_size
    seconds = f.size * bus_factor(f.op, w) / (f.busbw * 1e9)
    return Point(f.op, f.size, per_rank_count(f.op, f.size, 4, w), 4, seconds, topo)


@dataclass(frozen=True)
class Carried:
    """The calibration check: the fit on the 2-node rows and, per other row, (figure, predicted busbw)."""

    fitted: GpuFit
    fit_rows: list[Figure]
    predicted: list[tuple[Figure, float]]


def calibration_carries(cluster: str = CALIBRATION_CLUSTER) -> Carried:
    """Fit the model (hocc calibrate --nccl-tests's fit) to `cluster`'s 2-node
    rows only, then predict its other rows of CARRY_FROM and up."""
    rows = [f for f in FIGURES if f.cluster == cluster]
    fit_rows = [f for f in rows if hosts(f) == 2]
    first = parse_spec(fit_rows[0].spec, links_for(fit_rows[0].transport))
    fitted = fit([_point(f) for f in fit_rows], links=first.links)
    others = [f for f in rows if hosts(f) > 2 and f.size >= CARRY_FROM]
    return Carried(fitted, fit_rows,
                   [(f, predicted_busbw(f, fitted.params, fitted.links)[1]) for f in others])
