#!/usr/bin/env python3
"""The fault matrix: one rank of a 2x2 job (two emulated hosts of two ranks)
is killed, stopped (SIGSTOP), raises, or has its host's link cut (ip link set
down, on the emulated cluster), during the host stage or the rail stage of a
ho_ring all_reduce, with the host stages in shared memory or over gloo.

In every cell, every surviving rank must raise hocc.CollectiveError within
the group's timeout + 10 s, a second call must raise at once, the caller's
tensor must be unchanged, no surviving process may crash, and /dev/shm must
hold no hocc segment afterwards.

    bench/faults.py [--timeout 4] [--out bench/results/faults.md]   (cut cells need root)

Each rank runs this file with --rank-main; the faulty rank arms its engine's
fault hook (Executor::inject_fault), which acts on reaching the stage."""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from hocc.bench import emulated

REPO = Path(__file__).resolve().parents[2]  # the checkout whose hocc the ranks import
FAULTS = ("kill", "stop", "raise", "cut")
WHERE = {"host": 0, "rail": 1}  # the stages of ho_ring's all_reduce on 2x2: host RS, rail AR, host AG
TRANSPORTS = ("shm", "net")
WORLD = 4
VICTIM = {"kill": 1, "stop": 1, "raise": 1, "cut": 2}  # not rank 0, whose process holds the store
LINK = "hocc-v1"  # the cut host's (host 1: ranks 2, 3) veth, inside its namespace


@dataclass(frozen=True)
class Cell:
    fault: str
    where: str
    transport: str

    @property
    def name(self) -> str:
        return f"{self.fault}-{self.where}-{self.transport}"


def cells(with_cut: bool) -> list[Cell]:
    return [Cell(f, w, t) for f in FAULTS if with_cut or f != "cut" for w in WHERE for t in TRANSPORTS]


def shm_entries(pids: list[int]) -> set[str]:
    """This cell's hocc segments in /dev/shm: their names start with the creating rank's pid
    (cells run side by side, and another cell's segment lives for milliseconds during its set-up)."""
    try:
        return {n for n in os.listdir("/dev/shm") if any(n.startswith(f"hocc-{p}-") for p in pids)}
    except FileNotFoundError:
        return set()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- one rank -------------------------------------------------------------------
def rank_main(a: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    import hocc
    from hocc.engine.group_engines import get_engine

    torch.set_num_threads(1)
    # ranks start with a generous rendezvous (one started late on a loaded machine is not the fault under
    # test), then the group runs under the matrix's timeout, which hocc's engine takes from it
    dist.init_process_group("gloo", timeout=timedelta(seconds=max(a.timeout, 60)))
    from torch.distributed.distributed_c10d import _set_pg_timeout
    _set_pg_timeout(timedelta(seconds=a.timeout), dist.group.WORLD)
    rank = dist.get_rank()
    x = torch.arange(a.count, dtype=torch.float32) + rank
    want = x.clone()
    dist.all_reduce(want)
    got = x.clone()
    hocc.all_reduce(got, algo="ho_ring")  # sets up every communicator
    warm_ok = torch.equal(got, want)
    world = dist.group.WORLD
    assert world is not None
    plan = get_engine(world, torch.device("cpu")).last_plan
    carriers = sorted(set(plan.meta.get("transports", {}).values())) if plan is not None else []
    if rank == a.victim:
        def cut() -> None:  # this host's link down, mid-call; the step then goes on over a dead link
            subprocess.run(["ip", "link", "set", "dev", LINK, "down"], check=True)

        action, hook = ("call", cut) if a.fault == "cut" else (a.fault, None)
        get_engine(world, torch.device("cpu")).inject_fault(a.stage, action, hook)
    y = x.clone()
    t0 = time.monotonic()
    err: BaseException | None = None
    try:
        hocc.all_reduce(y, algo="ho_ring")
    except Exception as e:  # noqa: BLE001 - what the cell records
        err = e
    raised_s = time.monotonic() - t0
    t1 = time.monotonic()
    again: BaseException | None = None
    try:
        hocc.all_reduce(x.clone(), algo="ho_ring")
    except Exception as e:  # noqa: BLE001
        again = e
    res = {"rank": rank, "warm_ok": warm_ok, "error": type(err).__name__ if err else None,
           "message": str(err) if err else "", "raised_s": raised_s, "unchanged": torch.equal(y, x),
           "again": type(again).__name__ if again else None, "again_s": time.monotonic() - t1,
           "transports": carriers}
    Path(a.out, f"rank{rank}.json").write_text(json.dumps(res))
    os._exit(0)  # the group is broken: no destroy_process_group (it would wait on the dead)


# -- one cell -------------------------------------------------------------------
def run_cell(cell: Cell, timeout_s: float, count: int, python: str = sys.executable) -> dict[str, Any]:
    """Run one cell; its outcome per rank and whether it passed. A cell whose world never formed because its
    store's port was taken meanwhile (cells run side by side, and free_port's port is free only when asked:
    another cell's socket may take it first) runs once more on a new port: no fault ran in it."""
    result = _run_cell_once(cell, timeout_s, count, python)
    if not result["passed"] and any("EADDRINUSE" in tail for tail in result["stderr"].values()):
        result = _run_cell_once(cell, timeout_s, count, python)
    return result


def _run_cell_once(cell: Cell, timeout_s: float, count: int, python: str) -> dict[str, Any]:
    out = tempfile.mkdtemp(prefix=f"hocc-faults-{cell.name}-")
    victim = VICTIM[cell.fault]
    args = ["--rank-main", "--out", out, "--fault", cell.fault, "--stage", str(WHERE[cell.where]),
            "--victim", str(victim), "--timeout", str(timeout_s), "--count", str(count)]
    env = dict(os.environ, HOCC_HOST_TRANSPORT=cell.transport, PYTHONPATH=str(REPO))
    cluster = None
    port = free_port()
    if cell.fault == "cut":
        cluster = emulated.Cluster(emulated.Scenario("2x2", 2, 2, 1, False), "1gbit", "1gbit")
        cluster.up()
        os.environ.update({"HOCC_HOST_TRANSPORT": cell.transport, "PYTHONPATH": str(REPO)})
        procs = cluster.launch(args, python, port, script=str(Path(__file__).resolve()))
    else:
        procs = []
        for r in range(WORLD):
            e = dict(env, RANK=str(r), WORLD_SIZE=str(WORLD), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                     HOCC_TOPOLOGY="2x2")
            with open(Path(out, f"rank{r}.stderr"), "wb") as err_file:  # a pipe nobody reads could block a rank
                procs.append(subprocess.Popen([python, __file__, *args], env=e, start_new_session=True,
                                              stdout=subprocess.DEVNULL, stderr=err_file))
    survivors = [r for r in range(WORLD) if not (cell.fault in ("kill", "stop") and r == victim)]
    deadline = time.monotonic() + 90 + timeout_s  # start-up on a loaded machine, then the fault
    try:
        while time.monotonic() < deadline:
            if all(Path(out, f"rank{r}.json").exists() for r in survivors):
                break
            if any(procs[r].poll() not in (None, 0) for r in survivors):
                break  # a survivor crashed
            time.sleep(0.2)
        time.sleep(0.5)
    finally:
        codes = [p.poll() for p in procs]
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        if cluster is not None:
            cluster.down()
    ranks: dict[int, Any] = {}
    for r in range(WORLD):
        f = Path(out, f"rank{r}.json")
        ranks[r] = json.loads(f.read_text()) if f.exists() else None
    limit = timeout_s + 10
    ok_ranks = [ranks[r] is not None and ranks[r]["error"] is not None and ranks[r]["raised_s"] <= limit
                and ranks[r]["again"] is not None and ranks[r]["again_s"] < 1.0 and ranks[r]["unchanged"]
                and ranks[r]["warm_ok"] for r in survivors]
    crashed = [r for r in survivors if codes[r] not in (None, 0)]
    leaked = sorted(shm_entries([p.pid for p in procs]))
    times = [ranks[r]["raised_s"] for r in survivors if ranks[r] is not None]
    first = next((ranks[r]["message"] for r in survivors if ranks[r] is not None and ranks[r]["message"]), "")
    stderr = {r: _tail(Path(out, f"rank{r}.stderr")) for r in survivors if ranks[r] is None or r in crashed}
    return {"cell": cell.name, "fault": cell.fault, "where": cell.where, "transport": cell.transport,
            "victim": victim, "survivors": survivors, "raised": sum(ok_ranks), "max_raise_s": max(times, default=None),
            "limit_s": limit, "crashed": crashed, "shm_leaked": leaked, "ranks": ranks, "example": first,
            "stderr": stderr,
            "passed": all(ok_ranks) and not crashed and not leaked and len(ok_ranks) == len(survivors)}


def _tail(path: Path, chars: int = 1500) -> str:
    """The end of a rank's stderr (what a crashed or silent survivor said)."""
    try:
        return path.read_text(errors="replace")[-chars:]
    except FileNotFoundError:
        return ""


def run_matrix(timeout_s: float, count: int, with_cut: bool, parallel: int = 6) -> list[dict[str, Any]]:
    """Local cells `parallel` at a time (they mostly wait on timeouts); cut cells one by one (one emulated cluster)."""
    local = [c for c in cells(with_cut) if c.fault != "cut"]
    with ThreadPoolExecutor(parallel) as pool:
        results = list(pool.map(lambda c: run_cell(c, timeout_s, count), local))
    results += [run_cell(c, timeout_s, count) for c in cells(with_cut) if c.fault == "cut"]
    return results


def table(results: list[dict[str, Any]], timeout_s: float) -> str:
    lines = [f"Fault matrix: 2x2, ho_ring all_reduce, group timeout {timeout_s:g} s (limit: timeout + 10 s)", "",
             "| fault | stage | host stages | survivors raised | slowest raise (s) | later call raises at once "
             "| crashed | /dev/shm left | result |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in results:
        again = all(x is not None and x["again"] for x in (r["ranks"][s] for s in r["survivors"]))
        slow = f"{r['max_raise_s']:.1f}" if r["max_raise_s"] is not None else "-"
        lines.append(f"| {r['fault']} | {r['where']} | {r['transport']} | {r['raised']}/{len(r['survivors'])} | "
                     f"{slow} | {'yes' if again else 'no'} | {r['crashed'] or 'none'} | "
                     f"{len(r['shm_leaked'])} | {'pass' if r['passed'] else 'FAIL'} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rank-main", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", default="")
    p.add_argument("--fault", choices=FAULTS, default="kill")
    p.add_argument("--stage", type=int, default=0)
    p.add_argument("--victim", type=int, default=1)
    p.add_argument("--timeout", type=float, default=4.0, help="the group's timeout, seconds")
    p.add_argument("--count", type=int, default=65536, help="float32 elements per rank")
    p.add_argument("--no-cut", action="store_true", help="skip the link-cut cells (they need root)")
    p.add_argument("--json", default="", help="also write every cell's outcome here")
    a = p.parse_args(argv)
    if a.rank_main:
        rank_main(a)
        return 0
    with_cut = not a.no_cut and os.geteuid() == 0
    results = run_matrix(a.timeout, a.count, with_cut)
    text = table(results, a.timeout)
    print(text)
    for r in results:
        if not r["passed"]:
            print(f"{r['cell']}: {json.dumps(r['ranks'])[:2000]}", file=sys.stderr)
            for rank, text in r["stderr"].items():
                print(f"{r['cell']} rank {rank} stderr:\n{text}", file=sys.stderr)
    if a.out:
        Path(a.out).write_text(text + "\nExample message (a survivor's):\n\n    " + (results[0]["example"] if results
                                                                                       else "") + "\n")
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))
    return 0 if all(r["passed"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
