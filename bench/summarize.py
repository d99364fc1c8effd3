#!/usr/bin/env python3
"""Summarize the emulated scenarios' hocc-bench sweeps into bench/results/SUMMARY.md: a header that
says what made them (command, code version, dates, machine), one line per run with its files, and per
scenario and op each algorithm's busbw ratio to native at the largest size, the fraction of the link
bound reached, and auto's worst ratio to native over all sizes (auto must not pick a loser).

bench/run_results.sh calls it at its end, on the machine that ran the scenarios, with what only that
script knows (the command, the code version it ran, when it started):

    python bench/summarize.py --command 'sudo bash bench/run_results.sh' --code "$(git describe --always --dirty)" \\
        --since 2026-12-03T10:00:00Z --machine -o bench/results/SUMMARY.md bench/results/flat8.json ...

By hand, on files made earlier (the header then says what the JSONs do not record):

    python bench/summarize.py bench/results            # every hocc-bench JSON in the folder
    python bench/summarize.py bench/results/*.json     # other JSON (faults.json) is skipped, with a note
"""

from __future__ import annotations

import argparse
import datetime
import functools
import os
import platform
import shlex
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from hocc.bench.report import load_json
from hocc.bench.sizes import format_size

Run = tuple[Path, dict[str, Any], list[dict[str, Any]]]  # a sweep's file, meta and results
size_str = functools.partial(format_size, approx=True)  # '~64 MiB': sizes rounded down to a multiple of the ranks
# bench/run_results.sh's order: a folder's sweeps are listed in it, others after them by name
ORDER = ("flat8", "2x4-200mbit", "2x4-scattered-200mbit", "4x2-200mbit", "2x2x2-200mbit", "2x4-1gbit",
         "uneven-3+5-200mbit", "uneven-4+4+3-200mbit")
REGENERATE = "sudo bash bench/run_results.sh"


def load(args: list[str]) -> list[Run]:
    """The hocc-bench sweeps among the arguments (files, or folders searched for *.json)."""
    paths: list[Path] = []
    for a in args:
        p = Path(a)
        if p.is_dir():
            rank = {n: i for i, n in enumerate(ORDER)}
            paths += sorted(p.glob("*.json"), key=lambda q: (rank.get(q.stem, len(ORDER)), q.stem))
        else:
            paths.append(p)
    docs = []
    for p in paths:
        try:
            docs.append((p, *load_json(p)))
        except ValueError as e:
            print(f"summarize: skipping {e}", file=sys.stderr)
    if not docs:
        raise SystemExit("summarize: no hocc-bench JSON among the arguments")
    return docs


def when(meta: dict[str, Any]) -> datetime.datetime | None:
    """The run's end (hocc-bench stamps the JSON when it writes it), in UTC."""
    try:
        d = datetime.datetime.fromisoformat(meta["date"])
    except (KeyError, TypeError, ValueError):
        return None
    return d if d.tzinfo else d.replace(tzinfo=datetime.timezone.utc)


def utc(d: datetime.datetime) -> str:
    return d.astimezone(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def machine() -> str:
    """This machine: cores, CPU, memory, kernel."""
    cores = os.cpu_count() or 0
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else cores
    out = f"{cores} cores" + (f" ({usable} usable)" if usable != cores else "")
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text().splitlines()
        cpu = next(line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name"))
        out += f", {cpu}"
    except (OSError, StopIteration):
        pass
    try:
        meminfo = Path("/proc/meminfo").read_text().splitlines()
        kib = next(int(line.split()[1]) for line in meminfo if line.startswith("MemTotal:"))
        out += f", {kib / (1 << 20):.0f} GiB memory"
    except (OSError, StopIteration, ValueError):
        pass
    return out + f", {platform.system()} {platform.release()}"


def last_commit(path: Path) -> str | None:
    """The commit that last changed a file (for runs whose code version was not recorded)."""
    try:
        if subprocess.run(["git", "diff", "--quiet", "HEAD", "--", path.name], cwd=path.parent,
                          capture_output=True).returncode:
            return "uncommitted"
        out = subprocess.run(["git", "log", "-1", "--format=%h %cs", "--", path.name], cwd=path.parent,
                             capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return out or None


def distinct(values: list[Any]) -> str:
    return ", ".join(str(v) for v in dict.fromkeys(v for v in values if v is not None)) or "not recorded"


def header(docs: list[Run], a: argparse.Namespace) -> list[str]:
    metas = [m for _, m, _ in docs]
    dates = [t for t in (when(m) for m in metas) if t is not None]
    since = datetime.datetime.fromisoformat(a.since.replace("Z", "+00:00")) if a.since else None
    if since is not None and since.tzinfo is None:
        since = since.replace(tzinfo=datetime.timezone.utc)
    earlier = [p.stem for p, m, _ in docs if since is not None and (when(m) or since) < since]
    lines = ["# Results summary: the emulated scenarios", ""]
    rerun = [p.stem for p, _, _ in docs if p.stem not in earlier]
    if a.command:
        ran = f"reran {', '.join(rerun)}" if earlier else "ran the scenarios below"
        lines.append(f"Made by `{a.command}`, which {ran} and wrote this file with `bench/summarize.py` at its end.")
    else:
        lines.append("Written by `python bench/summarize.py " + " ".join(shlex.quote(x) for x in a.files) +
                     "` from runs made earlier; each scenario's own command heads its `.md`. "
                     f"`{REGENERATE}` reruns every scenario and rewrites this file.")
    if earlier:
        lines.append(f"The others are earlier runs, kept from before: {', '.join(earlier)}; the code and machine "
                     "below are not theirs.")
    lines += ["", "| | |", "| --- | --- |"]
    if a.code:
        code = a.code
    else:
        seen: dict[str, list[str]] = defaultdict(list)
        for p, _, _ in docs:
            seen[last_commit(p) or "unknown"].append(p.stem)
        code = ("not recorded (hocc-bench's JSON names no commit); the files were last changed in: " +
                "; ".join(f"{c} ({', '.join(names)})" for c, names in seen.items()))
    lines.append(f"| code | {code} |")
    if since is not None:
        lines.append(f"| command started | {utc(since)} |")
    span = f"{utc(min(dates))} to {utc(max(dates))}" if dates else "not recorded"
    lines.append(f"| runs ended | {span} |")
    now = datetime.datetime.now(datetime.timezone.utc)
    lines.append(f"| this file written | {utc(now)} |")
    software = f"torch {distinct([m.get('torch') for m in metas])}, hocc {distinct([m.get('hocc') for m in metas])}"
    if a.machine:
        lines.append(f"| machine | {machine()}; {software} |")
    else:
        lines.append(f"| machine | not recorded in the JSONs; {software} |")
    worlds = distinct([m.get("world") for m in metas]).replace(", ", " or ")
    lines += ["", f"Each run: `bench/cluster.py` builds the emulated cluster (network namespaces, host NICs shaped "
              "with tc; [docs/testbed.md](../../docs/testbed.md)) and runs `hocc-bench` in it on "
              f"{worlds} CPU ranks (gloo), {distinct([m.get('dtype') for m in metas])}, "
              f"{distinct([m.get('redop') for m in metas])}, {distinct([m.get('iters') for m in metas])} timed "
              f"iterations after {distinct([m.get('warmup') for m in metas])} warm-up, the median per rank, "
              "averaged over ranks; the algorithms interleaved size by size.", ""]
    return lines


def runs_table(docs: list[Run]) -> list[str]:
    lines = ["| run | HOCC_TOPOLOGY | ranks | sizes | algorithms | host stages | ended | table, plot, data |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for p, m, rows in docs:
        sizes = sorted({r["size"] for r in rows})
        span = f"{size_str(sizes[0])}-{size_str(sizes[-1])}" if len(sizes) > 1 else size_str(sizes[0])
        planner = m.get("planner") or {}
        stages = planner.get("host_impl", "not recorded")
        files = [f"[{p.stem}.{ext}]({p.stem}.{ext})" for ext in ("md", "png", "json")
                 if p.with_suffix(f".{ext}").exists()]
        ended = when(m)
        lines.append(f"| {p.stem} | `{m.get('topology')}` | {m.get('world')} | {span} | "
                     f"{', '.join(m.get('algos', []))} | {stages} | {utc(ended) if ended else '?'} | "
                     f"{', '.join(files)} |")
    return lines


def results_table(docs: list[Run]) -> list[str]:
    lines = ["| run | op | size | native ms | per algorithm: ms, x native, % of bound | auto's worst x native |",
             "| --- | --- | --- | --- | --- | --- |"]
    for p, _, rows in docs:
        by: dict[tuple[str, int], dict[str, dict[str, Any]]] = defaultdict(dict)
        for r in rows:
            by[(r["op"], r["size"])][r["algo"]] = r
        for op in dict.fromkeys(r["op"] for r in rows):
            sizes = sorted(s for (o, s) in by if o == op)
            last = by[(op, sizes[-1])]
            native = last.get("native")
            parts = []
            for algo, r in last.items():
                if algo == "native":
                    continue
                bound = r.get("bound_us")
                name = f"{algo} (ran {r['ran']})" if algo == "auto" and r.get("ran") else algo
                ratio = f", {r['busbw'] / native['busbw']:.2f}x" if native else ""
                frac = f", {bound / r['time_us']:.0%} of bound" if bound else ""
                parts.append(f"{name}: {r['time_us'] / 1e3:.0f} ms{ratio}{frac}")
            ratios = [(by[(op, s)]["auto"]["busbw"] / by[(op, s)]["native"]["busbw"], s)
                      for s in sizes if "auto" in by[(op, s)] and "native" in by[(op, s)]]
            worst = min(ratios) if ratios else None
            if native:
                nb = native.get("bound_us")
                ncell = f"{native['time_us'] / 1e3:.0f}" + (f" ({nb / native['time_us']:.0%} of bound)" if nb else "")
            else:
                ncell = "-"
            wcell = f"{worst[0]:.2f}x at {size_str(worst[1])}" if worst else "-"
            lines.append(f"| {p.stem} | {op} | {size_str(sizes[-1])} | {ncell} | {'; '.join(parts)} | {wcell} |")
    return lines


def summarize(docs: list[Run], a: argparse.Namespace) -> str:
    lines = header(docs, a)
    lines += ["## Runs", "", *runs_table(docs), "",
              "`host stages`: how the ranks of one host exchanged data (`shm`: hocc's shared-memory transport; "
              "`net`: gloo), as the engine's planner settings in the JSON record it.", "",
              "## At the largest size", "", *results_table(docs), "",
              "`x native`: the algorithm's bus bandwidth over native's (gloo's own collective) in the same run at "
              "that size; above 1 is faster. `% of bound`: the least time the shaped host NICs (and trunks) allow "
              "over the measured time ([docs/algorithms.md](../../docs/algorithms.md)); a run on one host has no "
              "bound. `auto's worst`: auto's lowest ratio to native over all sizes of the sweep. `auto (ran X)`: "
              "the plan auto ran at the largest size. Each `.md` has every size, with the JSON's `spread` "
              "((max - min) / median per rank): ratios closer to 1 than that spread are noise."]
    if any("+" in str(m.get("topology")) for _, m, _ in docs):
        lines += ["", "On unequal hosts (`uneven-*`) no plan reaches the bound for all_gather and reduce_scatter; "
                  "[uneven-summary.md](uneven-summary.md) compares them with the least any plan can move, and with "
                  "the topology-ordered ring."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("files", nargs="+", help="hocc-bench JSON files, or folders to take them from")
    p.add_argument("-o", "--output", help="write here instead of stdout")
    p.add_argument("--command", help="the command that made the runs (bench/run_results.sh passes its own)")
    p.add_argument("--code", help="the code version the runs ran (e.g. git describe --always --dirty)")
    p.add_argument("--since", metavar="ISO", help="when that command started: runs that ended before it are "
                   "marked as earlier runs")
    p.add_argument("--machine", action="store_true", help="the runs ran on this machine: describe it")
    a = p.parse_args(argv)
    text = summarize(load(a.files), a)
    if a.output:
        Path(a.output).write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
