"""`hocc plan`: predicted time and busbw of every algorithm, auto's pick, and
the sizes where the pick changes, for a topology given as a spec, a file, or
synthetic flags (thousands of ranks answer in seconds: see hocc.plan.cost).

    hocc plan 2x4@nic=200mbit --op all -b 64K -e 64M
    hocc plan --hosts 512 --ranks-per-host 8 --switches 8 --nic 400gbit --trunk 1600gbit --backend nccl
    hocc plan --hosts 64 --nics-per-host 8 --fabric nvswitch --nic 400gbit --backend nccl
    hocc plan calibrated.json --op all_reduce --draw plan.png

With --backend nccl the links not given default to an H100 host's
(hocc.plan.nccl_defaults: NVLink 450 GB/s per GPU into an NVSwitch, one 400
Gbit/s NIC per GPU unless --nics-per-host or the spec says otherwise, NCCL-like
hop latencies, the trunk non-blocking), and `native` is what NCCL would run
(rings over all NICs, trees, NVLS: its pick is shown next to its time).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict
from typing import Any

from hocc.bench.sizes import parse_size, sweep
from hocc.plan.cost import CostParams
from hocc.plan.crossover import human
from hocc.plan.nccl_defaults import NCCL_LINKS, NCCL_PARAMS
from hocc.plan.nccl_native import predict_nccl
from hocc.plan.planner import PlannerConfig, Prediction, choose, predict_all
from hocc.plan.policy import device_of, planner_settings
from hocc.plan.registry import algorithm, names
from hocc.plan.types import COLLECTIVES
from hocc.plan.volumes import bus_factor
from hocc.topology import FABRICS, TIERS, Link, Topology, parse_links, parse_spec, uniform, with_nics
from hocc.topology.links import LinkModel

BACKENDS = ("gloo", "nccl")
GPU_PARAMS = NCCL_PARAMS
"""Assumed for --backend nccl without a calibrated file (hocc.plan.nccl_defaults)."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("topology", nargs="?", help="spec ('2x4', '2x2x2@nic=1gbit') or a topology file (.json/.yaml)")
    g = p.add_argument_group("synthetic topology (instead of a spec)")
    g.add_argument("--hosts", type=int, help="number of hosts")
    g.add_argument("--ranks-per-host", type=int, default=8, help="ranks (GPUs) per host (default 8)")
    g.add_argument("--switches", type=int, default=1, help="switches the hosts spread over (default 1)")
    g.add_argument("--placement", choices=("block", "scattered"), default="block")
    g.add_argument("--nics-per-host", type=int, help="NICs per host, ranks split over them in blocks (8 on a "
                   "rail-optimized DGX/HGX H100: one per GPU; --nic is then each NIC's rate; default: 1, with "
                   "--backend nccl one per rank)")
    g.add_argument("--fabric", choices=FABRICS, help="inside a host: one shared link (default) or an NVSwitch "
                   "(each rank its own --host link)")
    for tier in TIERS:
        g.add_argument(f"--{tier}", help=f"{tier} bandwidth, e.g. 200mbit, 25GB (overrides the spec's)")
        g.add_argument(f"--{tier}-latency", help=f"{tier} latency, e.g. 5us")
    p.add_argument("--backend", choices=BACKENDS, default="gloo",
                   help="whose native collectives the plans use (gloo: HO-Ring's host stages as p2p rings, CPU "
                        "testbed costs; nccl: GPU costs, see GPU_PARAMS) unless the topology file has a cost section")
    p.add_argument("--launch", help="seconds per step launch (default: the topology file's, else the CPU testbed's)")
    p.add_argument("--op", default="all_reduce", help="all_reduce, reduce_scatter, all_gather or all")
    p.add_argument("-b", "--minbytes", default="1M", help="smallest size S (full buffer, as hocc-bench)")
    p.add_argument("-e", "--maxbytes", default="1G", help="largest size")
    p.add_argument("-f", "--stepfactor", type=float, default=4.0, help="size step factor (default 4)")
    p.add_argument("--elem-size", type=int, default=4, help="bytes per element (default 4, float32)")
    p.add_argument("--json", metavar="FILE", help="write the predictions as JSON ('-' for stdout)")
    p.add_argument("--draw", metavar="FILE.png", help="draw the topology and the rings of auto's plan")
    p.add_argument("--draw-size", help="size whose plan --draw shows (default: the largest)")


def build_topology(a: argparse.Namespace) -> Topology:
    """From a spec or file, or from --hosts etc.; link and NIC flags override."""
    gpu = getattr(a, "backend", "gloo") == "nccl"
    base = NCCL_LINKS if gpu else None
    if a.hosts:
        if a.topology:
            raise SystemExit("give either a topology spec or --hosts, not both")
        topo = uniform(a.hosts, a.ranks_per_host, a.switches, a.placement, links=base)
    elif a.topology:
        topo = parse_spec(a.topology, base)
    else:
        raise SystemExit("give a topology: a spec such as 2x4, a file, or --hosts N [--ranks-per-host G]")
    items = [f"{t}={getattr(a, t)}" for t in TIERS if getattr(a, t)]
    items += [f"{t}_latency={getattr(a, t + '_latency')}" for t in TIERS
              if getattr(a, t + "_latency")]
    if items:
        cost = topo.cost
        topo = Topology(topo.host_infos(), parse_links(",".join(items), topo.links))
        topo.cost = cost
    nics, fabric = getattr(a, "nics_per_host", None), getattr(a, "fabric", None)
    is_file = bool(a.topology) and not a.hosts and (a.topology.endswith((".json", ".yaml", ".yml"))
                                                    or os.path.sep in a.topology)
    if gpu and fabric is None and not is_file and "fabric=" not in (a.topology or ""):
        fabric = "nvswitch"  # the GPU defaults' host tier is NVLink into an NVSwitch
    if gpu and nics is None and not is_file and "nics=" not in (a.topology or ""):
        nics = max(len(h.ranks) for h in topo.host_infos())  # rail-optimized: one NIC per GPU
    if nics is not None or fabric:
        if nics is not None and nics < 1:
            raise SystemExit(f"--nics-per-host {nics}: a host needs at least one NIC")
        topo = with_nics(topo, nics, fabric)
    if gpu and not a.trunk and not _names_trunk(a.topology) and len(topo.switch_groups()) > 1:
        topo = _non_blocking_trunk(topo)
    return topo


def _names_trunk(spec: str | None) -> bool:
    """Whether a spec or file sets the trunk itself (files always do)."""
    if not spec:
        return False
    return "trunk=" in spec or spec.endswith((".json", ".yaml", ".yml")) or os.path.sep in spec


def _non_blocking_trunk(topo: Topology) -> Topology:
    """GPU fabrics are built non-blocking: a switch's uplink carries all its hosts' NICs."""
    per_switch = max(len(s) for s in topo.switch_groups())
    nics = max(h.nics for h in topo.host_infos())
    trunk = Link(topo.links.nic.bandwidth * nics * per_switch, topo.links.trunk.latency)
    out = Topology(topo.host_infos(), topo.links.with_tier("trunk", trunk))
    out.cost = topo.cost
    return out


def planner_config(topo: Topology, backend: str, launch: str | None = None) -> PlannerConfig:
    params = CostParams.from_dict(topo.cost) if topo.cost else GPU_PARAMS if backend == "nccl" else CostParams()
    if launch is not None:
        params = CostParams.from_dict({**params.to_dict(), "launch": float(launch)})
    return planner_settings(PlannerConfig(params=params), device_of(backend), topo)


def per_rank_count(op: str, size: int, elem: int, world: int) -> int:
    total = size // elem
    return total if op == "all_reduce" else total // world


def predictions(op: str, size: int, elem: int, topo: Topology, cfg: PlannerConfig) -> dict[str, Prediction]:
    return predict_all(op, per_rank_count(op, size, elem, topo.world_size), elem, topo, cfg)


def crossovers(op: str, sizes: list[int], picks: list[str], elem: int, topo: Topology,
               cfg: PlannerConfig) -> list[tuple[int, str, str]]:
    """(size, from, to) where auto's pick changes between neighbouring sizes,
    refined by bisection to within 2%."""
    out = []
    unit = elem if op == "all_reduce" else elem * topo.world_size
    for (lo, a), (hi, b) in zip(zip(sizes, picks, strict=True), zip(sizes[1:], picks[1:], strict=True),
                                strict=False):
        if a == b:
            continue
        left, right = lo, hi
        while right > left * 1.02 and right - left > unit:
            mid = int((left * right) ** 0.5) // unit * unit or unit
            if mid <= left or mid >= right:
                break
            if choose(predictions(op, mid, elem, topo, cfg), cfg, op) == a:
                left = mid
            else:
                right = mid
        out.append((right, a, b))
    return out


def _fmt_time(s: float) -> str:
    return f"{s * 1e3:.3f} ms" if s < 10 else f"{s:.2f} s"


def run(a: argparse.Namespace) -> int:
    topo = build_topology(a)
    cfg = planner_config(topo, a.backend, a.launch)
    ops = list(COLLECTIVES) if a.op == "all" else [a.op]
    for op in ops:
        if op not in COLLECTIVES:
            raise SystemExit(f"unknown op {op!r}; use one of {COLLECTIVES} or all")
    sizes = sweep(parse_size(a.minbytes), parse_size(a.maxbytes), a.stepfactor)
    world, elem = topo.world_size, a.elem_size
    hosts, switches = len(topo.host_groups()), len(topo.switch_groups())
    lm: LinkModel = topo.links
    nics = max(h.nics for h in topo.host_infos())
    fabric = "nvswitch" if all(h.fabric == "nvswitch" for h in topo.host_infos()) else "shared"
    print(f"# topology {topo.shape()}: {world} ranks, {hosts} hosts, {switches} switch(es), {nics} NIC(s) "
          f"per host, {fabric} host fabric; "
          f"host {lm.host.bandwidth * 8 / 1e9:.4g} Gbit/s {lm.host.latency * 1e6:.3g} us, "
          f"nic {lm.nic.bandwidth * 8 / 1e9:.4g} Gbit/s {lm.nic.latency * 1e6:.3g} us, "
          f"trunk {lm.trunk.bandwidth * 8 / 1e9:.4g} Gbit/s {lm.trunk.latency * 1e6:.3g} us; "
          f"backend {a.backend}{'; calibrated cost' if topo.cost else ''}")
    report: dict[str, Any] = {"topology": topo.shape(), "world": world, "hosts": hosts, "switches": switches,
                              "links": lm.to_dict(), "params": cfg.params.to_dict(), "ops": {}}
    for op in ops:
        rows, picks = [], []
        algos = list(names())
        print(f"#\n# {op}\n# {'size':>10} " + "".join(f"{x:>26}" for x in algos) + f"{'auto':>12}")
        print(f"# {'':>10} " + "".join(f"{'time  busbw(GB/s)':>26}" for _ in algos))
        for size in sizes:
            preds = predictions(op, size, elem, topo, cfg)
            pick = choose(preds, cfg, op)
            picks.append(pick)
            nccl = ""
            if cfg.params.native == "nccl":  # which algorithm/protocol NCCL would pick
                nccl = predict_nccl(op, topo, per_rank_count(op, size, elem, world), elem, cfg.params)[0]
            line = f"  {human(size):>10} "
            for x in algos:
                p = preds.get(x)
                if p is None:
                    line += f"{'-':>26}"
                    continue
                busbw = size / p.seconds * bus_factor(op, world) / 1e9 if p.seconds else 0.0
                k = f" K={p.chunks}" if algorithm(x).chunked else ""
                line += f"{_fmt_time(p.seconds) + k:>17} {busbw:>8.3f}"
            print(line + f"  {pick:>10}" + (f"  native={nccl}" if nccl else ""))
            row = {"size": size, "auto": pick, "algos": {x: asdict(p) for x, p in preds.items()}}
            if nccl:
                row["nccl_algo"] = nccl
            rows.append(row)
        cross = crossovers(op, sizes, picks, elem, topo, cfg)
        text = "; ".join(f"{a_} -> {b_} at {human(s)}" for s, a_, b_ in cross) or "none in this range"
        print(f"# crossovers: {text}")
        report["ops"][op] = {"rows": rows, "crossovers": [{"size": s, "from": x, "to": y} for s, x, y in cross]}
    if a.json:
        text = json.dumps(report, indent=1)
        if a.json == "-":
            sys.stdout.write(text + "\n")
        else:
            with open(a.json, "w") as f:
                f.write(text + "\n")
    if a.draw:
        from hocc.tools.draw import draw_plan

        size = parse_size(a.draw_size) if a.draw_size else sizes[-1]
        shown = draw_plan(topo, ops[0], per_rank_count(ops[0], size, elem, world), elem, cfg, a.draw)
        print(f"# drew {shown} to {a.draw}")
    return 0
