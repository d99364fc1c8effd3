"""hocc-bench: bandwidth of hocc's collectives against the backend's own, in
the style of nccl-tests. Runs under torchrun (env://) or spawns local CPU
ranks with --nprocs."""

from __future__ import annotations

import argparse
import datetime
import os
import sys
from typing import Any

import torch
import torch.distributed as dist

import hocc
from hocc.bench.collectives import COLLECTIVES, OP_NAMES
from hocc.bench.report import footer, plot, skew_table, table, to_csv, to_json, trials_table
from hocc.bench.runner import BenchSpec, Row, run_bench
from hocc.bench.sizes import parse_size, sweep
from hocc.config import algo_choices, get_config, reset_config
from hocc.engine.group_engines import get_engine
from hocc.plan.policy import settings_meta
from hocc.plan.volumes import link_bound
from hocc.topology import Topology, parse_spec

DTYPES = {"float": torch.float32, "float32": torch.float32, "double": torch.float64, "float64": torch.float64,
          "half": torch.float16, "float16": torch.float16, "bfloat16": torch.bfloat16, "int8": torch.int8,
          "int32": torch.int32, "int": torch.int32, "int64": torch.int64, "uint8": torch.uint8}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hocc-bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--op", default="all_reduce",
                   help="comma list of all_reduce, all_gather, reduce_scatter, or 'all' (default all_reduce)")
    p.add_argument("-b", "--minbytes", default="32M", help="smallest size, with K/M/G suffixes (default 32M)")
    p.add_argument("-e", "--maxbytes", default="32M", help="largest size (default 32M)")
    p.add_argument("-f", "--stepfactor", type=float, default=2.0, help="multiply the size by this (default 2)")
    p.add_argument("-i", "--stepbytes", default="0", help="add this to the size instead of multiplying")
    p.add_argument("-n", "--iters", type=int, default=20, help="timed iterations per size (default 20)")
    p.add_argument("-w", "--warmup", type=int, default=5, help="untimed warm-up iterations (default 5)")
    p.add_argument("-c", "--check", type=int, default=1, help="check results: 1 yes, 0 no (default 1)")
    p.add_argument("-d", "--dtype", default="float", help=f"one of {', '.join(DTYPES)} (default float)")
    p.add_argument("-o", "--op-reduce", "--redop", dest="redop", default="sum",
                   help="reduction: sum, prod, min, max, avg (default sum)")
    p.add_argument("-a", "--average", type=int, default=1, choices=[0, 1, 2, 3],
                   help="time reported across ranks: 0 rank 0, 1 mean, 2 min, 3 max (default 1)")
    p.add_argument("--algo", default="native,ho_ring",
                   help=f"comma list from {', '.join(algo_choices())}, measured interleaved (default native,ho_ring)")
    p.add_argument("--nprocs", type=int, default=0, help="spawn this many local CPU ranks (gloo) instead of env://")
    p.add_argument("--topology", default=None, help="HOCC_TOPOLOGY spec for the ranks, e.g. 2x4 or 2x4@nic=1gbit")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"],
                   help="auto: cuda with NCCL when GPUs are visible, else cpu with gloo")
    p.add_argument("--skew", action="store_true",
                   help="also report each rank's arrival skew: how much later than the first rank it began each "
                        "timed call (wall clocks; gathered after the timed loop)")
    p.add_argument("--csv", action="store_true", help="print CSV rows instead of the table")
    p.add_argument("--json", metavar="FILE", help="write results and run metadata as JSON")
    p.add_argument("--plot", metavar="FILE.png", help="draw busbw against size, one line per algorithm")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    return p


def spec_from_args(a: argparse.Namespace) -> BenchSpec:
    ops = list(COLLECTIVES) if a.op == "all" else [o.strip() for o in a.op.split(",") if o.strip()]
    for o in ops:
        if o not in COLLECTIVES:
            raise SystemExit(f"hocc-bench: unknown op {o!r}; use all_reduce, all_gather, reduce_scatter or all")
    algos = [x.strip() for x in a.algo.split(",") if x.strip()]
    for x in algos:
        if x not in algo_choices():
            raise SystemExit(f"hocc-bench: unknown algo {x!r}; use a comma list from {', '.join(algo_choices())}")
    if a.dtype not in DTYPES:
        raise SystemExit(f"hocc-bench: unknown dtype {a.dtype!r}; use one of {', '.join(DTYPES)}")
    if a.redop not in OP_NAMES:
        raise SystemExit(f"hocc-bench: unknown reduction {a.redop!r}; use sum, prod, min, max or avg")
    if a.redop == "avg" and not DTYPES[a.dtype].is_floating_point:
        raise SystemExit("hocc-bench: avg needs a floating-point dtype")
    if a.iters < 1 or a.warmup < 0:
        raise SystemExit("hocc-bench: need -n >= 1 and -w >= 0")
    try:
        sizes = sweep(parse_size(a.minbytes), parse_size(a.maxbytes), a.stepfactor, parse_size(a.stepbytes))
    except ValueError as e:
        raise SystemExit(f"hocc-bench: {e}") from None
    return BenchSpec(tuple(ops), tuple(sizes), tuple(algos), DTYPES[a.dtype], a.redop, a.iters, a.warmup,
                     a.check, a.average, a.skew)


def bounds_for(rows: list[Row], topo: Topology | None) -> dict[tuple[str, int], float]:
    """Link bounds, only where the topology spec states its link rates (the
    emulated cluster does): local --nprocs ranks have no NIC to be bound by."""
    if topo is None or "@" not in (get_config().topology or ""):
        return {}
    out = {}
    for r in rows:
        b = link_bound(r.op, r.size, topo)
        if b is not None:
            out[(r.op, r.size)] = b
    return out


def _topology() -> Topology | None:
    spec = get_config().topology
    return parse_spec(spec) if spec else None


def _planner_settings(device: str) -> dict[str, Any]:
    """The engine's planner settings for the world group (so `hocc calibrate`
    prices the plans that really ran: ring ops, host transport, chunk cap)."""
    cfg = get_config()
    world = dist.group.WORLD
    assert world is not None
    return settings_meta(get_engine(world, torch.device(device), cfg).settings(cfg))


def report(a: argparse.Namespace, spec: BenchSpec, rows: list[Row], world: int, device: str) -> None:
    topo = _topology()
    bounds = bounds_for(rows, topo)
    shape = topo.shape() if topo else "detected"
    title = f"hocc-bench world={world} topology={shape} device={device} dtype={str(spec.dtype)[6:]}"
    if a.csv:
        sys.stdout.write(to_csv(rows))
    else:
        sys.stdout.write(f"# {title}\n# algorithms: {', '.join(spec.algos)} (interleaved per size); "
                         f"iters {spec.iters}, warmup {spec.warmup}, median per rank, -a {spec.average}\n")
        if topo is not None:
            line = f"# topology {get_config().topology}: hosts {topo.host_groups()}"
            if bounds:
                line += f", NIC {topo.links.nic.bandwidth * 8 / 1e6:g} Mbit/s; link bound = least time the NICs allow"
            sys.stdout.write(line + "\n")
        sys.stdout.write(table(rows, spec.algos, bounds))
        sys.stdout.write(footer(rows, spec.algos, bounds))
        sys.stdout.write(skew_table(rows))
        sys.stdout.write(trials_table(rows))
    sys.stdout.flush()
    if a.json:
        meta: dict[str, Any] = {
            "command": " ".join(["hocc-bench", *sys.argv[1:]]), "world": world, "device": device,
            "topology": get_config().topology, "hosts": topo.host_groups() if topo else None,
            "nic_bytes_per_s": topo.links.nic.bandwidth if topo else None,
            "dtype": str(spec.dtype)[6:], "redop": spec.redop, "iters": spec.iters, "warmup": spec.warmup,
            "average": spec.average, "algos": list(spec.algos), "hocc": hocc.__version__,
            "torch": torch.__version__, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
            "planner": _planner_settings(device),
        }
        with open(a.json, "w") as f:
            f.write(to_json(rows, meta, bounds) + "\n")
    if a.plot:
        plot(rows, spec.algos, a.plot, title, world, bounds)


def _device(a: argparse.Namespace) -> torch.device:
    if a.device == "cuda" or (a.device == "auto" and torch.cuda.is_available() and not a.nprocs):
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        return torch.device("cuda", local)
    return torch.device("cpu")


def rank_main(a: argparse.Namespace) -> None:
    """Body of every rank; the process group is set up from the environment."""
    spec = spec_from_args(a)
    device = _device(a)
    if not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=600))
    try:
        torch.set_num_threads(1)
        rows = run_bench(spec, device, progress=not a.quiet)
        if dist.get_rank() == 0:
            report(a, spec, rows, dist.get_world_size(), device.type)
        dist.barrier()
    finally:
        hocc.reset_engines()
        dist.destroy_process_group()


def _spawned(rank: int, world: int, port: int, argv: list[str]) -> None:
    os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    rank_main(build_parser().parse_args(argv))


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    a = build_parser().parse_args(argv)
    spec_from_args(a)  # argument errors before anything starts
    if a.topology:
        os.environ["HOCC_TOPOLOGY"] = a.topology  # for the ranks this starts, which read it as hocc's setting
        reset_config()  # and for this process's
        parse_spec(a.topology)
    if a.nprocs:
        from hocc.bench.launch import free_port, start_local_ranks

        start_local_ranks(_spawned, (a.nprocs, free_port(), argv), a.nprocs)
        return
    if "RANK" not in os.environ:
        raise SystemExit("hocc-bench: no RANK in the environment; run it under torchrun, or pass --nprocs N")
    rank_main(a)


if __name__ == "__main__":
    main()
