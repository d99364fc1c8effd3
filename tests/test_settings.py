"""When settings take effect (hocc.Config's docstring, docs/settings.md): from
the next call after hocc.configure(), on the drop-in calls' engines and a
"hocc" backend group's alike, never mid-call; and how engines go when torch
ends their group, with nothing of torch's patched."""

from __future__ import annotations

import dataclasses
import logging
import os
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import hocc
from hocc.config import CALL_SETTINGS, ENGINE_SETTINGS, SETTINGS, Config, configure, reset_config, settings_markdown
from hocc.engine.engine import Engine
from hocc.engine.group_engines import find_engine
from tests.worlds import hocc_env, run_world

CPU = torch.device("cpu")


def test_every_setting_is_read_at_one_time() -> None:
    """Each field is a call setting or an engine setting, never both or neither."""
    names = {f.name for f in dataclasses.fields(Config)}
    assert set(CALL_SETTINGS) | set(ENGINE_SETTINGS) == names
    assert not set(CALL_SETTINGS) & set(ENGINE_SETTINGS)
    base = Config()
    assert dataclasses.replace(base, algo="ring", debug=True).engine_settings() == base.engine_settings()
    assert dataclasses.replace(base, shm_piece_bytes=8192).engine_settings() != base.engine_settings()


def test_one_table_gives_every_setting_and_the_docs() -> None:
    """SETTINGS has a row per Config field (and the planner fields it sets),
    and docs/settings.md's table is the one settings_markdown() makes of it."""
    fields = {f.name for f in dataclasses.fields(Config)}
    assert {s.name for s in SETTINGS if "." not in s.name} == fields
    planner = {f.name for f in dataclasses.fields(Config().planner)}
    assert {s.name.split(".", 1)[1] for s in SETTINGS if "." in s.name} <= planner
    doc = (Path(__file__).resolve().parent.parent / "docs" / "settings.md").read_text()
    assert settings_markdown() in doc, "docs/settings.md's table is stale: paste hocc.config.settings_markdown()"


VALID = {"algo": "ring", "debug": "1", "ring_ops": "all_gather", "host_transport": "net", "check": "1",
         "malloc_trim_s": "2.5", "record_dir": "/tmp/x", "planner.chunks": "4", "planner.min_chunk_bytes": "4096",
         "planner.max_chunks": "8", "topology": "2x2", "trace": "true", "shm_piece_bytes": "8192",
         "shm_wait": "yield", "record": "off", "tune": "0", "tuning_file": "/tmp/t.json", "net_transport": "gloo",
         "ucx_spin_us": "0", "ucx_tcp_buffer": "131072"}


def _value(cfg: Config, name: str) -> object:
    for part in name.split("."):
        cfg = getattr(cfg, part)
    return cfg


def test_the_environment_and_configure_agree() -> None:
    """Each setting's variable and hocc.configure() go through one parser:
    the same text gives the same value, and what one refuses (a word no
    setting but a path or a name takes) the other refuses with the same message."""
    reset_config()
    try:
        assert {s.name for s in SETTINGS if s.env} == set(VALID)  # every variable is exercised
        for s in SETTINGS:
            if s.env is None:
                continue
            short = s.name.removeprefix("planner.")
            from_env = _value(Config.from_env({s.env: VALID[s.name]}), s.name)
            assert from_env == _value(configure(**{short: VALID[s.name]}), s.name), s.name
            if s.name in ("record_dir", "topology", "tuning_file"):
                continue  # free text
            with pytest.raises(ValueError) as by_env:
                Config.from_env({s.env: "bogus!"})
            before = hocc.config.get_config()
            with pytest.raises(ValueError) as by_call:
                configure(**{short: "bogus!"})
            assert hocc.config.get_config() is before, f"{s.name}: a refused configure() changed the settings"
            assert str(by_env.value).replace(s.env, short) == str(by_call.value), s.name
        with pytest.raises(ValueError, match="no setting 'nope'"):
            configure(nope=1)
    finally:
        reset_config()


def test_import_patches_nothing_of_torch() -> None:
    c10d = dist.distributed_c10d
    for name in ("destroy_process_group", "_abort_process_group"):
        fn = getattr(c10d, name)
        assert fn.__module__ == c10d.__name__ and fn.__code__.co_filename == c10d.__file__, name
        assert not hasattr(fn, "hocc_hooked"), name
    assert dist.destroy_process_group is c10d.destroy_process_group


# -- settings ------------------------------------------------------------------------------------------------
def _engines(hg: dist.ProcessGroup) -> tuple[Engine, Engine]:
    """The drop-in engine of the world (a gloo group) and the hocc group's engine, as they are (never made)."""
    drop_in, backend = find_engine(dist.group.WORLD, CPU), find_engine(hg, CPU)
    assert drop_in is not None and backend is not None
    return drop_in, backend


def _tiers(group: dist.ProcessGroup | None = None) -> set[str]:
    plan = hocc.last_plan(group)
    assert plan is not None
    return {s.tier for s in plan.steps}


def _calls(rank: int, world: int, hg: dist.ProcessGroup) -> None:
    """One drop-in call on the world and one torch call on the hocc group, both checked."""
    want = float(sum(range(world)))
    x = torch.full((4099,), float(rank))
    hocc.all_reduce(x)
    assert torch.all(x == want)
    y = torch.full((4099,), float(rank))
    dist.all_reduce(y, group=hg)
    assert torch.all(y == want)


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _settings_body(rank: int, world: int) -> None:
    hocc.configure(algo="ho_ring")  # before any engine: every plan names its tiers
    hg = dist.new_group(backend="hocc")
    _calls(rank, world, hg)
    first = _engines(hg)
    assert _tiers() == _tiers(hg) == {"host"}  # HOCC_TOPOLOGY=1x2: one host

    # a call setting: the same engines, the next call runs under it
    hocc.configure(algo="ring")
    _calls(rank, world, hg)
    assert _engines(hg) == first
    plans = [hocc.last_plan(), hocc.last_plan(hg)]
    assert all(p is not None and p.algo == "ring" for p in plans), plans
    hocc.configure(algo="ho_ring")

    # the topology (an engine setting): both engines are made again at their next call, not before
    hocc.configure(topology="2x1")
    assert _engines(hg) == first and _tiers() == _tiers(hg) == {"host"}
    _calls(rank, world, hg)
    second = _engines(hg)
    assert all(new is not old for new, old in zip(second, first, strict=True))
    assert all(old.closed == "closed" for old in first), [old.closed for old in first]
    assert all(e.topology.shape() == "2x1" for e in second)
    assert _tiers() == _tiers(hg) == {"nic"}

    # the shared-memory piece size and the flight recorder's size: read when an engine is made
    hocc.configure(topology="1x2", shm_piece_bytes=8192, record=16)
    _calls(rank, world, hg)
    third = _engines(hg)
    for e in third:
        assert e.comms is not None and e.comms.shm_piece_bytes == 8192
        assert e.recorder.capacity == 16
    assert _tiers() == _tiers(hg) == {"host"}

    # trace: the next call of each engine logs its stages' times
    lines = _Lines()
    logging.getLogger("hocc").addHandler(lines)
    try:
        hocc.configure(trace=True)
        _calls(rank, world, hg)
        assert sum("hocc trace" in line for line in lines.lines) == 2, lines.lines
        hocc.configure(trace=False)
        _calls(rank, world, hg)
        assert sum("hocc trace" in line for line in lines.lines) == 2, lines.lines
    finally:
        logging.getLogger("hocc").removeHandler(lines)

    # the environment, read again: the same rule
    os.environ["HOCC_SHM_PIECE_BYTES"] = "16384"
    reset_config()
    hocc.configure(algo="ho_ring")
    _calls(rank, world, hg)
    for e in _engines(hg):
        assert e.comms is not None and e.comms.shm_piece_bytes == 16384
        assert e.topology.shape() == "1x2" and e.recorder.capacity == 2048


def _in_flight_body(rank: int, world: int) -> None:
    """Async calls made before a change run to their end under the settings they were made with; the next
    call, on a new engine, runs after them."""
    hocc.configure(algo="ho_ring")
    hg = dist.new_group(backend="hocc")
    _calls(rank, world, hg)
    old = _engines(hg)
    n = 1 << 20
    want = float(sum(range(world)))
    # four queued on each engine: the first runs when the change comes, the others wait their turn, and
    # all of them run on every rank (a closing engine drains its queue; refusing them failed the group)
    xs = [torch.full((n,), float(rank)) for _ in range(8)]
    works = [hocc.all_reduce(x, async_op=True) for x in xs[:4]]
    works += [dist.all_reduce(x, group=hg, async_op=True) for x in xs[4:]]
    before = [hocc.last_plan(), hocc.last_plan(hg)]
    hocc.configure(topology="2x1")
    assert [hocc.last_plan(), hocc.last_plan(hg)] == before  # asking changes nothing
    _calls(rank, world, hg)
    assert all(w is not None and w.is_completed() for w in works)  # the old engine's calls ended first
    for w in works:
        assert w is not None
        w.wait()
    assert all(torch.all(x == want) for x in xs)
    assert all(p is not None and {s.tier for s in p.steps} == {"host"} for p in before)
    assert _tiers() == _tiers(hg) == {"nic"}
    assert all(e.closed == "closed" for e in old)


# -- teardown ------------------------------------------------------------------------------------------------
def _one_call(group: dist.ProcessGroup) -> Engine:
    x = torch.ones(1031)
    hocc.all_reduce(x, group=group)
    assert torch.all(x == dist.get_world_size(group))
    eng = find_engine(group, CPU)
    assert eng is not None and eng.closed is None
    return eng


def _teardown_body(rank: int, world: int) -> None:
    # a gloo group: its drop-in engine goes with it
    eng = _one_call(dist.new_group())
    gone = dist.new_group()
    gone_eng = _one_call(gone)
    dist.destroy_process_group(gone)
    del gone
    assert gone_eng.closed == "closed"
    assert eng.closed is None  # other groups' engines stay

    # a group torch ended that the script still holds: its engine goes before the next one is made
    held = dist.new_group()
    held_eng = _one_call(held)
    dist.destroy_process_group(held)
    assert held_eng.closed is None
    _one_call(dist.new_group())
    assert held_eng.closed == "closed"
    del held

    # "hocc" groups: torch calls their shutdown() and abort()
    hg = dist.new_group(backend="hocc")
    hg_eng = _one_call(hg)
    dist.destroy_process_group(hg)
    assert hg_eng.closed == "closed"
    ha = dist.new_group(backend="hocc")
    ha_eng = _one_call(ha)
    dist.distributed_c10d._abort_process_group(ha)
    assert ha_eng.closed is not None and ha_eng.closed.startswith("aborted"), ha_eng.closed

    # the world: destroying it ends every engine of this process's groups
    world_eng = _one_call(dist.group.WORLD)  # type: ignore[arg-type]
    store = dist.distributed_c10d._get_default_store()
    dist.destroy_process_group()
    assert world_eng.closed == "closed" and eng.closed == "closed"
    dist.init_process_group("gloo", store=dist.PrefixStore("again", store), rank=rank, world_size=world,
                            timeout=timedelta(seconds=60))
    _one_call(dist.group.WORLD)  # type: ignore[arg-type]  # and a new world works


def _body(rank: int, world: int) -> None:
    _settings_body(rank, world)
    os.environ["HOCC_SHM_PIECE_BYTES"] = ""
    reset_config()
    _in_flight_body(rank, world)
    _teardown_body(rank, world)  # last: it ends the world and makes a new one


def test_settings_take_effect_at_the_next_call_and_engines_go_with_their_group() -> None:
    """The three parts in one world of 2 ranks (starting a world costs seconds, the parts a fraction of one)."""
    run_world(2, _body, env=hocc_env("1x2", "shm"), timeout_s=60)


def test_ucx_tcp_buffer_follows_the_stated_nic_rate() -> None:
    """UCX's TCP socket buffers: 0.5 ms of the NIC rate the topology states (at least 64 KiB), the kernel's own
    where no rate is stated (0), and the setting's size where one is given."""
    from hocc.engine.ucx import tcp_buffer_bytes
    from hocc.topology import parse_spec

    def size(spec: str | None, **kw: object) -> int:
        return tcp_buffer_bytes(Config(topology=spec, **kw), parse_spec(spec or "2x4"))  # type: ignore[arg-type]

    assert size("2x4@nic=1gbit") == size("2x4@nic=200mbit") == 64 << 10
    assert size("2x4@nic=25gbit") == 25e9 / 8 * 0.5e-3
    assert size("2x4") == size(None) == 0
    assert size(None, ucx_tcp_buffer=12345) == size("2x4@nic=25gbit", ucx_tcp_buffer=12345) == 12345
