#!/usr/bin/env python3
"""Open MPI's own collectives beside hocc and gloo on the emulated cluster (docs/testbed.md, "A peer: Open MPI").

One command per scenario. It builds the emulated cluster once (bench/cluster.py's Cluster: a network namespace
per host, shaped veths into a bridge), then runs on it, in turn:

1. hocc and gloo: bench/per_host_run.py on every rank (torch on gloo; hocc's algorithms interleaved call by
   call, then gloo's own call, so that no gloo call comes between two of hocc's samples, as none comes between
   Open MPI's; auto first run until it has decided each size's bucket);
2. Open MPI's own MPI_Allreduce, MPI_Allgather and MPI_Reduce_scatter_block (bench/ompi_collectives.py, mpi4py)
   with its default `tuned` selection;
3. the same with its hierarchical `han` component first (coll_han_priority 100);

and then (--rounds 2) the three again in the reverse order. Before them, the 32 B MPI_Allreduce with the ranks
spinning and yielding (the yield check). Every call is timed the same way: all ranks begin it after a barrier, a
call's time is its slowest rank's, a size's figure the median of its timed calls after warm-ups, pooled over the
rounds. Results go to --out-dir as <scenario>-<rate>.json (raw) and the tables of every scenario there are
rewritten into README.md (with notes.md, hand-written, if it is there).

    sudo .venv/bin/python bench/ompi_peer.py 2x4 --rate 200mbit              # 32 B .. 64 MiB, x8
    sudo .venv/bin/python bench/ompi_peer.py 2x4 --rate 1gbit -b 32 -e 1M -f 32 --rounds 1 --out-dir /tmp/p  # short
    .venv/bin/python bench/ompi_peer.py --report                              # only rewrite README.md

Open MPI comes from Debian (openmpi-bin, libopenmpi-dev; apt-get install when mpirun is missing) and runs from a
virtual environment of its own (build/ompi-venv: mpi4py, numpy), not from hocc's. How it is held to what hocc
gets:

- mpirun starts in host 0's namespace; every other host's daemon (orted) starts through an rsh agent that runs
  the command in that host's namespace (`ip netns exec`, with the host's hostname in a UTS namespace), so
  Open MPI sees one node per emulated host;
- byte transfer layers `self,vader,tcp` on pml ob1: shared memory (vader) only between ranks of one node, which
  is one namespace, TCP between nodes, only on the hosts' shaped veths (btl_tcp_if_include and
  oob_tcp_if_include the cluster's subnet);
- ranks yield when idle (--mca mpi_yield_when_idle 1 on the command line: the launcher sets the variable in each
  rank's environment itself, over one exported to mpirun): 8 ranks on 2 cores, spinning ranks take the cores the
  ranks they wait for need (the yield check);
- no binding (--bind-to none), as hocc's ranks.
"""

from __future__ import annotations

import argparse
import datetime
import fcntl
import json
import os
import platform
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hocc.bench import emulated
from hocc.bench.sizes import format_size, parse_size, sweep

ROOT = Path(__file__).resolve().parent.parent

VENV = ROOT / "build" / "ompi-venv"
OUT_DIR = ROOT / "bench" / "results" / "peers"
LOCK = "/tmp/hocc-bench.lock"
OPS = ("all_reduce", "all_gather", "reduce_scatter")
OMPI_WAYS = {  # label: MCA settings on top of the common ones
    "ompi_tuned": {},
    "ompi_han": {"coll_han_priority": "100"},
}
HOCC_ALGOS = ("auto", "ho_ring")
NOISY = 1.25  # a figure whose rounds' medians differ by more than this factor is marked ~


def counts(size: int) -> tuple[int, int, int]:
    """(timed samples, warm-ups, calls per sample) per size: fewer samples where a call moves megabytes
    (seconds at 200 Mbit/s). A sample is a burst of calls back to back after one barrier, its time over its
    calls (OSU's latency tests time a loop the same way): a lone small call would be timed mostly by how
    unevenly the ranks left the barrier before it (gloo's barrier, before hocc's and gloo's calls, leaves
    them up to a millisecond apart on the emulated cluster; Open MPI's own, far less)."""
    if size <= 64 << 10:
        return 20, 3, 20
    if size <= 256 << 10:
        return 20, 3, 4
    if size <= 2 << 20:
        return 10, 2, 1
    if size <= 16 << 20:
        return 5, 1, 1
    return 3, 1, 1


# --------------------------------------------------------------------------------------------------- set-up


def run_quiet(*cmd: str) -> None:
    subprocess.run(list(cmd), check=True, stdout=subprocess.DEVNULL)


def ensure_open_mpi() -> None:
    if shutil.which("mpirun") and shutil.which("orted"):
        return
    print("# installing Open MPI from Debian (openmpi-bin, libopenmpi-dev)", file=sys.stderr, flush=True)
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
    subprocess.run(["apt-get", "install", "-y", "-qq", "openmpi-bin", "libopenmpi-dev"], check=True, env=env)


def ensure_venv(venv: Path) -> Path:
    """The benchmark's own environment: mpi4py and numpy, nothing of hocc's."""
    py = venv / "bin" / "python"
    probe = [str(py), "-c", "import mpi4py, numpy; from mpi4py import MPI"]
    if py.exists() and subprocess.run(probe, capture_output=True).returncode == 0:
        return py
    base = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else sys.executable
    print(f"# creating {venv} ({base} -m venv; pip install mpi4py numpy)", file=sys.stderr, flush=True)
    if subprocess.run([base, "-m", "venv", "--help"], capture_output=True).returncode or \
            subprocess.run([base, "-c", "import ensurepip"], capture_output=True).returncode:
        subprocess.run(["apt-get", "install", "-y", "-qq", "python3-venv"], check=True,
                       env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"))
    run_quiet(base, "-m", "venv", "--clear", str(venv))
    run_quiet(str(py), "-m", "pip", "install", "-q", "mpi4py", "numpy")
    subprocess.run(probe, check=True)
    return py


def host_addr(h: int) -> str:
    return f"{emulated.SUBNET}.{h + 1}"


def host_name(h: int) -> str:
    return f"{emulated.PREFIX}-host{h}"


def write_agent(path: Path, cluster: emulated.Cluster) -> None:
    """mpirun's rsh agent: called as `agent [options] HOST COMMAND...` (as ssh), runs COMMAND through a shell in
    HOST's namespace and on HOST's CPUs, with the host's own hostname (a UTS namespace), as bench/cluster.py starts
    hocc's ranks."""
    cases = "\n".join(f"  {host_addr(h)}|{host_name(h)}) ns={ns}; name={host_name(h)}; "
                      f"cpus={cluster.host_cpus(h)} ;;" for h, ns in enumerate(cluster.namespaces))
    path.write_text(f"""#!/bin/sh
# rsh agent for mpirun on the emulated cluster (bench/ompi_peer.py): HOST's command runs in HOST's namespace
while [ $# -gt 0 ]; do case "$1" in -*) shift ;; *) break ;; esac; done
host=$1; shift
case "$host" in
{cases}
  *) echo "ompi rsh agent: no emulated host $host" >&2; exit 255 ;;
esac
exec taskset -c "$cpus" ip netns exec "$ns" \\
  unshare --uts sh -c 'hostname "$1" && shift && exec sh -c "$*"' sh "$name" "$@"
""")
    path.chmod(0o755)


def in_host0(cluster: emulated.Cluster, cmd: list[str]) -> list[str]:
    return ["taskset", "-c", cluster.host_cpus(0), "ip", "netns", "exec", cluster.namespaces[0],
            "unshare", "--uts", "sh", "-c", f'hostname {host_name(0)} && exec "$@"', "sh", *cmd]


def mpirun_cmd(cluster: emulated.Cluster, work: Path, py: Path, mca: dict[str, str], args: list[str]) -> list[str]:
    sc = cluster.sc
    hostfile = work / "hostfile"
    hostfile.write_text("".join(f"{host_addr(h)} slots={sum(sc.host_of(r) == h for r in range(sc.world))}\n"
                                for h in range(sc.hosts)))
    subnet = f"{emulated.SUBNET}.0/24"
    common = {
        "plm_rsh_agent": str(work / "netns-rsh"),
        "plm_rsh_no_tree_spawn": "1",      # every daemon from mpirun, through the agent
        "oob_tcp_if_include": subnet,
        "pml": "ob1",                      # byte transfer layers, not UCX (which would pick its own transports)
        "btl": "self,vader,tcp",           # vader: shared memory between the ranks of one node (one namespace)
        "btl_tcp_if_include": subnet,      # TCP between nodes: only the hosts' shaped veths
        "mpi_yield_when_idle": "1",        # 8 ranks on 2 cores: a waiting rank gives up its core
    }
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(sc.world), "--hostfile", str(hostfile),
           "--map-by", "node" if sc.scattered else "slot", "--bind-to", "none"]
    for k, v in {**common, **mca}.items():
        cmd += ["--mca", k, v]
    return [*cmd, str(py), str(ROOT / "bench" / "ompi_collectives.py"), *args]


def nic_bytes(cluster: emulated.Cluster) -> int:
    """Bytes sent so far through the hosts' shaped NICs, both directions (tc's counters on both veth ends)."""
    total = 0
    for h, ns in enumerate(cluster.namespaces):
        for cmd in (["ip", "netns", "exec", ns, "tc", "-s", "qdisc", "show", "dev", f"{emulated.PREFIX}-v{h}"],
                    ["tc", "-s", "qdisc", "show", "dev", f"{emulated.PREFIX}-v{h}b"]):
            out = emulated.sh(*cmd).stdout.split()
            total += int(out[out.index("Sent") + 1]) if "Sent" in out else 0
    return total // 2  # each byte leaves one end and enters the other: counted once, at egress, on each side


# --------------------------------------------------------------------------------------------------- runs


def run_hocc(cluster: emulated.Cluster, work: Path, a: argparse.Namespace, sizes: list[int],
             iters: list[int], warmups: list[int], bursts: list[int]) -> list[dict]:
    out = work / "hocc.jsonl"
    args = ["--size", ",".join(map(str, sizes)), "--ops", ",".join(a.ops), "--algos", ",".join(a.hocc_algos),
            "--iters", ",".join(map(str, iters)), "--warmup", ",".join(map(str, warmups)),
            "--burst", ",".join(map(str, bursts)), "--decide-auto", "--gloo-apart", "--out", str(out)]
    env_before = dict(os.environ)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    procs: list[subprocess.Popen[bytes]] = []
    log = work / "hocc.log"
    try:
        with open(log, "wb") as f:
            procs = cluster.launch(args, a.python, a.port, str(ROOT / "bench" / "per_host_run.py"), rank0_out=f)
            emulated.wait_ranks(procs, a.timeout)
    except RuntimeError as e:
        raise RuntimeError(f"hocc: {e}; rank 0's output:\n{log.read_text()[-3000:]}") from None
    finally:
        emulated.kill_ranks(procs)
        os.environ.clear()
        os.environ.update(env_before)
    return [json.loads(line) for line in out.read_text().splitlines()]


def mpirun(cluster: emulated.Cluster, work: Path, py: Path, way: str, mca: dict[str, str], args: list[str],
           timeout: float) -> tuple[list[dict], str]:
    """One mpirun of bench/ompi_collectives.py from host 0's namespace: its JSON lines and its output."""
    out = work / f"{way}.jsonl"
    cmd = in_host0(cluster, mpirun_cmd(cluster, work, py, mca, [*args, "--way", way, "--out", str(out)]))
    # Open MPI's side gets none of hocc's environment. MCA settings go on the command line: the ranks' launcher
    # sets OMPI_MCA_mpi_yield_when_idle itself (1 here, where it counts the node's cores as oversubscribed),
    # over the same variable in mpirun's environment; a --mca setting is what reaches every rank
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "OMPI_", "HOCC_", "VIRTUAL_ENV"))}
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    log = work / f"{way}.log"
    with open(log, "w") as f:
        f.write("$ " + shlex.join(cmd) + "\n")
        f.flush()
        proc = subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"{way}: timed out after {timeout} s (log: {log})") from None
        finally:
            stop_mpirun(proc)
    text = log.read_text()
    if rc:
        raise RuntimeError(f"{way}: mpirun exit {rc}:\n{text[-3000:]}")
    return [json.loads(line) for line in out.read_text().splitlines()], text


def stop_mpirun(proc: subprocess.Popen[bytes]) -> None:
    """If mpirun still runs (a timeout, Ctrl-C): SIGTERM, which has it end its job and daemons (they run
    daemonized in the hosts' namespaces), then SIGKILL its process group after 10 s."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def run_ompi(cluster: emulated.Cluster, work: Path, py: Path, way: str, a: argparse.Namespace,
             sizes: list[int], iters: list[int], warmups: list[int], bursts: list[int]) -> list[dict]:
    args = ["--sizes", ",".join(map(str, sizes)), "--iters", ",".join(map(str, iters)),
            "--warmup", ",".join(map(str, warmups)), "--burst", ",".join(map(str, bursts)), "--ops", ",".join(a.ops)]
    rows, _ = mpirun(cluster, work, py, way, OMPI_WAYS[way], args, a.timeout)
    for row in rows:
        if row.get("kind") == "ranks":
            row["mca"] = OMPI_WAYS[way]
    return rows


def yield_check(cluster: emulated.Cluster, work: Path, py: Path, a: argparse.Namespace) -> dict[str, float]:
    """The 32 B MPI_Allreduce (tuned) with the ranks spinning (mpi_yield_when_idle 0) and yielding (1, what
    every run here uses): the median call, seconds."""
    args = ["--sizes", "32", "--iters", "20", "--warmup", "3", "--ops", "all_reduce"]
    got = {}
    for y in ("0", "1"):
        rows, _ = mpirun(cluster, work, py, f"yield{y}", {"mpi_yield_when_idle": y}, args, a.timeout)
        got[f"yield{y}"] = next(r["median_s"] for r in rows if r.get("op"))
    return got


def measure(a: argparse.Namespace, sc: emulated.Scenario, name: str, py: Path, ways: list[str], sizes: list[int],
            iters: list[int], warmups: list[int],
            bursts: list[int]) -> tuple[list[dict], dict[str, int], dict[str, float]] | None:
    """One cluster, every way in turn on it: (rows, NIC bytes per way, the yield check); None if a run failed."""
    work = Path(tempfile.mkdtemp(prefix="ompi-peer-"))
    cluster = emulated.Cluster(sc, a.rate, a.trunk_rate, pin=not a.no_pin)

    def stop(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, stop)
    rows: list[dict] = []
    nic: dict[str, int] = {}
    try:
        cluster.up()
        write_agent(work / "netns-rsh", cluster)
        print(f"# {name}: {sc.world} ranks on {sc.hosts} hosts, NIC {a.rate}; sizes {format_size(sizes[0])} .. "
              f"{format_size(sizes[-1])}; {a.rounds} round(s); work files in {work}", file=sys.stderr, flush=True)
        yields = yield_check(cluster, work, py, a)
        for rnd in range(a.rounds):
            here = work / f"round{rnd}"  # each round's own output files
            here.mkdir()
            write_agent(here / "netns-rsh", cluster)
            for way in (ways if rnd % 2 == 0 else ways[::-1]):  # the order alternates: a drift hits both ends
                print(f"# {name}: round {rnd + 1}: {way}", file=sys.stderr, flush=True)
                before, t0 = nic_bytes(cluster), time.time()
                if way == "hocc":
                    got = run_hocc(cluster, here, a, sizes, iters, warmups, bursts)
                else:
                    got = run_ompi(cluster, here, py, way, a, sizes, iters, warmups, bursts)
                rows += [r | {"round": rnd} for r in got]
                nic[way] = nic.get(way, 0) + nic_bytes(cluster) - before
                print(f"# {name}: round {rnd + 1}: {way} took {time.time() - t0:.0f} s", file=sys.stderr, flush=True)
        return rows, nic, yields
    except (KeyboardInterrupt, RuntimeError, subprocess.SubprocessError) as e:
        print(f"ompi_peer.py: stopping: {e}", file=sys.stderr)
        return None
    finally:
        cluster.down()
        if a.keep:
            shutil.copytree(work, a.keep, dirs_exist_ok=True)
        shutil.rmtree(work, ignore_errors=True)


def pool_rounds(rows: list[dict]) -> list[dict]:
    """One row per (op, size, way) from every round's: the median of all the rounds' timed calls, each round's
    median beside it (round_medians_s), the NIC bytes per call a median of the rounds'."""
    keys = sorted({(r["op"], r["size"], r["way"]) for r in rows}, key=lambda k: (OPS.index(k[0]), k[1], k[2]))
    out = []
    for key in keys:
        mine = sorted((r for r in rows if (r["op"], r["size"], r["way"]) == key), key=lambda r: r.get("round", 0))
        row = {k: v for k, v in mine[0].items() if k not in ("round", "tag")}
        row["times_s"] = [t for r in mine for t in r["times_s"]]
        row["median_s"] = statistics.median(row["times_s"])
        row["round_medians_s"] = [r["median_s"] for r in mine]
        sent = [r["nic_tx_per_call"] for r in mine if r.get("nic_tx_per_call") is not None]
        row["nic_tx_per_call"] = statistics.median(sent) if sent else None
        if "wrong" in row:
            row["wrong"] = sum(r.get("wrong", 0) for r in mine)
        if "ran" in row:
            row["ran"] = "/".join(sorted({r["ran"] for r in mine if r.get("ran")}))
        if "trial_calls" in row:
            row["trial_calls"] = [r.get("trial_calls") for r in mine]
        out.append(row)
    return out


# --------------------------------------------------------------------------------------------------- report


COLS = [("ompi_tuned", "Open MPI tuned"), ("ompi_han", "Open MPI han"), ("gloo", "gloo (native)"),
        ("auto", "hocc auto"), ("ho_ring", "hocc ho_ring")]


def cell(rows: list[dict], op: str, size: int, way: str) -> dict | None:
    return next((r for r in rows if r.get("op") == op and r.get("size") == size and r.get("way") == way), None)


def ms(sec: float) -> str:
    x = sec * 1e3
    return f"{x:.2f}" if x < 10 else f"{x:.1f}" if x < 100 else f"{x:,.0f}"


def table(doc: dict) -> list[str]:
    """One row per (op, size): each way's median call in ms, then hocc auto over the faster Open MPI and over
    gloo."""
    rows = doc["rows"]
    cols = [(w, t) for w, t in COLS if any(r.get("way") == w for r in rows)]
    head = ["size", "op", *[f"{t} (ms)" for _, t in cols], "hocc auto / best Open MPI", "hocc auto / gloo"]
    out = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    sizes = sorted({r["size"] for r in rows})
    for op in OPS:
        for size in sizes:
            cells = {w: cell(rows, op, size, w) for w, _ in cols}
            if not any(cells.values()):
                continue
            line = [format_size(size), op]
            for w, _ in cols:
                r = cells[w]
                if r is None:
                    line.append("-")
                    continue
                txt = ms(r["median_s"])
                rounds = r.get("round_medians_s") or []
                if len(rounds) > 1 and max(rounds) > NOISY * min(rounds):
                    txt += " ~"
                if w == "auto" and r.get("ran"):
                    txt += f" ({r['ran']})"
                if r.get("wrong"):
                    txt += f" **{r['wrong']} wrong**"
                line.append(txt)
            ompi = [c["median_s"] for w in ("ompi_tuned", "ompi_han") if (c := cells.get(w))]
            auto, gloo = cells.get("auto"), cells.get("gloo")
            line.append(f"{auto['median_s'] / min(ompi):.2f}" if auto and ompi else "-")
            line.append(f"{auto['median_s'] / gloo['median_s']:.2f}" if auto and gloo else "-")
            out.append("| " + " | ".join(line) + " |")
    return out


def nic_table(doc: dict) -> list[str]:
    """Bytes host 0's NIC sent per call at the largest size, over the size: which algorithm crossed the link."""
    rows = doc["rows"]
    size = max(r["size"] for r in rows)
    cols = [(w, t) for w, t in COLS if any(r.get("way") == w and r.get("nic_tx_per_call") for r in rows)]
    out = ["| op | " + " | ".join(t for _, t in cols) + " |", "|" + " --- |" * (len(cols) + 1)]
    for op in OPS:
        cells = [cell(rows, op, size, w) for w, _ in cols]
        if not any(cells):
            continue
        out.append(f"| {op} | " + " | ".join(f"{c['nic_tx_per_call'] / size:.2f}" if c and c.get("nic_tx_per_call")
                                              else "-" for c in cells) + " |")
    return out


def report(out_dir: Path) -> str:
    docs = [json.loads(p.read_text()) for p in sorted(out_dir.glob("*.json"))]
    order = {"2x4": 0, "4x2": 1}
    docs.sort(key=lambda d: (order.get(d["scenario"], 9), d["scenario"], emulated_rate_bits(d["rate"])))
    lines = [
        "# Peers: Open MPI's own collectives beside hocc and gloo, on the emulated cluster",
        "",
        "Made by [bench/ompi_peer.py](../../ompi_peer.py), one command per scenario, as root; it installs Open MPI "
        "from Debian and makes the benchmark's own virtual environment (build/ompi-venv: mpi4py, numpy) when they "
        "are missing, and takes `/tmp/hocc-bench.lock` while it runs:",
        "",
        "```sh",
        *[d["command"] for d in docs],
        ".venv/bin/python bench/ompi_peer.py --report      # rewrites this page from the JSON files",
        "```",
        "",
        *HOW,
    ]
    notes = out_dir / "notes.md"
    if notes.exists():
        lines += ["", notes.read_text().rstrip()]
    for d in docs:
        m = d["meta"]
        y = m.get("yield_check_s", {})
        lines += ["", f"## {d['scenario']} at {d['rate']}", "",
                  f"`{d['file']}`: {m['world']} ranks on {m['hosts']} hosts (`{m['spec']}`), {m['date']}, "
                  f"{m.get('rounds', 1)} round(s), {m['seconds'] // 60} min for the whole run; {m['library']}; tree at "
                  f"{m['hocc_commit']}. "
                  + ("Each host's ranks (every library's) on CPUs of their own: "
                     + ", ".join(f"host {h} on {c}" for h, c in enumerate(m["host_cpus"])) + ". "
                     if "host_cpus" in m and m["hosts"] > 1 and len(set(m["host_cpus"])) > 1 else "")
                  + (f"Yield check, the 32 B MPI_Allreduce: {ms(y['yield0'])} ms spinning, {ms(y['yield1'])} ms "
                     "yielding." if y else ""), ""]
        lines += table(d)
        lines += ["", f"Bytes host 0's NIC sent per call at {format_size(max(r['size'] for r in d['rows']))}, over the "
                  "size (median call; a flat ring ordered host by host sends 2(p-1)/p for all_reduce, (p-1)/p "
                  "for the others, p the ranks; a hierarchical one 2(H-1)/H and (H-1)/H, H the hosts):", ""]
        lines += nic_table(d)
    return "\n".join(lines) + "\n"


HOW = [
    "## How the figures are taken",
    "",
    "Each section is one scenario's run: one emulated cluster (bench/cluster.py's namespaces and shaped "
    "veths), on which hocc and gloo run, then Open MPI with `tuned`, then Open MPI with `han`, and then the "
    "three again in the reverse order (`--rounds 2`: a drift of the shared machine's load hits both ends). Times "
    "are milliseconds per call: every rank begins the call after a barrier (its library's own), a call's time "
    "is its slowest rank's (max over ranks), each figure the median of both rounds' timed calls after warm-ups "
    "(per round 20 calls up to 256 KiB, 10 up to 2 MiB, 5 up to 16 MiB, 3 above; 3, 2, 1, 1 warm-ups); `~` "
    "marks a figure whose two rounds' medians differ by more than 25%. Size is nccl-tests': the all-reduce "
    "buffer, the all-gather output, the reduce-scatter input, float32. Every result was checked once "
    "against the exact answer for Open MPI (a wrong count would show in the cell). hocc's algorithms' calls "
    "are interleaved call by call, and gloo's own come after them (bench/per_host_run.py --gloo-apart, 1 thread "
    "per rank: a gloo call between hocc's bursts made the next small hocc calls 2.5x slower); hocc auto is "
    "timed after it has decided the size's bucket (its trials, as hocc-bench does), and the parentheses name "
    "the plan it ran. The ratio columns divide hocc auto's time by the faster of Open MPI's two and by gloo's: below "
    "1, hocc is faster.",
    "",
    "Open MPI 4.1 (Debian's) runs one daemon per emulated host, started in the host's namespace by an rsh "
    "agent that runs `ip netns exec`, so each host is a node of its own; pml ob1 with byte transfer layers "
    "`self,vader,tcp`: shared memory between the ranks of one host, TCP on the host's shaped veth "
    "between hosts (`btl_tcp_if_include` the cluster's subnet), as hocc (shared memory in a host, gloo's "
    "TCP between hosts; gloo's own calls use TCP on loopback within a host). Ranks yield when idle "
    "(`--mca mpi_yield_when_idle 1`), are not bound to cores, and start from the benchmark's own "
    "environment. `han` is Open MPI 4.1's hierarchical component, given priority 100: it takes "
    "MPI_Allreduce and MPI_Allgather and hands MPI_Reduce_scatter_block on to the next component, so its "
    "reduce_scatter column is `tuned` measured a second time. The NIC tables show han ran: its all_gather "
    "sends what a hierarchical algorithm sends, tuned's two to four times that.",
]


def emulated_rate_bits(rate: str) -> float:
    mult = {"k": 1e3, "m": 1e6, "g": 1e9}
    r = rate.lower().removesuffix("bit")
    return float(r[:-1]) * mult[r[-1]] if r[-1] in mult else float(r)


# --------------------------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("scenario", nargs="?", choices=sorted(k for k, v in emulated.SCENARIOS.items() if v.hosts > 1))
    p.add_argument("--rate", default="200mbit", help="host NIC rate, as tc writes it (default 200mbit)")
    p.add_argument("--trunk-rate", default="100mbit", help="inter-switch trunk (2x2x2)")
    p.add_argument("-b", "--min-bytes", default="32")
    p.add_argument("-e", "--max-bytes", default="64M")
    p.add_argument("-f", "--factor", type=int, default=8)
    p.add_argument("--ops", default=",".join(OPS))
    p.add_argument("--hocc-algos", default=",".join(HOCC_ALGOS), help="hocc's ways beside gloo's own call")
    p.add_argument("--ways", default="hocc,ompi_tuned,ompi_han", help="which runs (hocc = hocc and gloo)")
    p.add_argument("--rounds", type=int, default=2,
                   help="run every way this many times on the one cluster, the order reversed each round; the "
                        "figures pool the rounds' calls (default 2)")
    p.add_argument("--python", default=sys.executable, help="interpreter with hocc installed (hocc's side)")
    p.add_argument("--venv", type=Path, default=VENV, help="Open MPI's side: mpi4py and numpy (made if missing)")
    p.add_argument("--port", type=int, default=29650)
    p.add_argument("--no-pin", action="store_true",
                   help="let every rank run on any CPU (default: each host's ranks on CPUs of their own)")
    p.add_argument("--timeout", type=float, default=3600, help="per run, seconds")
    p.add_argument("--out-dir", type=Path, default=OUT_DIR)
    p.add_argument("--name", help="the JSON's name (default <scenario>-<rate>)")
    p.add_argument("--report", action="store_true", help="only rewrite --out-dir/README.md from its JSON files")
    p.add_argument("--keep", type=Path, help="keep the run's work files (logs, hostfile, agent) here")
    a = p.parse_args(argv)
    if a.report:
        (a.out_dir / "README.md").write_text(report(a.out_dir))
        return 0
    if a.scenario is None:
        p.error("name a scenario (or --report)")
    a.ops = a.ops.split(",")
    a.hocc_algos = a.hocc_algos.split(",")
    ways = a.ways.split(",")
    sizes = sweep(parse_size(a.min_bytes), parse_size(a.max_bytes), a.factor)
    iters, warmups, bursts = zip(*map(counts, sizes), strict=True)
    emulated.ensure_tools()
    ensure_open_mpi()
    py = ensure_venv(a.venv)
    sc = emulated.SCENARIOS[a.scenario]
    name = a.name or f"{a.scenario}-{a.rate}"
    given = list(sys.argv[1:] if argv is None else argv)
    if "--keep" in given:  # where the logs were copied: not part of what was measured
        del given[given.index("--keep"):given.index("--keep") + 2]
    command = "sudo .venv/bin/python bench/ompi_peer.py " + shlex.join(given)

    with open(LOCK, "w") as lock:  # one benchmark at a time on a shared machine (docs/testbed.md)
        print(f"# waiting for {LOCK}", file=sys.stderr, flush=True)
        fcntl.flock(lock, fcntl.LOCK_EX)
        started = time.time()
        got = measure(a, sc, name, py, ways, sizes, list(iters), list(warmups), list(bursts))
    if got is None:
        return 1
    rows, nic, yields = got
    ranks = [r for r in rows if r.get("kind") == "ranks"]
    rows = pool_rounds([r for r in rows if r.get("kind") != "ranks"])
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    pins = emulated.Cluster(sc, a.rate, a.trunk_rate, pin=not a.no_pin)  # the CPUs measure() ran each host on
    meta = {
        "world": sc.world, "hosts": sc.hosts, "rate": a.rate, "spec": sc.spec(a.rate, a.trunk_rate),
        "sizes": sizes, "iters": list(iters), "warmups": list(warmups), "bursts": list(bursts), "ways": ways,
        "rounds": a.rounds, "host_cpus": [pins.host_cpus(h) for h in range(sc.hosts)],
        "date": datetime.date.today().isoformat(), "seconds": round(time.time() - started),
        "machine": f"{platform.node()}, {os.cpu_count()} CPUs, {platform.platform()}",
        "library": ranks[0]["library"].split(",")[0] if ranks else "-",
        "hocc_commit": commit, "nic_bytes": nic,
        "yield_check_s": yields, "ompi_ranks": ranks,
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS", "1 (set by this script)"),
    }
    doc = {"schema": "hocc-ompi-peer/1", "scenario": a.scenario, "rate": a.rate, "file": f"{name}.json",
           "command": command, "meta": meta, "rows": rows}
    a.out_dir.mkdir(parents=True, exist_ok=True)
    (a.out_dir / f"{name}.json").write_text(json.dumps(doc, indent=1) + "\n")
    (a.out_dir / "README.md").write_text(report(a.out_dir))
    print("\n".join([*table(doc), "", *nic_table(doc)]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
