"""hocc-bench: arguments and sweeps, bandwidth arithmetic, the JSON schema, a
short real run, and the emulated cluster's set-up and teardown."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from hocc.bench.cli import build_parser, spec_from_args
from hocc.bench.collectives import COLLECTIVES, bandwidths
from hocc.bench.report import load_json, to_json
from hocc.bench.runner import Row
from hocc.bench.sizes import format_size, parse_size, sweep
from hocc.plan.registry import names
from tests.worlds import run_world

ROOT = Path(__file__).resolve().parents[1]


def test_sizes() -> None:
    assert parse_size("64K") == 65536 and parse_size("1M") == 1 << 20 and parse_size("2G") == 2 << 30
    assert parse_size("100") == 100 and parse_size("8k") == 8192
    with pytest.raises(ValueError, match="cannot parse size"):
        parse_size("1.5M")
    assert sweep(65536, 1 << 20, 4) == [65536, 262144, 1 << 20]
    assert sweep(1000, 4000, 2, stepbytes=1000) == [1000, 2000, 3000, 4000]
    assert sweep(8, 8) == [8]
    with pytest.raises(ValueError):
        sweep(10, 5)


def test_format_size() -> None:
    assert [format_size(n) for n in (100, 4096, 1536, 64 << 20, 3 << 30)] == ["100 B", "4 KiB", "1536 B", "64 MiB",
                                                                               "3 GiB"]
    # summarize.py's form: 64 MiB rounded down to a multiple of 11 ranks is marked, not printed as 63 MiB
    assert format_size((64 << 20) // 11 * 11, approx=True) == "~64 MiB"
    assert format_size(64 << 20, approx=True) == "64 MiB" and format_size(1000, approx=True) == "1000 B"


def test_json_round_trip(tmp_path: Path) -> None:
    rows = [Row("all_reduce", 4096, 1024, "float32", "sum", "auto", "ho_ring", 12.5, 0.3, 0.5, 0, 0.1,
                trial_calls=3, trial_s=0.02),
            Row("all_gather", 4096, 128, "float32", "none", "native", "native", 20.0, 0.2, 0.15, 0, 0.05,
                skew_us=4.0, late_us=[0.0, 4.0], late_rank=1)]
    meta = {"world": 2, "topology": "2x1@nic=1gbit", "algos": ["native", "auto"]}
    path = tmp_path / "r.json"
    path.write_text(to_json(rows, meta, {("all_reduce", 4096): 1e-5}))
    assert load_json(path) == (meta, [{**rows[0].to_dict(), "bound_us": 1e-5 * 1e6},
                                      {**rows[1].to_dict(), "bound_us": None}])
    (tmp_path / "other.json").write_text(json.dumps({"schema": "hocc-faults/1", "results": []}))
    with pytest.raises(ValueError, match=r"other\.json: not a hocc-bench sweep \(hocc-bench/1\)"):
        load_json(tmp_path / "other.json")
    (tmp_path / "cut.json").write_text('{"schema": "hocc-bench/1", ')
    with pytest.raises(ValueError, match=r"cut\.json: not JSON"):
        load_json(tmp_path / "cut.json")


def _slowest_ranks(rank: int, world: int) -> None:
    from hocc.bench.runner import slowest

    assert slowest(float(rank)) == world - 1
    assert slowest([float(rank), -float(rank)]) == [world - 1, 0.0]  # each entry its own maximum
    t = torch.tensor([[rank, 7.0], [1.0, -rank]], dtype=torch.float64)
    assert slowest(t) is t and t.tolist() == [[world - 1, 7.0], [1.0, 0.0]]  # in place


def test_slowest_over_ranks() -> None:
    run_world(2, _slowest_ranks)


def test_arguments() -> None:
    a = build_parser().parse_args(["-b", "1K", "-e", "4K", "-f", "2", "-n", "3", "-w", "0", "-d", "half",
                                   "-o", "max", "--op", "all", "--algo", "native,ho_ring,auto"])
    spec = spec_from_args(a)
    assert spec.sizes == (1024, 2048, 4096) and spec.iters == 3 and spec.warmup == 0
    assert spec.ops == ("all_reduce", "all_gather", "reduce_scatter") and spec.redop == "max"
    assert spec.algos == ("native", "ho_ring", "auto") and str(spec.dtype) == "torch.float16"
    for bad in (["--algo", "tree"], ["--op", "broadcast"], ["-d", "complex"], ["-o", "xor"],
                ["-d", "int32", "-o", "avg"], ["-b", "4K", "-e", "1K"]):
        with pytest.raises(SystemExit):
            spec_from_args(build_parser().parse_args(bad))


def test_busbw_arithmetic() -> None:
    # nccl-tests: algbw = S / t; busbw = algbw * 2(W-1)/W (all-reduce), * (W-1)/W otherwise
    assert bandwidths("all_reduce", 1_000_000_000, 1.0, 8) == pytest.approx((1.0, 1.75))
    assert bandwidths("all_gather", 2_000_000_000, 0.5, 4) == pytest.approx((4.0, 3.0))
    assert bandwidths("reduce_scatter", 1_000_000_000, 2.0, 2) == pytest.approx((0.5, 0.25))
    assert COLLECTIVES["all_gather"].counts(4096, 4, 8) == (128, 1024)
    assert COLLECTIVES["reduce_scatter"].counts(4096, 4, 8) == (1024, 128)
    assert COLLECTIVES["all_reduce"].counts(4096, 4, 8) == (1024, 1024)


def _bench(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hocc.bench", *args], capture_output=True, text=True,
                          timeout=600, cwd=ROOT, env={**os.environ, **(env or {})})


def test_short_real_run(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    png = tmp_path / "r.png"
    res = _bench("--nprocs", "4", "--topology", "2x2@nic=1gbit", "-b", "4K", "-e", "64K", "-f", "4", "-n", "2",
                 "-w", "1", "--op", "all", "--algo", "native,ring,ho_ring,auto", "--json", str(out), "--plot", str(png))
    assert res.returncode == 0, res.stderr[-3000:]
    assert "# Out of bounds values : 0 OK" in res.stdout
    assert "ho_ring / native busbw" in res.stdout and "link bound" in res.stdout
    assert "[3/9]" in res.stderr  # progress on stderr
    doc = json.loads(out.read_text())
    assert doc["schema"] == "hocc-bench/1"
    assert doc["meta"]["world"] == 4 and doc["meta"]["topology"] == "2x2@nic=1gbit" and doc["meta"]["hosts"]
    rows = doc["results"]
    assert len(rows) == 3 * 3 * 4
    keys = {"op", "size", "count", "dtype", "redop", "algo", "ran", "time_us", "algbw", "busbw", "wrong",
            "spread", "bound_us"}
    for r in rows:
        assert keys <= set(r), set(r) ^ keys
        assert r["wrong"] == 0 and r["time_us"] > 0 and r["busbw"] > 0
        assert r["ran"] in names(), r  # auto runs a registered algorithm
        factor = 2 if r["op"] == "all_reduce" else 1  # x (N-1)/N = 1/2 on two hosts
        assert r["bound_us"] == pytest.approx(r["size"] * factor / 2 / 125e6 * 1e6)
        if r["algo"] != "auto":
            assert r["ran"] == r["algo"]
    assert png.stat().st_size > 10_000


def test_csv_output() -> None:
    res = _bench("--nprocs", "2", "-b", "1K", "-e", "1K", "-n", "1", "-w", "0", "--csv", "--algo", "native,ho_ring",
                 "--quiet")
    assert res.returncode == 0, res.stderr[-2000:]
    lines = res.stdout.strip().splitlines()
    assert lines[0].startswith("op,size,count,dtype") and len(lines) == 3


def _busy_rank_bench(rank: int, world: int, out: str) -> None:
    """Rank 1 spins 20 ms after each call it makes (its own work between calls), so it begins every timed call
    but the first (after the barrier) last."""
    import time

    import torch.distributed as dist

    from hocc.bench import runner
    from hocc.bench.collectives import BenchCollective

    launch = BenchCollective.launch

    def slowed(self: BenchCollective, *args: Any, **kwargs: Any) -> object:
        result = launch(self, *args, **kwargs)
        if rank == 1:
            end = time.perf_counter() + 0.02
            while time.perf_counter() < end:
                pass
        return result

    BenchCollective.launch = slowed  # type: ignore[method-assign]  # this rank process only
    spec = runner.BenchSpec(("all_reduce",), (4096,), ("native", "ho_ring"), torch.float32, "sum", 5, 1, 0, 1,
                            skew=True)
    rows = runner.run_bench(spec, torch.device("cpu"), progress=False)
    if rank == 0:
        with open(out, "w") as f:
            json.dump([r.to_dict() for r in rows], f)
    dist.barrier()


@pytest.mark.slow
def test_skew_names_the_late_rank(tmp_path: Path) -> None:
    out = tmp_path / "rows.json"
    run_world(3, _busy_rank_bench, str(out), env={"HOCC_TOPOLOGY": "3"})
    rows = json.loads(out.read_text())
    assert [r["algo"] for r in rows] == ["native", "ho_ring"]
    for r in rows:
        assert r["late_rank"] == 1 and len(r["late_us"]) == 3, r
        assert r["skew_us"] > 10_000 and r["late_us"][1] > 10_000 > max(r["late_us"][0], r["late_us"][2]), r
    res = _bench("--nprocs", "2", "-b", "1K", "-e", "1K", "-n", "2", "-w", "0", "--skew", "--algo", "native",
                 "--quiet")
    assert res.returncode == 0, res.stderr[-2000:]
    assert "# arrival skew (--skew)" in res.stdout


def test_no_bound_without_link_rates(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    res = _bench("--nprocs", "2", "--topology", "2x1", "-b", "1K", "-e", "1K", "-n", "1", "-w", "0", "--quiet",
                 "--json", str(out))
    assert res.returncode == 0, res.stderr[-2000:]
    assert "link bound" not in res.stdout
    assert all(r["bound_us"] is None for r in json.loads(out.read_text())["results"])


def test_cluster_hosts_get_cpus_of_their_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each emulated host's ranks run on a share of the machine's CPUs of their own (docs/testbed.md), shared in
    turn where hosts outnumber CPUs; --no-pin, or one host, leaves every CPU to every rank."""
    from hocc.bench import emulated as cluster

    def cpus(sc: str, n: int, pin: bool = True) -> list[str]:
        monkeypatch.setattr(cluster.os, "sched_getaffinity", lambda _pid: set(range(10, 10 + n)))
        c = cluster.Cluster(cluster.SCENARIOS[sc], "200mbit", "100mbit", pin=pin)
        return [c.host_cpus(h) for h in range(c.sc.hosts)]

    assert cpus("2x4", 2) == ["10", "11"]
    assert cpus("4x2", 2) == ["10", "11", "10", "11"]
    assert cpus("2x4", 8) == ["10,11,12,13", "14,15,16,17"]
    assert cpus("4+4+3", 16) == ["10,11,12,13,14", "15,16,17,18,19", "20,21,22,23,24,25"]
    assert cpus("2x4", 2, pin=False) == ["10,11", "10,11"]
    assert cpus("flat8", 2) == ["10,11"]


@pytest.mark.root
def test_cluster_setup_and_teardown() -> None:
    from hocc.bench import emulated as cluster

    c = cluster.Cluster(cluster.SCENARIOS["2x2x2"], "200mbit", "100mbit")
    assert not c.names_in_use(), "leftovers of another run"
    try:
        c.up()
        assert set(c.namespaces) <= set(subprocess.run(["ip", "netns", "list"], capture_output=True,
                                                       text=True).stdout.split())
        qdisc = subprocess.run(["ip", "netns", "exec", "hocc-h1", "tc", "qdisc", "show", "dev", "hocc-v1"],
                               capture_output=True, text=True).stdout
        assert "tbf" in qdisc and "200Mbit" in qdisc
        trunk = subprocess.run(["tc", "qdisc", "show", "dev", "hocc-t0"], capture_output=True, text=True).stdout
        assert "100Mbit" in trunk
        # host 3 (other switch) reaches host 0 through both bridges and the trunk
        srv = subprocess.Popen(["ip", "netns", "exec", "hocc-h0", sys.executable, "-c",
                                "import socket; s=socket.socket(); s.bind(('10.77.0.1', 29999)); s.listen(1); "
                                "c,_=s.accept(); c.sendall(b'hello'); c.close()"])
        cli = subprocess.run(["ip", "netns", "exec", "hocc-h3", sys.executable, "-c",
                              "import socket,time\nfor _ in range(50):\n  try:\n"
                              "    s=socket.create_connection(('10.77.0.1', 29999), timeout=5); break\n"
                              "  except OSError: time.sleep(0.1)\nprint(s.recv(5).decode())"],
                             capture_output=True, text=True, timeout=30)
        srv.wait(timeout=10)
        assert cli.stdout.strip() == "hello", cli.stderr
        other = cluster.Cluster(cluster.SCENARIOS["2x4"], "200mbit", "100mbit")
        with pytest.raises(SystemExit, match="already exist"):
            other.up()
        other.down()  # what its run's teardown does: it must leave this cluster as it was
        assert set(c.names_in_use()) == set(c.namespaces) | set(c.bridges), c.names_in_use()
    finally:
        c.down()
    assert not c.names_in_use()
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    assert "hocc-" not in links
