#!/usr/bin/env python3
"""An emulated multi-host cluster on one machine (docs/testbed.md), running hocc-bench.

One network namespace per emulated host; the ranks of a host share it and talk
over its loopback (unshaped). Each host has a veth into a Linux bridge (one
bridge per emulated switch), shaped with tc tbf in both directions, so the host
NIC is full duplex at --rate. Two switches are joined by a trunk veth shaped at
--trunk-rate. Every name is created fresh (the run refuses if one exists) and
removed on exit, on error and on Ctrl-C.

    sudo bench/cluster.py 2x4 [--rate 200mbit] -- -b 1M -e 64M --op all --algo native,ho_ring

Needs root and iproute2 (installed with apt-get if missing).
"""

from __future__ import annotations

import argparse
import itertools
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import IO

# tc's token bucket per NIC and trunk: the cost model's default burst for those links is this
# (hocc.topology.links.LinkModel; tests/test_cost_model.py holds them equal). Not read from there:
# bench/regression.py runs this file with an older commit's hocc on the path.
TBF_BURST = "64kb"

PREFIX = "hocc"
SUBNET = "10.77.0"


@dataclass(frozen=True)
class Scenario:
    name: str
    hosts: int
    ranks_per_host: int
    switches: int
    scattered: bool
    sizes: tuple[int, ...] = ()  # hosts of unequal size ('3+5'), ranks numbered host by host; one switch

    @property
    def world(self) -> int:
        return sum(self.sizes) if self.sizes else self.hosts * self.ranks_per_host

    def host_of(self, rank: int) -> int:
        if self.sizes:
            return next(h for h, end in enumerate(itertools.accumulate(self.sizes)) if rank < end)
        return rank % self.hosts if self.scattered else rank // self.ranks_per_host

    def switch_of_host(self, host: int) -> int:
        return host // (self.hosts // self.switches)

    def spec(self, rate: str, trunk: str) -> str:
        if self.sizes:
            return "+".join(map(str, self.sizes)) + f"@nic={rate}"
        if self.hosts == 1:
            return str(self.ranks_per_host)
        shape = (f"{self.switches}x{self.hosts // self.switches}x{self.ranks_per_host}" if self.switches > 1
                 else f"{self.hosts}x{self.ranks_per_host}")
        if self.scattered:
            shape += ":scattered"
        links = f"nic={rate}" + (f",trunk={trunk}" if self.switches > 1 else "")
        return f"{shape}@{links}"


SCENARIOS = {
    "flat8": Scenario("flat8", 1, 8, 1, False),
    "2x4": Scenario("2x4", 2, 4, 1, False),
    "4x2": Scenario("4x2", 4, 2, 1, False),
    "2x4-scattered": Scenario("2x4-scattered", 2, 4, 1, True),
    "2x2x2": Scenario("2x2x2", 4, 2, 2, False),
    "3+5": Scenario("3+5", 2, 0, 1, False, (3, 5)),
    "4+4+3": Scenario("4+4+3", 3, 0, 1, False, (4, 4, 3)),
    "1+7": Scenario("1+7", 2, 0, 1, False, (1, 7)),
}


def sh(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), check=check, capture_output=True, text=True)


def tbf(dev: str, rate: str, netns: str | None = None) -> None:
    """Shape `dev`'s egress to `rate` (token bucket; netem is not available here)."""
    cmd = ["tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", rate, "burst", TBF_BURST, "latency", "100ms"]
    sh(*(["ip", "netns", "exec", netns, *cmd] if netns else cmd))


class Cluster:
    def __init__(self, sc: Scenario, rate: str, trunk: str, host_rates: dict[int, str] | None = None,
                 pin: bool = True) -> None:
        self.sc, self.rate, self.trunk = sc, rate, trunk
        self.host_rates = dict(host_rates or {})  # hosts whose NIC is shaped otherwise (a planted slow NIC)
        self.pin = pin  # each host's ranks on CPUs of its own (host_cpus)
        self.namespaces = [f"{PREFIX}-h{h}" for h in range(sc.hosts)]
        self.bridges = [f"{PREFIX}-br{s}" for s in range(sc.switches)]
        self.made: list[tuple[str, str]] = []  # ("netns" | "link", name), in the order up() made them

    def host_cpus(self, h: int) -> str:
        """The CPUs host h's ranks run on, as taskset's list: a share of this machine's of its own, as a real
        host's cores are (with fewer CPUs than hosts, hosts h and h + ncpu share one). Unpinned, the kernel
        moves a rank that slept to whichever core is idle, so one host's ranks can crowd a core for tens of
        milliseconds (the balancer runs every few 4 ms ticks), which no real cluster does; ranks that poll and
        never sleep (Open MPI's) are seldom moved (docs/testbed.md, "One host, its own CPUs")."""
        cpus = sorted(os.sched_getaffinity(0))
        if not self.pin or self.sc.hosts == 1:
            mine = cpus
        elif self.sc.hosts >= len(cpus):
            mine = [cpus[h % len(cpus)]]
        else:
            mine = cpus[h * len(cpus) // self.sc.hosts:(h + 1) * len(cpus) // self.sc.hosts]
        return ",".join(map(str, mine))

    def names_in_use(self) -> list[str]:
        used = set(sh("ip", "netns", "list", check=False).stdout.split())
        links = sh("ip", "-o", "link", "show", check=False).stdout
        taken = [n for n in self.namespaces if n in used]
        taken += [b for b in self.bridges if f" {b}:" in links or f" {b}@" in links]
        return taken

    def up(self) -> None:
        taken = self.names_in_use()
        if taken:
            raise SystemExit(f"cluster.py: {', '.join(taken)} already exist (another run, or a crashed one); "
                             f"remove them with: bench/cluster.py --cleanup")
        for br in self.bridges:
            sh("ip", "link", "add", br, "type", "bridge")
            self.made.append(("link", br))
            sh("ip", "link", "set", br, "up")
        for h, ns in enumerate(self.namespaces):
            sh("ip", "netns", "add", ns)
            self.made.append(("netns", ns))
            sh("ip", "-n", ns, "link", "set", "lo", "up")
            if self.sc.hosts == 1:
                continue
            inner, outer = f"{PREFIX}-v{h}", f"{PREFIX}-v{h}b"
            sh("ip", "link", "add", outer, "type", "veth", "peer", "name", inner)
            self.made.append(("link", outer))
            sh("ip", "link", "set", inner, "netns", ns)
            sh("ip", "link", "set", outer, "master", self.bridges[self.sc.switch_of_host(h)])
            sh("ip", "link", "set", outer, "up")
            sh("ip", "-n", ns, "addr", "add", f"{SUBNET}.{h + 1}/24", "dev", inner)
            sh("ip", "-n", ns, "link", "set", inner, "up")
            rate = self.host_rates.get(h, self.rate)
            tbf(inner, rate, ns)   # host -> switch
            tbf(outer, rate)       # switch -> host
        if self.sc.switches > 1:
            a, b = f"{PREFIX}-t0", f"{PREFIX}-t1"
            sh("ip", "link", "add", a, "type", "veth", "peer", "name", b)
            self.made.append(("link", a))  # its peer goes with it
            for end, br in ((a, self.bridges[0]), (b, self.bridges[1])):
                sh("ip", "link", "set", end, "master", br)
                sh("ip", "link", "set", end, "up")
                tbf(end, self.trunk)

    def down(self) -> None:
        """Remove what this cluster made, last first: never another run's (an up() that found the names
        taken made nothing, and its caller's teardown must not remove that run's bridges and namespaces)."""
        while self.made:
            kind, name = self.made.pop()
            sh("ip", *(("netns", "del") if kind == "netns" else ("link", "del")), name, check=False)

    def launch(self, bench_args: list[str], python: str, port: int, script: str | None = None,
               rank0_out: IO[bytes] | None = None) -> list[subprocess.Popen[bytes]]:
        """Start every rank; rank 0 prints (to this process's stdout and stderr, or to `rank0_out`), the others
        are quiet."""
        sc = self.sc
        master = "127.0.0.1" if sc.hosts == 1 else f"{SUBNET}.{sc.host_of(0) + 1}"
        procs = []
        for r in range(sc.world):
            h = sc.host_of(r)
            env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(sc.world),
                       LOCAL_RANK=str([x for x in range(sc.world) if sc.host_of(x) == h].index(r)),
                       MASTER_ADDR=master, MASTER_PORT=str(port),
                       HOCC_TOPOLOGY=sc.spec(self.rate, self.trunk), PYTHONUNBUFFERED="1")
            env["GLOO_SOCKET_IFNAME"] = "lo" if sc.hosts == 1 else f"{PREFIX}-v{h}"
            prog = [script] if script else ["-m", "hocc.bench", "--device", "cpu"]
            # a hostname of its own per host (a UTS namespace): hocc groups ranks into hosts by hostname, so a
            # run without HOCC_TOPOLOGY detects the emulated hosts, as it would real ones
            cmd = ["taskset", "-c", self.host_cpus(h), "ip", "netns", "exec", self.namespaces[h],
                   "unshare", "--uts", "sh", "-c", f'hostname {PREFIX}-host{h} && exec "$@"', "sh",
                   python, *prog, *bench_args]
            out = subprocess.DEVNULL if r != 0 else rank0_out
            # a process group of its own (kill_ranks ends it whole), but not a session: with the kernel's
            # autogroups (sched_autogroup_enabled) each session is a scheduling group of its own, so ranks
            # started with setsid share the cores group against group and a waiting rank's sched_yield()
            # never hands its core to another rank. torchrun's and mpirun's ranks share one session
            # (docs/testbed.md, "Measuring fairly")
            if sys.version_info >= (3, 11):
                procs.append(subprocess.Popen(cmd, env=env, stdout=out, stderr=out, process_group=0))
            else:  # Python 3.10's Popen has no process_group
                procs.append(subprocess.Popen(cmd, env=env, stdout=out, stderr=out, preexec_fn=os.setpgrp))
        return procs


def nic_tx_bytes() -> int | None:
    """Bytes the emulated host's NIC (hocc-v<h>, seen from inside its namespace) has sent so far; None outside
    one. `ip netns exec` mounts the namespace's own /sys, so a rank reads its host's counter."""
    try:
        devs = sorted(d for d in os.listdir("/sys/class/net") if d.startswith(f"{PREFIX}-v") and not d.endswith("b"))
        if not devs:
            return None
        with open(f"/sys/class/net/{devs[0]}/statistics/tx_bytes") as f:
            return int(f.read())
    except OSError:
        return None


def per_size(text: str, n: int, who: str) -> list[int]:
    """A rank program's per-size count option (--iters, --warmup): one number for every one of the n
    sizes, or a comma list of one per size; `who` names the program in the error."""
    xs = [int(x) for x in text.split(",")]
    if len(xs) == 1:
        xs *= n
    if len(xs) != n:
        raise SystemExit(f"{who}: {text!r}: give one number or one per size ({n})")
    return xs


def wait_ranks(procs: list[subprocess.Popen[bytes]], timeout: float) -> None:
    """Wait for every rank to exit 0; RuntimeError as soon as one fails, or after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while any(pr.poll() is None for pr in procs):
        if any(pr.poll() not in (None, 0) for pr in procs):
            raise RuntimeError("a rank failed: " + ", ".join(f"rank {i} exit {pr.returncode}"
                                                             for i, pr in enumerate(procs) if pr.returncode))
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout} s")
        time.sleep(0.2)
    bad = [i for i, pr in enumerate(procs) if pr.returncode]
    if bad:
        raise RuntimeError(f"ranks {bad} failed")


def kill_ranks(procs: list[subprocess.Popen[bytes]]) -> None:
    """Kill what is left of the ranks (each in a session of its own) and reap them."""
    for pr in procs:
        if pr.poll() is None:
            os.killpg(pr.pid, signal.SIGKILL)
    for pr in procs:
        pr.wait()


def cleanup_all() -> None:
    for ns in sh("ip", "netns", "list", check=False).stdout.split():
        if ns.startswith(f"{PREFIX}-h"):
            sh("ip", "netns", "del", ns, check=False)
    for line in sh("ip", "-o", "link", "show", check=False).stdout.splitlines():
        name = line.split(":")[1].strip().split("@")[0]
        if name.startswith(f"{PREFIX}-"):
            sh("ip", "link", "del", name, check=False)


def ensure_tools() -> None:
    if os.geteuid() != 0:
        raise SystemExit("cluster.py: needs root (network namespaces, bridges, tc); run it with sudo")
    if shutil.which("ip") is None or shutil.which("tc") is None:
        print("# installing iproute2", file=sys.stderr)
        subprocess.run(["apt-get", "update", "-qq"], check=True)
        subprocess.run(["apt-get", "install", "-y", "-qq", "iproute2"], check=True)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    bench_args: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, bench_args = argv[:i], argv[i + 1:]
    p = argparse.ArgumentParser(prog="bench/cluster.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("scenario", nargs="?", choices=sorted(SCENARIOS))
    p.add_argument("--rate", default="200mbit", help="host NIC rate, as tc writes it (default 200mbit)")
    p.add_argument("--host-rate", action="append", default=[], metavar="H=RATE",
                   help="shape host H's NIC at RATE instead (a slow NIC; HOCC_TOPOLOGY still says --rate); repeatable")
    p.add_argument("--trunk-rate", default="100mbit", help="inter-switch trunk rate (2x2x2; default 100mbit)")
    p.add_argument("--python", default=sys.executable, help="interpreter with hocc installed")
    p.add_argument("--port", type=int, default=29650)
    p.add_argument("--timeout", type=float, default=3600, help="give up after this many seconds")
    p.add_argument("--no-pin", action="store_true",
                   help="let every rank run on any CPU (default: each host's ranks on CPUs of their own)")
    p.add_argument("--cleanup", action="store_true", help="remove leftovers of a crashed run and exit")
    p.add_argument("--script", help="run this Python script on every rank instead of hocc-bench (torchrun's "
                                    "environment: RANK, WORLD_SIZE, MASTER_ADDR, ...); arguments after --")
    a = p.parse_args(argv)
    ensure_tools()
    if a.cleanup:
        cleanup_all()
        return 0
    if a.scenario is None:
        p.error("name a scenario")
    sc = SCENARIOS[a.scenario]
    try:
        host_rates = {int(h): r for h, r in (x.split("=", 1) for x in a.host_rate)}
    except ValueError:
        p.error("--host-rate takes H=RATE, e.g. 2=50mbit")
    if any(not 0 <= h < sc.hosts for h in host_rates):
        p.error(f"--host-rate: scenario {sc.name} has hosts 0..{sc.hosts - 1}")
    cluster = Cluster(sc, a.rate, a.trunk_rate, host_rates, pin=not a.no_pin)
    procs: list[subprocess.Popen[bytes]] = []

    def stop(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, stop)
    try:
        cluster.up()
        ranks = "+".join(map(str, sc.sizes)) if sc.sizes else str(sc.ranks_per_host)
        print(f"# scenario {sc.name}: {sc.hosts} hosts x {ranks} ranks, {sc.switches} switch(es), "
              f"NIC {a.rate}" + "".join(f", host {h} NIC {r}" for h, r in sorted(host_rates.items()))
              + (f", trunk {a.trunk_rate}" if sc.switches > 1 else "")
              + f"; HOCC_TOPOLOGY={sc.spec(a.rate, a.trunk_rate)}", flush=True)
        procs = cluster.launch(bench_args, a.python, a.port, a.script)
        wait_ranks(procs, a.timeout)
        return 0
    except (KeyboardInterrupt, RuntimeError) as e:
        print(f"cluster.py: stopping: {e}", file=sys.stderr)
        return 1
    finally:
        kill_ranks(procs)
        cluster.down()


if __name__ == "__main__":
    sys.exit(main())
