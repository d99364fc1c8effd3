"""Soak: many mixed hocc collectives in one job, watching each rank's memory,
file descriptors and threads (issue 13).

N spawned CPU ranks (gloo, HOCC_TOPOLOGY e.g. 2x2, shared memory on the host
stage) run `--calls` collectives drawn from a fixed seed, identically on every
rank: all_reduce / all_gather / reduce_scatter, algo native / ring / ho_ring /
auto, sync and async (up to 4 in flight), on the world and on sub-groups (the
ranks of a host, the ranks of a rail), sizes log-uniform from 4 B to
`--max-bytes`. Fresh tensors every call, as a training loop has. Every
`--check-every` calls the result is compared with torch.distributed's own on
the same inputs. Every `--sample-every` calls (no call's tensors alive) each
rank records RSS, fds and threads.

Writes to --out: soak.csv (rank, call, seconds, rss_mib, fds, threads, RSS after
malloc_trim with --malloc-trim, else -1),
soak.png, soak.json and soak.md. Exit status 1 if a check failed, fds or
threads grew after warm-up, or RSS after warm-up moved more than --rss-tol.

    flock /tmp/hocc-bench.lock .venv/bin/python bench/soak.py --nprocs 4 --topology 2x2 --calls 10000
"""

from __future__ import annotations

import argparse
import csv
import ctypes
import json
import math
import os
import random
import statistics
import sys
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from hocc.bench.launch import free_port
from hocc.plan.types import COLLECTIVES as OPS

ALGOS = ("native", "ring", "ho_ring", "auto")
GROUPS = ("world", "host", "rail")
MAX_IN_FLIGHT = 4


@dataclass(frozen=True)
class Call:
    op: str
    algo: str
    group: str
    nbytes: int  # the larger buffer (nccl-tests' size column)
    async_op: bool


def schedule(calls: int, max_bytes: int, seed: int, size_pool: int = 0) -> list[Call]:
    """The same list on every rank: sizes log-uniform in [4 B, max_bytes], each call a new one, or
    drawn from `size_pool` such sizes (a training loop's few bucket and shard sizes, over and over)."""
    rng = random.Random(seed)
    lo, hi = math.log(4), math.log(max_bytes)
    pool = [int(math.exp(rng.uniform(lo, hi))) for _ in range(size_pool)]

    def size() -> int:
        return rng.choice(pool) if pool else int(math.exp(rng.uniform(lo, hi)))

    return [Call(rng.choice(OPS), rng.choice(ALGOS), rng.choice(GROUPS), size(), rng.random() < 0.5)
            for _ in range(calls)]


def baseline_call(args: argparse.Namespace) -> int:
    """The call after which the RSS baseline is sampled: the end of the warm-up fraction, on a sample."""
    return int(args.calls * args.warmup) // args.sample_every * args.sample_every


def warmup_calls(max_bytes: int) -> list[Call]:
    """Every (group, op, algo) once at a few sizes up to the largest, sync, before the mix: each
    engine's communicators, worker thread and largest buffers exist before the baseline."""
    sizes = sorted({4, min(4096, max_bytes), min(1 << 18, max_bytes), max_bytes})
    return [Call(op, algo, g, nbytes, False) for g in GROUPS for op in OPS for algo in ALGOS for nbytes in sizes]


def sample() -> tuple[float, int, int]:
    """(RSS in MiB, open fds, threads) of this process."""
    rss = int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    return rss, len(os.listdir("/proc/self/fd")), len(os.listdir("/proc/self/task"))


def _groups(topology: str) -> dict[str, dist.ProcessGroup]:
    """This rank's world, host and rail groups (every rank creates every group, as new_group wants)."""
    from hocc.topology import parse_spec

    topo = parse_spec(topology)
    hosts, rails = topo.host_groups(), topo.rails()
    me = dist.get_rank()
    world = dist.group.WORLD
    assert world is not None
    mine: dict[str, dist.ProcessGroup] = {"world": world}
    for kind, sets in (("host", hosts), ("rail", rails)):
        for ranks in sets:
            g = dist.new_group(list(ranks))
            if me in ranks:
                mine[kind] = g
    return mine


def _buffers(call: Call, n: int, rank: int, checked: bool, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    per = max(1, call.nbytes // 4 // (1 if call.op == "all_reduce" else n))
    n_in = per * n if call.op == "reduce_scatter" else per
    n_out = per * n if call.op == "all_gather" else per
    inp = torch.randn(n_in, generator=gen) if checked else torch.full((n_in,), float(rank % 7 + 1))
    out = inp if call.op == "all_reduce" else torch.empty(n_out)
    return inp, out


def _launch(call: Call, inp: torch.Tensor, out: torch.Tensor, group: dist.ProcessGroup, async_op: bool,
            torch_only: bool = False) -> Any:
    import hocc

    if torch_only:  # the same calls through gloo alone: what torch and glibc do without hocc
        if call.op == "all_reduce":
            return dist.all_reduce(inp, group=group, async_op=async_op)
        if call.op == "all_gather":
            return dist.all_gather_single(out, inp, group=group, async_op=async_op)
        return dist.reduce_scatter_single(out, inp, group=group, async_op=async_op)
    if call.op == "all_reduce":
        return hocc.all_reduce(inp, group=group, async_op=async_op, algo=call.algo)
    if call.op == "all_gather":
        return hocc.all_gather_into_tensor(out, inp, group=group, async_op=async_op, algo=call.algo)
    return hocc.reduce_scatter_tensor(out, inp, group=group, async_op=async_op, algo=call.algo)


def _reference(call: Call, inp: torch.Tensor, group: dist.ProcessGroup, n: int) -> torch.Tensor:
    if call.op == "all_reduce":
        ref = inp.clone()
        dist.all_reduce(ref, group=group)
        return ref
    if call.op == "all_gather":
        ref = torch.empty(inp.numel() * n)
        dist.all_gather_single(ref, inp, group=group)
        return ref
    ref = torch.empty(inp.numel() // n)
    dist.reduce_scatter_single(ref, inp, group=group)
    return ref


def _rank(rank: int, world: int, port: int, args: argparse.Namespace, parts: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), HOCC_TOPOLOGY=args.topology,
                      HOCC_HOST_TRANSPORT=args.host_transport)
    import hocc

    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=args.timeout))
    groups = _groups(args.topology)
    calls = schedule(args.calls, args.max_bytes, args.seed, args.size_pool)
    gen = torch.Generator().manual_seed(1000 + rank)
    rows: list[tuple[int, int, float, float, int, int, float]] = []
    failures: list[str] = []
    pending: list[Any] = []
    start = time.monotonic()

    libc = ctypes.CDLL("libc.so.6") if args.malloc_trim or args.malloc_info else None
    warm_at = baseline_call(args)

    def malloc_info(i: int) -> None:
        """glibc's own account of each arena (its size, what in it is free), for diagnosis."""
        assert libc is not None
        where = Path(args.out, "malloc_info")
        where.mkdir(parents=True, exist_ok=True)
        libc.fopen.restype = ctypes.c_void_p
        fp = libc.fopen(str(where / f"rank{rank}-call{i}.xml").encode(), b"w")
        libc.malloc_info(0, ctypes.c_void_p(fp))
        libc.fclose(ctypes.c_void_p(fp))

    def record(i: int) -> None:
        rss, fds, threads = sample()
        if args.malloc_info and i in (warm_at, len(calls)):
            malloc_info(i)
        trimmed = -1.0
        if args.malloc_trim:  # what glibc holds free but not returned, as the drop after malloc_trim
            libc.malloc_trim(0)
            trimmed = sample()[0]
        rows.append((rank, i, round(time.monotonic() - start, 3), round(rss, 2), fds, threads, round(trimmed, 2)))

    record(0)
    seen: set[str] = set()
    for call in warmup_calls(args.max_bytes):
        group = groups[call.group]
        inp, out = _buffers(call, dist.get_world_size(group), rank, False, gen)
        # the first warm-up call of each group runs under HOCC_CHECK=all: that makes its engine's own gloo
        # group, which auto's trials also use (their barriers and agreed times) and make at the first trial
        first = not args.torch_only and call.group not in seen
        seen.add(call.group)
        if first:
            hocc.configure(check="all")
        _launch(call, inp, out, group, False, args.torch_only)
        if first:
            hocc.configure(check="comm")
    del inp, out
    for i, call in enumerate(calls, 1):
        group = groups[call.group]
        n = dist.get_world_size(group)
        checked = args.check_every > 0 and i % args.check_every == 0
        inp, out = _buffers(call, n, rank, checked, gen)
        if checked:  # settle the calls in flight first: torch's call may share a gloo backend with them
            for w in pending:
                w.wait()
            pending.clear()
            want = _reference(call, inp, group, n)
        work = _launch(call, inp, out, group, call.async_op and not checked, args.torch_only)
        if work is not None:
            pending.append(work)
            if len(pending) >= MAX_IN_FLIGHT:
                pending.pop(0).wait()
        if checked:
            got = out if call.op != "all_reduce" else inp
            if not torch.allclose(got, want, rtol=1e-4, atol=1e-4):
                failures.append(f"call {i} {call}: max difference {(got - want).abs().max().item()}")
            del got, want  # a sample follows a checked call: its reference must not be counted as held
        del inp, out, work
        if i % args.sample_every == 0 or i == len(calls):
            for w in pending:
                w.wait()
            pending.clear()
            record(i)
            if rank == 0 and i % (args.sample_every * 10) == 0:
                print(f"# soak: {i}/{len(calls)} calls, {time.monotonic() - start:.0f} s, rank 0 RSS "
                      f"{rows[-1][3]:.0f} MiB", file=sys.stderr, flush=True)
    hocc.reset_engines()
    dist.destroy_process_group()
    Path(parts, f"rank{rank}.json").write_text(json.dumps({"rows": rows, "failures": failures}))


def summarize(rows: list[tuple[int, int, float, float, int, int, float]], world: int, calls: int, warmup: int,
              rss_tol: float) -> dict[str, Any]:
    """Per rank: RSS, fds and threads at the end of warm-up and after it; the verdict."""
    per_rank: dict[int, Any] = {}
    ok = True
    for r in range(world):
        mine = [x for x in rows if x[0] == r]
        after = [x for x in mine if x[1] >= warmup]
        base = after[0]
        rss = [x[3] for x in after]
        growth = (rss[-1] - base[3]) / base[3]
        spread = (max(rss) - min(rss)) / base[3]
        # the trend without single samples' noise: the mean RSS of each quarter of the samples after warm-up
        q = max(len(rss) // 4, 1)
        quarters = [statistics.mean(rss[i * q:(i + 1) * q]) for i in range(4) if rss[i * q:(i + 1) * q]]
        fd_growth = max(x[4] for x in after) - base[4]
        thread_growth = max(x[5] for x in after) - base[5]
        flat = spread <= rss_tol and fd_growth <= 0 and thread_growth <= 0
        ok = ok and flat
        per_rank[r] = {"rss_start_mib": mine[0][3], "rss_warm_mib": base[3], "rss_max_mib": max(rss),
                       "rss_end_mib": rss[-1], "rss_growth": growth, "rss_spread": spread,
                       "rss_quarter_means_mib": [round(m, 1) for m in quarters],
                       "fds_warm": base[4], "fds_max": max(x[4] for x in after), "threads_warm": base[5],
                       "threads_max": max(x[5] for x in after), "flat": flat}
    seconds = max(x[2] for x in rows)
    return {"world": world, "calls": calls, "warmup_calls": warmup, "seconds": seconds,
            "calls_per_s": calls / seconds if seconds else 0.0, "rss_tol": rss_tol, "ranks": per_rank, "flat": ok}


def plot(rows: list[tuple[int, int, float, float, int, int, float]], world: int, warmup: int, path: Path,
         title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for r in range(world):
        mine = [x for x in rows if x[0] == r]
        for ax, col in zip(axes, (3, 4, 5), strict=True):
            ax.plot([x[1] for x in mine], [x[col] for x in mine], label=f"rank {r}")
    for ax, name in zip(axes, ("RSS (MiB)", "open fds", "threads"), strict=True):
        ax.axvline(warmup, color="k", linestyle="--", linewidth=0.8, label="end of warm-up")
        ax.set_xlabel("calls")
        ax.set_ylabel(name)
        ax.grid(True, alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def report(summary: dict[str, Any], failures: list[str], args: argparse.Namespace, command: str) -> str:
    pool = f", drawn from {args.size_pool} fixed sizes" if args.size_pool else ""
    lines = [f"# Soak: {args.calls} mixed collectives on {summary['world']} CPU ranks ({args.topology}, "
             f"host stage {args.host_transport})", "",
             f"Command: `{command}`", "",
             f"Sizes 4 B to {args.max_bytes} B (log-uniform, seed {args.seed}{pool}); ops {', '.join(OPS)}; algos "
             f"{', '.join(ALGOS)}; sync and async (up to {MAX_IN_FLIGHT} in flight); groups: world, host, rail. "
             f"Checked against torch.distributed every {args.check_every} calls; sampled every "
             f"{args.sample_every} calls. Warm-up: every (group, op, algo) once at 4 B, 4 KiB, 256 KiB and "
             f"the largest size (each group's first under HOCC_CHECK=all, which makes the engine's own gloo group "
             f"that auto's trials use too), then the first {summary['warmup_calls']} calls of the mix; the baseline is "
             "the sample after them. "
             f"{summary['seconds']:.0f} s, {summary['calls_per_s']:.1f} calls/s (a shared 2-core machine: "
             "other jobs ran beside it).", "",
             "| rank | RSS start (MiB) | RSS after warm-up | RSS max after | RSS end | spread after warm-up | "
             "quarter means after warm-up | fds warm / max | threads warm / max | flat |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|:---:|"]
    for r, s in summary["ranks"].items():
        means = ", ".join(f"{m:.0f}" for m in s["rss_quarter_means_mib"])
        lines.append(f"| {r} | {s['rss_start_mib']:.0f} | {s['rss_warm_mib']:.0f} | {s['rss_max_mib']:.0f} | "
                     f"{s['rss_end_mib']:.0f} | {100 * s['rss_spread']:.1f}% | "
                     f"{means} | {s['fds_warm']} / {s['fds_max']} | "
                     f"{s['threads_warm']} / {s['threads_max']} | {'yes' if s['flat'] else 'NO'} |")
    lines += ["", f"Correctness checks failed: {len(failures)}", *[f"- {f}" for f in failures[:20]], "",
              f"Verdict: {'flat' if summary['flat'] and not failures else 'NOT flat or wrong'} "
              f"(RSS spread after warm-up within {100 * args.rss_tol:.0f}%, no fd or thread growth).", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from hocc.bench.sizes import parse_size

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nprocs", type=int, default=4)
    ap.add_argument("--topology", default="2x2")
    ap.add_argument("--host-transport", default="shm", choices=("shm", "net"))
    ap.add_argument("--calls", type=int, default=10000)
    ap.add_argument("--max-bytes", type=parse_size, default=parse_size("64M"))
    ap.add_argument("--seed", type=int, default=13)
    ap.add_argument("--size-pool", type=int, default=0,
                    help="draw sizes from this many fixed ones (a training loop's), not a new size each call")
    ap.add_argument("--check-every", type=int, default=50)
    ap.add_argument("--sample-every", type=int, default=100)
    ap.add_argument("--warmup", type=float, default=0.1, help="fraction of the calls before the RSS baseline")
    ap.add_argument("--rss-tol", type=float, default=0.05)
    ap.add_argument("--timeout", type=float, default=60.0, help="the groups' timeout (s)")
    ap.add_argument("--malloc-trim", action="store_true",
                    help="call glibc's malloc_trim(0) at each sample and record RSS after it too (diagnosis)")
    ap.add_argument("--malloc-info", action="store_true",
                    help="write each rank's glibc malloc_info (arenas, their free memory) after the warm-up and at "
                         "the end, to OUT/malloc_info/ (diagnosis)")
    ap.add_argument("--torch-only", action="store_true",
                    help="run the same schedule through torch.distributed (gloo) alone, as a baseline")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results" / "soak")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    parts = args.out / "parts"
    parts.mkdir(exist_ok=True)
    mp.spawn(_rank, args=(args.nprocs, free_port(), args, str(parts)), nprocs=args.nprocs, join=True)
    rows: list[tuple[int, int, float, float, int, int, float]] = []
    failures: list[str] = []
    for r in range(args.nprocs):
        part = json.loads((parts / f"rank{r}.json").read_text())
        rows += [tuple(x) for x in part["rows"]]
        failures += [f"rank {r}: {f}" for f in part["failures"]]
        (parts / f"rank{r}.json").unlink()
    parts.rmdir()
    warmup = baseline_call(args)
    summary = summarize(rows, args.nprocs, args.calls, warmup, args.rss_tol)
    summary["failures"] = failures
    with open(args.out / "soak.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["rank", "call", "seconds", "rss_mib", "fds", "threads", "rss_after_malloc_trim_mib"])
        w.writerows(sorted(rows))
    (args.out / "soak.json").write_text(json.dumps(summary, indent=1))
    malloc_env = [f"{k}={v}" for k, v in sorted(os.environ.items()) if k.startswith(("MALLOC_", "HOCC_MALLOC"))]
    command = " ".join([*malloc_env, "python", "bench/soak.py", *(argv if argv is not None else sys.argv[1:])])
    (args.out / "soak.md").write_text(report(summary, failures, args, command))
    plot(rows, args.nprocs, warmup, args.out / "soak.png",
         f"hocc soak: {args.calls} calls, {args.nprocs} ranks {args.topology}, up to {args.max_bytes} B")
    print((args.out / "soak.md").read_text())
    return 0 if summary["flat"] and not failures else 1


if __name__ == "__main__":
    sys.exit(main())
