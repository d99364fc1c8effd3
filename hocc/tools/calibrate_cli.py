"""`hocc calibrate`: fit the cost model's per-tier latency and bandwidth (and
launch, ring-hop, copy costs and the backend's per-op factors) to hocc-bench
JSON results, and write a topology file HOCC_TOPOLOGY and `hocc plan` accept.

    hocc calibrate bench/results/*.json --one-machine -o calibrated.json --topology 2x4@nic=200mbit
    HOCC_TOPOLOGY=calibrated.json hocc-bench ...      # auto now plans with the fitted model
    hocc calibrate --nccl-tests all_reduce.log all_gather.log --topology 2x8@nics=8,fabric=nvswitch,nic=400gbit \
        -o gpu.json                                   # GPU costs from nccl-tests logs (hocc.tools.calibrate_nccl)
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict

from hocc.bench.sizes import parse_size
from hocc.plan.calibrate import LAUNCH_RETRIES, Fit, Sample, calibrate, calibrated_topology, load_samples
from hocc.topology import parse_spec, save_file


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("results", nargs="+", help="hocc-bench --json files (their meta names the topology)")
    p.add_argument("-o", "--output", help="write the calibrated topology file here")
    p.add_argument("--topology", help="the topology the file describes (default: the first result's)")
    p.add_argument("--one-machine", action="store_true",
                   help="the hosts were emulated on one machine (bench/cluster.py): also fit the rate its CPUs "
                        "forward NIC traffic at")
    p.add_argument("--min-bytes", default="0", help="fit only rows of at least this size")
    p.add_argument("--fit-json", help="also write the fitted parameters and per-row predictions as JSON")
    p.add_argument("--nccl-tests", action="store_true",
                   help="the files are nccl-tests logs (all_reduce_perf, all_gather_perf, reduce_scatter_perf): "
                        "fit the GPU costs of what NCCL runs; --topology then names the cluster they ran on")
    p.add_argument("--op", choices=("all_reduce", "reduce_scatter", "all_gather"),
                   help="with --nccl-tests: the collective, where a log does not say")


def accuracy(fit: Fit, samples: list[Sample], min_bytes: int = 1 << 20) -> dict[str, tuple[int, int]]:
    """Per scenario: (rows within 25% of measured, rows) at sizes >= min_bytes."""
    out: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for s in samples:
        if s.size < min_bytes:
            continue
        ok = abs(fit.predict(s) / s.seconds - 1) <= 0.25
        out[s.scenario][0] += ok
        out[s.scenario][1] += 1
    return {k: (v[0], v[1]) for k, v in out.items()}


def run(a: argparse.Namespace) -> int:
    if getattr(a, "nccl_tests", False):
        from hocc.tools import calibrate_nccl

        return calibrate_nccl.run(a)
    samples = [s for s in load_samples(a.results) if s.size >= parse_size(a.min_bytes)]
    fit = calibrate(samples, one_machine=a.one_machine, launch_retries=LAUNCH_RETRIES)
    print(f"# fitted on {len(samples)} rows in {fit.iterations} iterations; rms log error {fit.rms_log:.3f}")
    for t, eff in fit.efficiency.items():
        print(f"#   {t:<6} bandwidth x{eff:.3f} of the stated rate, latency {fit.latency[t] * 1e6:.1f} us")
    for k, v in fit.params.to_dict().items():
        print(f"#   {k}: {v}")
    acc = accuracy(fit, samples)
    total = [sum(v[0] for v in acc.values()), sum(v[1] for v in acc.values())]
    for name, (ok, n) in sorted(acc.items()):
        print(f"# {name}: {ok}/{n} rows >= 1 MiB predicted within 25%")
    if total[1]:
        print(f"# all: {total[0]}/{total[1]} ({total[0] / total[1]:.0%})")
    if a.output:
        target = parse_spec(a.topology) if a.topology else samples[0].topo
        save_file(calibrated_topology(fit, target), a.output)
        print(f"# wrote {a.output} ({target.shape()}); use it as HOCC_TOPOLOGY={a.output} or hocc plan {a.output}")
    if a.fit_json:
        rows = [{"scenario": s.scenario, "op": s.op, "size": s.size, "algo": s.algo, "chunks": s.chunks,
                 "measured_s": s.seconds, "predicted_s": fit.predict(s)} for s in samples]
        with open(a.fit_json, "w") as f:
            json.dump({"fit": fit.to_dict(), "rows": rows}, f, indent=1)
    return 0
