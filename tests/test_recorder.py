"""The flight recorder (hocc/record/): what the executor notes per step and
exchange, dumps on failure and on SIGUSR1, live stats, and `hocc trace`
naming three planted faults (bench/planted_faults.py): a late rank and a
stopped one on local ranks, a slow host NIC on the emulated cluster (root)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from hocc.bench import planted_faults
from hocc.config import Config
from hocc.executor.inproc import InProcWorld
from hocc.plan.planner import PlannerConfig, make_plan
from hocc.record import report
from hocc.topology import parse_spec
from tests.worlds import run_world

ROOT = Path(__file__).resolve().parents[1]


def test_settings() -> None:
    assert Config.from_env({}).record == 2048
    assert Config.from_env({"HOCC_RECORD": "0"}).record == 0
    assert Config.from_env({"HOCC_RECORD": "off"}).record == 0
    assert Config.from_env({"HOCC_RECORD": "64", "HOCC_RECORD_DIR": "/x"}).record_dir == "/x"
    with pytest.raises(ValueError, match="HOCC_RECORD='-3' must be a whole number"):
        Config.from_env({"HOCC_RECORD": "-3"})


def test_executor_notes_every_step_and_exchange() -> None:
    """In-process ranks: each rank's record holds exactly its (step, group) items, ended, in time order within a
    lane, and its ring steps' exchanges carry the right neighbours and bytes."""
    topo = parse_spec("2x3")
    plan = make_plan("all_gather", 1001, 4, topo, "ho_ring", PlannerConfig(chunks=3))
    world = InProcWorld(6)
    inputs = [torch.full((1001,), float(r)) for r in range(6)]
    outputs = [torch.empty(1001 * 6) for _ in range(6)]
    world.run(plan, inputs, outputs)
    for r in range(6):
        rec = world.last_record(r)
        mine = sorted((i, j) for i, st in enumerate(plan.steps) for j, g in enumerate(st.groups) if r in g.ranks)
        steps = rec.steps()
        assert sorted((s, g) for s, g, _, _ in steps) == mine
        assert all(0 < b <= e for _, _, b, e in steps)
        assert rec.begin_ns <= min(b for _, _, b, _ in steps) and rec.end_ns >= max(e for _, _, _, e in steps)
        for idx, to, frm, post, done, end, sent, received in rec.exchanges():
            st = plan.steps[steps[idx][0]]
            g = st.groups[steps[idx][1]]
            me = g.ranks.index(r)
            assert (to, frm) == (g.ranks[(me + 1) % len(g.ranks)], g.ranks[(me - 1) % len(g.ranks)])
            assert post <= done <= end and sent == received == g.seg * 4
        # every step of this plan is an all_gather: a ring of n-1 exchanges (the in-process transport runs native
        # steps as rings too)
        assert len(rec.exchanges()) == sum(len(plan.steps[s].groups[g].ranks) - 1 for s, g, _, _ in steps) > 0


# -- planted faults on local ranks -------------------------------------------------------------------------------
def _busy(rank: int, world: int, d: str) -> None:
    import torch.distributed as dist

    import hocc

    planted_faults.rank_main(rank, world, "busy", d, calls=10, victim=2)
    # live: every rank publishes its arrivals, then each sees rank 2 as the late one
    hocc.stats()
    dist.barrier()
    s = hocc.stats()
    assert s["skew"]["members"] == list(range(world)) and s["skew"]["latest"] == 2, s["skew"]
    assert s["tiers"]["nic"]["bytes"] > 0 and s["tiers"]["host"]["bytes_per_s"] > 0, s["tiers"]
    assert dist.group.WORLD is not None


@pytest.mark.slow
def test_busy_rank_is_named(tmp_path: Path) -> None:
    env = {"HOCC_TOPOLOGY": "2x2", "HOCC_RECORD_DIR": str(tmp_path)}
    run_world(4, _busy, str(tmp_path), env=env)
    [g] = report.load(str(tmp_path))
    a = report.analyze(g)
    assert a["hang"] is None and a["complete_calls"] == 30
    late = [f for f in a["findings"] if f["kind"] == "late_rank"]
    assert [f["rank"] for f in late] == [2], a["findings"]
    assert not [f for f in a["findings"] if f["kind"] != "late_rank"], a["findings"]
    out = subprocess.run([sys.executable, "-m", "hocc.tools.cli", "trace", str(tmp_path), "--plot",
                          str(tmp_path / "t.png")], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "rank 2 on host1 arrives late" in out.stdout
    assert (tmp_path / "t.png").stat().st_size > 10_000


def _stop(rank: int, world: int, d: str) -> None:
    planted_faults.rank_main(rank, world, "stop", d, calls=8, victim=3)


@pytest.mark.slow
def test_stopped_rank_is_named(tmp_path: Path) -> None:
    """Rank 3 stops before call 12 (the 5th loop turn's first call); the others fail at the 3 s timeout, each writing
    its dump before its error is raised (the rank script checks), and the dumps alone name rank 3."""
    env = {"HOCC_TOPOLOGY": "2x2", "HOCC_RECORD_DIR": str(tmp_path)}
    run_world(4, _stop, str(tmp_path), env=env, timeout_s=3.0)
    aside = tmp_path / "at-failure"
    assert sorted(os.listdir(aside)) == [f"rank{r}.0.cpu.json" for r in range(3)]
    [g] = report.load(str(aside))
    a = report.analyze(g)
    h = a["hang"]
    assert h is not None and h["seq"] == 12 and h["never_began"] == [3] and h["no_dump"] == [3], h
    assert sorted(w["rank"] for w in h["waiting"]) == [0, 1, 2] and all(w["state"] == "failed" for w in h["waiting"])
    named = [f for f in a["findings"] if f["kind"] == "never_began"]
    assert [f["rank"] for f in named] == [3] and "never began call #12" in named[0]["text"], a["findings"]
    # its rail peer (all_gather: rail stage first) and its host peer, once rank 2's rail stage ended
    assert "ranks [1, 2] waited on it directly" in named[0]["text"], named
    # the victim, let go, failed too and wrote its own dump afterwards, showing it began call 12 last
    with open(tmp_path / "rank3.0.cpu.json") as f:
        late = json.load(f)
    assert late["calls"][-1]["seq"] == 12 and late["calls"][-1]["state"] == "failed"


def _sigusr1(rank: int, world: int, d: str) -> None:
    import torch.distributed as dist

    import hocc

    store = dist.distributed_c10d._get_default_store()
    t = torch.ones(1000)
    hocc.all_reduce(t)  # the engine (and its recorder) exist on both ranks
    if rank == 1:
        pid = int(store.get("pid0"))
        time.sleep(1.0)  # rank 0 is blocked in the next call by now
        os.kill(pid, signal.SIGUSR1)
        deadline = time.monotonic() + 20
        while not os.path.exists(os.path.join(d, "rank0.0.cpu.json")):
            assert time.monotonic() < deadline, "no dump from rank 0 after SIGUSR1"
            time.sleep(0.05)
    else:
        store.set("pid0", str(os.getpid()))
    hocc.all_reduce(t)
    if rank == 0:
        with open(os.path.join(d, "rank0.0.cpu.json")) as f:
            doc = json.load(f)
        assert doc["reason"] == "SIGUSR1" and doc["format"] == "hocc-record" and doc["version"] == 1
        last = doc["calls"][-1]
        assert last["seq"] == 1 and last["state"] == "running" and last["start_ns"] and not last["end_ns"], last
        assert doc["calls"][0]["state"] == "ok"


@pytest.mark.slow
def test_sigusr1_dumps_a_rank_blocked_in_a_call(tmp_path: Path) -> None:
    run_world(2, _sigusr1, str(tmp_path), env={"HOCC_TOPOLOGY": "2", "HOCC_RECORD_DIR": str(tmp_path)})


# -- a slow NIC on the emulated cluster --------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.root
def test_slow_nic_is_named(tmp_path: Path) -> None:
    """4 hosts x 2 ranks at 200 Mbit/s, host 2's NIC at 50 Mbit/s: the report names host2's link and the rail
    stage, from the dumps alone."""
    cmd = [sys.executable, str(ROOT / "bench" / "cluster.py"), "4x2", "--host-rate", "2=50mbit", "--timeout", "300",
           "--port", "29671", "--script", str(ROOT / "bench" / "planted_faults.py"), "--", "--fault", "slow-nic",
           "--dir", str(tmp_path), "--calls", "6"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=400)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    [g] = report.load(str(tmp_path))
    a = report.analyze(g)
    slow = [f for f in a["findings"] if f["kind"] == "slow_host_link"]
    assert [f["host"] for f in slow] == ["host2"], report.render([a])
    assert slow[0]["stage"]["tier"] != "host", slow
    assert not [f for f in a["findings"] if f["kind"] != "slow_host_link"], a["findings"]


# -- the analysis on made-up dumps: what it must not name ---------------------------------------------------------
def _dump(rank: int, calls: list[dict[str, object]], size: int = 3) -> dict[str, object]:
    return {"format": "hocc-record", "version": 1, "reason": "test", "dumped_ns": 0, "rank": rank,
            "global_rank": rank, "group": "0", "size": size, "global_ranks": list(range(size)), "device": "cpu",
            "hostname": "h", "pid": 1, "hosts": [f"host{r}" for r in range(size)], "switches": ["s"] * size,
            "capacity": 8, "calls": calls}


def _call(seq: int, start_ms: float, end_ms: float) -> dict[str, object]:
    return {"seq": seq, "collective": "all_reduce", "count": 1, "dtype": "float32", "op": "sum", "algo": "ring",
            "plan": "", "stages": 1, "chunks": 1, "state": "ok", "error": "", "enqueue_ns": int(start_ms * 1e6),
            "start_ns": int(start_ms * 1e6), "end_ns": int(end_ms * 1e6), "steps": []}


def _analyze(tmp_path: Path, per_rank: dict[int, list[dict[str, object]]]) -> dict[str, object]:
    for r, calls in per_rank.items():
        (tmp_path / f"rank{r}.0.cpu.json").write_text(json.dumps(_dump(r, calls)))
    [g] = report.load(str(tmp_path))
    return report.analyze(g)


def test_late_only_after_a_late_end_is_not_a_straggler(tmp_path: Path) -> None:
    """Rank 2 begins each call 20 ms late, but only because its previous call ended 20 ms later (it spends 5 ms
    outside hocc like the others): no rank is named. With the same lateness from its own work, it is."""
    calls: dict[int, list[dict[str, object]]] = {r: [] for r in range(3)}
    for s in range(6):
        t = s * 100.0
        for r in range(3):
            calls[r].append(_call(s, t + (20 if r == 2 else 0), t + 95 - 5 + (20 if r == 2 else 0)))
    a = _analyze(tmp_path, calls)
    assert a["skew"]["ranks"][0]["rank"] == 2 and a["skew"]["ranks"][0]["mean_late_s"] > 0.015
    assert a["findings"] == []
    own: dict[int, list[dict[str, object]]] = {r: [] for r in range(3)}
    for s in range(6):
        t = s * 100.0
        for r in range(3):
            own[r].append(_call(s, t + (20 if r == 2 else 0), t + 90))
    for p in tmp_path.iterdir():
        p.unlink()
    b = _analyze(tmp_path, own)
    assert [f["rank"] for f in b["findings"]] == [2], b["findings"]


def test_a_missing_dump_without_a_stuck_call(tmp_path: Path) -> None:
    """Ranks 0 and 1 ended every call; rank 2's dump is missing: the report says so, and names no late rank."""
    a = _analyze(tmp_path, {r: [_call(s, s * 10.0, s * 10.0 + 5) for s in range(3)] for r in (0, 1)})
    h = a["hang"]
    assert h is not None and h["no_dump"] == [2] and h["never_began"] == [2] and h["waiting"] == [], h
    assert a["skew"] is None and a["complete_calls"] == 0
    assert [(f["kind"], f["ranks"]) for f in a["findings"]] == [("no_dump", [2])], a["findings"]


def _backend_stats(rank: int, world: int) -> None:
    import torch.distributed as dist

    import hocc

    t = torch.ones(4096)
    for _ in range(3):
        dist.all_reduce(t)  # through the "hocc" backend's engine
    world_group = dist.group.WORLD
    assert isinstance(world_group, hocc.HoccProcessGroup)  # the "hocc" backend's groups are its own objects
    s = world_group.stats()
    assert s["calls"] == 3 and s["recorded"] == 3 and s["failed"] == 0, s
    assert s["tiers"] and all(v["bytes"] > 0 and v["seconds"] > 0 for v in s["tiers"].values()), s
    assert rank in s["skew"]["members"]
    with pytest.raises(hocc.HoccError, match="no hocc call on cpu tensors has run on this group yet"):
        hocc.stats(dist.new_group([0, 1]))


@pytest.mark.slow
def test_backend_exposes_stats() -> None:
    run_world(2, _backend_stats, env={"HOCC_TOPOLOGY": "2"}, backend="hocc")
