"""The cost model fitted to hocc-bench results (what `hocc calibrate` and auto's CPU tuning run).

Each measured row (scenario, op, size, algorithm) is priced by the plan that
ran: native and ring are fixed plans; ho_ring's pipeline depth K is the one the
engine picked when it ran (the uncalibrated model's pick, which is what the
bench's processes used). The fit adjusts, in log space, by damped Gauss-Newton
(Levenberg-Marquardt) on log(predicted / measured):

  per tier (host, nic, trunk): a bandwidth efficiency (fitted bandwidth =
    efficiency x the rate the scenario's topology states) and a latency (s);
  launch, ring_step, shm_barrier, copy_bandwidth (CostParams);
  per native op class ('native:all_reduce', ...): a byte factor, how much
    slower than a plain ring the backend's own collective moves data.

Parameters no measurement touches (no trunk in the data, say) keep their
starting values. The result writes a topology file (hosts, fitted links and a
'cost' section) that HOCC_TOPOLOGY and `hocc plan` read.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from hocc.plan.cost import CostParams, PlanCost, compile_plan
from hocc.plan.planner import PlannerConfig
from hocc.plan.policy import CPU_RING_OPS, CUDA_MIN_CHUNK_BYTES
from hocc.plan.registry import CPU_MIN_CHUNK_BYTES, algorithm, names
from hocc.topology import TIERS, LinkModel, Topology, parse_spec

OLD_MIN_CHUNK_BYTES = 512 * 1024  # the pipeline floor of runs whose JSON meta predates recording it

ELEM = {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2, "int8": 1, "uint8": 1, "int32": 4, "int64": 8}
NATIVE_CLASSES = ("native:all_reduce", "native:reduce_scatter", "native:all_gather")


@dataclass
class Sample:
    """One measured point and the compiled plan that ran."""

    scenario: str
    topo: Topology
    op: str
    size: int
    algo: str
    seconds: float
    cost: PlanCost
    chunks: int = 1


def planner_for(device: str, recorded: dict[str, Any] | None = None) -> PlannerConfig:
    """What the engine ran with: the planner settings hocc-bench recorded in
    its JSON meta ("planner"), else the defaults of files from before it did
    (gloo's ring ops on CPU, host stages on the network, no chunk cap). Files
    from before the pipeline floor was recorded ran with 512 KiB (the CPU's
    floor until 2026-12-07); where nothing is recorded, the device's floor."""
    floor = CPU_MIN_CHUNK_BYTES if device == "cpu" else CUDA_MIN_CHUNK_BYTES
    cfg = PlannerConfig(ring_ops=CPU_RING_OPS if device == "cpu" else (), min_chunk_bytes=floor)
    if recorded:
        cfg = PlannerConfig(ring_ops=tuple(recorded.get("ring_ops", cfg.ring_ops)),
                            host_impl=recorded.get("host_impl", ""),
                            max_chunk_bytes=recorded.get("max_chunk_bytes"),
                            min_chunk_bytes=recorded.get("min_chunk_bytes", OLD_MIN_CHUNK_BYTES))
    return cfg


def per_rank_count(op: str, size: int, elem: int, world: int) -> int:
    """hocc-bench sizes are the full buffer S; planner counts are per rank."""
    total = size // elem
    return total if op == "all_reduce" else total // world


def price(op: str, algo: str, count: int, elem: int, topo: Topology, cfg: PlannerConfig,
          chunks: int | None = None) -> tuple[PlanCost, int]:
    """The compiled plan of any registered algorithm, and its K: `chunks`, or
    the one its predictor picks with `cfg` (1 for an unchunked one). HO-Ring is
    priced from its one-chunk plan, without building the K-chunk one."""
    alg = algorithm(algo)
    if alg.chunked and chunks is None:
        pred = alg.predict(op, topo, count, elem, cfg)
        if pred is None:
            raise ValueError(f"{algo} does not run on {topo.shape()}: {alg.cannot}")
        chunks = pred.chunks
    if alg.price is not None:
        priced = alg.price(op, topo, count, elem, cfg, chunks or 1)
        if priced is None:
            raise ValueError(f"{algo} does not run on {topo.shape()}: {alg.cannot}")
        return priced[1], priced[0]
    k = chunks if alg.chunked and chunks is not None else 1
    plan = alg.build(op, topo, count, cfg, k)
    if plan is None:
        raise ValueError(f"{algo} does not run on {topo.shape()}: {alg.cannot}")
    return compile_plan(plan, topo, elem), k


def load_samples(paths: Sequence[str | Path], algos: Sequence[str] | None = None,
                 ) -> list[Sample]:
    """Measured rows of hocc-bench JSON files (schema hocc-bench/1) whose
    meta names the topology (HOCC_TOPOLOGY spec); 'auto' rows are skipped
    (they repeat whichever algorithm auto ran); `algos`: these only (default:
    every registered algorithm)."""
    algos = names() if algos is None else algos
    out: list[Sample] = []
    for path in paths:
        doc = json.loads(Path(path).read_text())
        meta = doc.get("meta", {})
        spec = meta.get("topology") or str(meta.get("world", ""))
        if not spec:
            raise ValueError(f"{path}: its meta names no topology; rerun hocc-bench with --topology")
        topo = parse_spec(spec)
        cfg = planner_for(meta.get("device", "cpu"), meta.get("planner"))
        name = Path(path).stem
        for r in doc["results"]:
            if r["algo"] not in algos or r["ran"] != r["algo"]:
                continue
            elem = ELEM.get(r["dtype"], 4)
            count = per_rank_count(r["op"], r["size"], elem, topo.world_size)
            cost, k = price(r["op"], r["algo"], count, elem, topo, cfg)
            out.append(Sample(name, topo, r["op"], r["size"], r["algo"], r["time_us"] * 1e-6, cost, k))
    return out


@dataclass(frozen=True)
class Fit:
    """Fitted model: per-tier bandwidth efficiency and latency, and CostParams.
    `free` names the parameters the data determined."""

    efficiency: dict[str, float]
    latency: dict[str, float]
    params: CostParams
    free: tuple[str, ...] = ()
    rms_log: float = 0.0
    iterations: int = 0

    def links_for(self, nominal: LinkModel) -> LinkModel:
        """A topology's links with the fitted efficiencies and latencies."""
        model = nominal
        for t in TIERS:
            base = nominal.tier(t)
            model = model.with_tier(t, replace(base, bandwidth=base.bandwidth * self.efficiency.get(t, 1.0),
                                               latency=self.latency.get(t, base.latency)))
        return model

    def predict(self, s: Sample) -> float:
        return s.cost.evaluate(self.links_for(s.topo.links), self.params)

    def to_dict(self) -> dict[str, Any]:
        return {"efficiency": self.efficiency, "latency": self.latency, "params": self.params.to_dict(),
                "free": list(self.free), "rms_log": self.rms_log, "iterations": self.iterations}


@dataclass
class _Space:
    """The parameter vector: names, and how to turn a vector into a Fit."""

    names: list[str]
    start: np.ndarray  # log values
    base: Fit = field(repr=False)

    def fit_of(self, x: np.ndarray) -> Fit:
        eff, lat = dict(self.base.efficiency), dict(self.base.latency)
        params = self.base.params
        factors: dict[str, float] = {}
        for name, v in zip(self.names, np.exp(x), strict=True):
            kind, _, what = name.partition(".")
            if kind == "eff":
                eff[what] = float(v)
            elif kind == "lat":
                lat[what] = float(v)
            elif kind == "factor":
                factors[what] = float(v)
            else:
                params = replace(params, **{what: float(v)})  # type: ignore[arg-type]
        return Fit(eff, lat, params.with_factors(factors) if factors else params, tuple(self.names))


def _space(samples: Sequence[Sample], start: Fit, one_machine: bool) -> _Space:
    kinds = {k for s in samples for k in s.cost.kinds.tolist()}
    tiers = [t for i, t in enumerate(TIERS) if i in kinds]
    classes = {c for s in samples for c in s.cost.classes}
    names: list[str] = []
    vals: list[float] = []
    for t in tiers:
        names += [f"eff.{t}", f"lat.{t}"]
        vals += [start.efficiency.get(t, 1.0), start.latency.get(t, LinkModel().tier(t).latency)]
    names.append("param.launch")
    vals.append(start.params.launch)
    if any(c.startswith("ring:") for c in classes):
        names.append("param.ring_step")
        vals.append(start.params.ring_step)
    if any(c.startswith("shm:") for c in classes):
        names.append("param.shm_barrier")
        vals.append(start.params.shm_barrier)
    if any(s.cost.copy_bytes for s in samples):
        names.append("param.copy_bandwidth")
        vals.append(start.params.copy_bandwidth)
    if one_machine:
        names.append("param.machine_bandwidth")
        vals.append(start.params.machine_bandwidth)
    for c in NATIVE_CLASSES:
        if c in classes:
            names.append(f"factor.{c}")
            vals.append(start.params.factor(c))
    return _Space(names, np.log(np.array(vals)), start)


FAR_RMS_LOG = 0.1  # a fit whose predictions miss by about 10% on average
LAUNCH_RETRIES = (1e-4, 1e-3)  # seconds: 10x and 100x CostParams' default


def default_start() -> Fit:
    links = LinkModel()
    return Fit({t: 1.0 for t in TIERS}, {t: links.tier(t).latency for t in TIERS}, CostParams())


def calibrate(samples: Sequence[Sample], start: Fit | None = None, weights: Sequence[float] | None = None,
              iterations: int = 60, prior: float = 0.02, one_machine: bool = False,
              launch_retries: Sequence[float] = ()) -> Fit:
    """Least squares on log(predicted / measured), Levenberg-Marquardt in log
    parameters, with a weak pull (`prior`) towards the start so parameters the
    data hardly sees stay put. `one_machine`: the measured hosts were emulated
    on one machine, so also fit the machine-wide bandwidth they share.
    `launch_retries` (`hocc calibrate` passes LAUNCH_RETRIES): a fit that ends
    far from its data (RMS of the log error over FAR_RMS_LOG) is tried again
    from each of these launch costs, the best kept. A plan's K multiplies its
    per-step costs, so the error is not convex in them, and from the default
    a fit can stop where a per-step cost far above the default's would fit
    (synthetic data at a 2 ms launch: RMS 0.47 from the default, 0.02 from
    0.1 ms). The tuner's refit in a job does not retry: its trial times are
    noisy, and a retry would triple its time for a fit to that noise."""
    if not samples:
        raise ValueError("no measured rows to calibrate from")
    start = start or default_start()
    fit = _calibrate(samples, start, weights, iterations, prior, one_machine)
    if fit.rms_log <= FAR_RMS_LOG or not launch_retries:
        return fit
    retries = [_calibrate(samples, replace(start, params=replace(start.params, launch=launch)), weights,
                          iterations, prior, one_machine) for launch in launch_retries]
    return min([fit, *retries], key=lambda f: f.rms_log)


def _calibrate(samples: Sequence[Sample], start: Fit, weights: Sequence[float] | None,
               iterations: int, prior: float, one_machine: bool) -> Fit:
    if one_machine and not math.isfinite(start.params.machine_bandwidth):  # non-smooth: a few starts
        fits = [_calibrate(samples, replace(start, params=replace(start.params, machine_bandwidth=mb)), weights,
                           iterations, prior, True) for mb in (1e8, 4e8, 1.6e9)]
        return min(fits, key=lambda f: f.rms_log)
    space = _space(samples, start, one_machine)
    meas = np.log(np.array([s.seconds for s in samples]))
    w = np.sqrt(np.asarray(weights, dtype=float)) if weights is not None else np.ones(len(samples))

    def residuals(x: np.ndarray) -> np.ndarray:
        fit = space.fit_of(x)
        pred = np.log(np.array([fit.predict(s) for s in samples]))
        return np.concatenate([(pred - meas) * w, prior * (x - space.start)])

    x = space.start.copy()
    r = residuals(x)
    lam, it = 1e-2, 0
    for it in range(1, iterations + 1):  # noqa: B007 - reported
        h = 1e-4
        jac = np.empty((len(r), len(x)))
        for j in range(len(x)):
            xp = x.copy()
            xp[j] += h
            jac[:, j] = (residuals(xp) - r) / h
        g = jac.T @ r
        a = jac.T @ jac
        improved = False
        for _ in range(10):
            step = np.linalg.solve(a + lam * np.diag(np.diag(a) + 1e-9), -g)
            step = np.clip(step, -2.0, 2.0)
            r_new = residuals(x + step)
            if r_new @ r_new < r @ r:
                x, r = x + step, r_new
                lam = max(lam / 3, 1e-7)
                improved = True
                break
            lam *= 4
        if not improved or np.abs(step).max() < 1e-6:
            break
    fit = space.fit_of(x)
    n = len(samples)
    rms = math.sqrt(float(np.mean((r[:n] / w) ** 2)))
    return replace(fit, rms_log=rms, iterations=it)


def calibrated_topology(fit: Fit, target: Topology) -> Topology:
    """`target` with fitted links and the fitted CostParams as its 'cost' section."""
    topo = Topology(target.host_infos(), fit.links_for(target.links))
    cost = fit.params.to_dict()
    if not cost["op_factors"]:
        del cost["op_factors"]
    topo.cost = cost
    return topo
