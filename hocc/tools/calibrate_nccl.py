"""`hocc calibrate --nccl-tests`: fit the GPU cost model to nccl-tests logs.

Each row of a log (op, size, out-of-place time) is priced as NCCL would run
it (hocc.plan.nccl_native, the fastest algorithm and protocol) on the log's
cluster: its hosts and GPUs from the log's '# Using devices' lines, its NICs
and link rates from --topology (default: one NIC per GPU, an NVSwitch, H100
links). The fit adjusts, in log space, by the same damped Gauss-Newton as
`hocc calibrate` does for hocc-bench results: the call's base latency
(launch), the host-tier and NIC hop latencies, and the NVLink, NIC and NVLS
efficiencies; the stated line rates stay. The result is a topology file
(links and a 'cost' section) that `hocc plan --backend nccl` and
HOCC_TOPOLOGY read.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from hocc.plan.cost import CostParams
from hocc.plan.nccl_defaults import NCCL_LINKS, NCCL_PARAMS
from hocc.plan.nccl_native import options
from hocc.tools.nccl_tests_log import ELEM, Run, read_logs
from hocc.topology import LinkModel, Topology, parse_spec, save_file

NAMES = ("launch", "lat.host", "lat.nic", "host_efficiency", "nic_efficiency", "nvls_efficiency")


@dataclass(frozen=True)
class Point:
    op: str
    size: int
    count: int
    elem: int
    seconds: float
    topo: Topology


@dataclass(frozen=True)
class GpuFit:
    params: CostParams
    links: LinkModel
    rms_log: float
    iterations: int

    def predict(self, p: Point) -> float:
        return min(options(p.op, p.topo, p.count, p.elem, self.params, self.links).values())


def default_spec(run: Run) -> str:
    hosts, per = run.shape
    return f"{hosts}x{per}@nics={per},fabric=nvswitch"


def points_of(runs: Sequence[Run], spec: str | None = None, min_bytes: int = 0) -> tuple[list[Point], Topology]:
    """The rows as points on their cluster, and the cluster (of the first run)."""
    out: list[Point] = []
    first: Topology | None = None
    for run in runs:
        topo = parse_spec(spec or default_spec(run), NCCL_LINKS)
        if topo.world_size != run.world:
            raise ValueError(f"--topology {spec!r} has {topo.world_size} ranks but the log ran {run.world}; give "
                             "the cluster the log ran on, e.g. 2x8@nics=8,fabric=nvswitch,nic=400gbit")
        first = first or topo
        assert run.op is not None
        for r in run.rows:
            if r.size < max(min_bytes, 1) or r.time_s <= 0:
                continue
            elem = ELEM[r.dtype]
            count = r.size // elem if run.op == "all_reduce" else r.size // elem // run.world
            if count:
                out.append(Point(run.op, r.size, count, elem, r.time_s, topo))
    if not out or first is None:
        raise ValueError("no rows to fit (all below --min-bytes?)")
    return out, first


def _unpack(x: np.ndarray, base: CostParams, links: LinkModel) -> tuple[CostParams, LinkModel]:
    v = dict(zip(NAMES, np.exp(x).tolist(), strict=True))
    params = replace(base, launch=v["launch"], host_efficiency=v["host_efficiency"],
                     nic_efficiency=v["nic_efficiency"], nvls_efficiency=v["nvls_efficiency"])
    links = links.with_tier("host", replace(links.host, latency=v["lat.host"]))
    links = links.with_tier("nic", replace(links.nic, latency=v["lat.nic"]))
    return params, links


def fit(points: Sequence[Point], start: CostParams = NCCL_PARAMS, links: LinkModel | None = None,
        iterations: int = 80, prior: float = 0.02) -> GpuFit:
    """Least squares on log(predicted / measured) (Levenberg-Marquardt in log
    parameters, a weak pull towards the start for what the rows hardly see).
    `links`: the rates the rows ran at (default: the first point's topology's)."""
    links = links or points[0].topo.links
    x0 = np.log([start.launch, links.host.latency, links.nic.latency, start.host_efficiency,
                 start.nic_efficiency, max(start.nvls_efficiency, 1e-3)])
    meas = np.log([p.seconds for p in points])

    def residuals(x: np.ndarray) -> np.ndarray:
        params, lk = _unpack(x, start, links)
        pred = np.log([min(options(p.op, p.topo, p.count, p.elem, params, lk).values()) for p in points])
        return np.concatenate([pred - meas, prior * (x - x0)])

    x, r, lam, it = x0.copy(), residuals(x0), 1e-2, 0
    for it in range(1, iterations + 1):  # noqa: B007 - reported
        jac = np.empty((len(r), len(x)))
        for j in range(len(x)):
            xp = x.copy()
            xp[j] += 1e-4
            jac[:, j] = (residuals(xp) - r) / 1e-4
        g, a = jac.T @ r, jac.T @ jac
        step = np.zeros_like(x)
        improved = False
        for _ in range(10):
            step = np.clip(np.linalg.solve(a + lam * np.diag(np.diag(a) + 1e-9), -g), -2.0, 2.0)
            r_new = residuals(x + step)
            if r_new @ r_new < r @ r:
                x, r, lam, improved = x + step, r_new, max(lam / 3, 1e-7), True
                break
            lam *= 4
        if not improved or np.abs(step).max() < 1e-6:
            break
    params, lk = _unpack(x, start, links)
    n = len(points)
    return GpuFit(params, lk, math.sqrt(float(np.mean(r[:n] ** 2))), it)


def run(a: argparse.Namespace) -> int:
    from hocc.bench.sizes import parse_size

    runs = read_logs(a.results, getattr(a, "op", None))
    points, topo = points_of(runs, a.topology, parse_size(a.min_bytes))
    start = GpuFit(NCCL_PARAMS, topo.links, 0.0, 0)
    before = math.sqrt(sum(math.log(start.predict(p) / p.seconds) ** 2 for p in points) / len(points))
    result = fit(points)
    ops = sorted({p.op for p in points})
    print(f"# {len(runs)} nccl-tests run(s), {len(points)} rows ({', '.join(ops)}) on {topo.shape()} "
          f"({a.topology or default_spec(runs[0]) + ' (assumed: pass --topology)'})")
    print(f"# rms log error: defaults {before:.3f}, fitted {result.rms_log:.3f} ({result.iterations} iterations)")
    p = result.params
    print(f"#   launch {p.launch * 1e6:.1f} us; hop latency host {result.links.host.latency * 1e6:.2f} us, "
          f"nic {result.links.nic.latency * 1e6:.2f} us")
    print(f"#   efficiency host {p.host_efficiency:.3f}, nic {p.nic_efficiency:.3f}, nvls {p.nvls_efficiency:.3f}")
    print(f"# {'op':<15}{'size':>12}{'measured us':>14}{'predicted us':>14}")
    for pt in points:
        print(f"  {pt.op:<15}{pt.size:>12}{pt.seconds * 1e6:>14.1f}{result.predict(pt) * 1e6:>14.1f}")
    if a.output:
        out = Topology(topo.host_infos(), result.links)
        out.cost = result.params.to_dict()
        save_file(out, a.output)
        print(f"# wrote {a.output}; use it as HOCC_TOPOLOGY={a.output} or hocc plan {a.output} --backend nccl")
    return 0
