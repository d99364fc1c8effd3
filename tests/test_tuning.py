"""Measured selection (hocc/engine/tuning.py), crossover tables
(hocc/plan/crossover.py) and the tuning file: the schedule every rank follows,
the decision from agreed times, no planner on the call path, persistence, and
in real worlds: the same choice on every rank, correct results throughout,
tiny calls at the frame's edge."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import hocc
import hocc.plan.crossover as crossover
from hocc.engine.tuning import CHECK_CALLS, CHECK_DEFER, MAX_DEFER, TRY_WITHIN, Tuner
from hocc.engine.tuning_file import TuningFile
from hocc.plan.crossover import Crossover, Pick, bucket_count, bucket_of, model_pick
from hocc.plan.planner import PlannerConfig, predict_all
from hocc.plan.policy import planner_settings
from hocc.plan.registry import names
from hocc.topology import parse_spec
from tests.worlds import count_full_way, hocc_env, run_world

TOPO = parse_spec("2x4")
CPU = planner_settings(PlannerConfig(), "cpu", TOPO)


def _tuner(agree: object = None, file: TuningFile | None = None, trials: bool = True) -> Tuner:
    return Tuner(TOPO, CPU, "cpu", trials, agree or (lambda v: v), file, "test-key", True)  # type: ignore[arg-type]


def test_buckets_split_at_powers_of_two() -> None:
    assert [bucket_of(n) for n in (0, 1, 2, 3, 4, 5, 1024, 1025)] == [0, 0, 1, 2, 2, 3, 10, 11]
    for b in range(1, 40):  # the priced size lies in its own bucket
        assert bucket_of(bucket_count(b, 1)) == b


def test_table_is_the_model_and_needs_no_planner_after(monkeypatch: pytest.MonkeyPatch) -> None:
    table = Crossover("all_reduce", 4, TOPO, CPU)
    for b in (3, 12, 20, 26):
        want = model_pick("all_reduce", bucket_count(b, 4), 4, TOPO, CPU)
        assert (table.picks[b].algo, table.picks[b].chunks) == (want.algo, want.chunks)
    # 2x4 at 200 Mbit/s: host_rails for the smallest, then ho_ring (bench/results/model-picks.md), deeper
    # pipelines as sizes grow
    assert len({(p.algo, p.chunks) for p in table.picks}) >= 2, table.crossovers()

    def planner_called(*a: object, **k: object) -> None:
        raise AssertionError("the planner ran on the call path")

    tuner = _tuner(trials=False)
    tuner.table("all_reduce", 4)  # made once, ahead
    monkeypatch.setattr(crossover, "predict_all", planner_called)
    for count in (1, 3, 1000, 12345, 1 << 22):  # new sizes: lookups only
        pick, trial = tuner.pick("all_reduce", count, 4, "float32")
        assert trial is None and pick.algo in names()


def test_trials_follow_the_call_sequence_and_the_fastest_wins() -> None:
    agreed: list[list[float]] = []

    def agree(v: list[float]) -> list[float]:
        agreed.append(v)
        return [x * 2 for x in v]  # what the slowest rank saw (any monotone map keeps the order)

    tuner = _tuner(agree)
    tuner.measure_all()  # hocc tune's trials: every algorithm, HO-Ring at several depths
    seen, trial = [], None
    for _ in range(100):
        pick, trial = tuner.pick("all_reduce", 1 << 20, 4, "float32")
        if trial is None:
            break
        seen.append((pick.algo, pick.chunks, trial.timed))
        fast = pick.algo == "ho_ring" and pick.chunks == 4
        tuner.measured(trial, 0.01 if fast else 0.05 + 0.001 * len(seen))
    labels = [(a, k) for a, k, _ in seen]
    assert ("ho_ring", 4) in labels and ("native", None) in labels and ("ring", None) in labels
    warm = [s for s in seen if not s[2]]
    priced = predict_all("all_reduce", 1 << 20, 4, TOPO, CPU)  # every algorithm the model prices at this size
    assert seen[:len(warm)] == warm and sorted(a for a, _, _ in warm) == sorted(priced)
    assert (pick.algo, pick.chunks) == ("ho_ring", 4) and pick.why.startswith("measured:"), pick
    assert len(agreed) == 1 and len(agreed[0]) == len({(a, k) for a, k, _ in seen})
    # the same bucket again: decided, no trial; a second bucket reuses the warm-ups
    assert tuner.pick("all_reduce", (1 << 20) - 5, 4, "float32")[1] is None
    # (128 KiB: the algorithms priced there are the first bucket's)
    again = [tuner.pick("all_reduce", 1 << 15, 4, "float32")[1] for _ in range(3)]
    assert all(t is not None and t.timed for t in again)
    # a second tuner fed the same calls plans the same trials (every rank does)
    other = _tuner(agree)
    other.measure_all()
    replay = []
    for _ in range(len(seen)):
        p, t = other.pick("all_reduce", 1 << 20, 4, "float32")
        assert t is not None
        replay.append((p.algo, p.chunks, t.timed))
    assert replay == seen


def test_settled_only_once_a_pick_is_final() -> None:
    """What the engine may keep for a call shape (Engine._ready): a pick with no trials left to change it."""
    assert _tuner(trials=False).settled("all_reduce", 1 << 20, 4, "float32")  # the table's pick stands
    tuner = _tuner()
    tuner.measure_all()
    for _ in range(100):
        pick, trial = tuner.pick("all_reduce", 1 << 20, 4, "float32")
        if trial is None:
            break
        assert not tuner.settled("all_reduce", 1 << 20, 4, "float32")
        tuner.measured(trial, 0.01 if pick.algo == "ring" else 0.05)
    assert tuner.settled("all_reduce", 1 << 20, 4, "float32") and pick.algo == "ring", pick
    assert tuner.settled("all_reduce", (1 << 20) - 5, 4, "float32")  # the same bucket
    assert not tuner.settled("all_reduce", 1 << 10, 4, "float32")  # another


def _world_ready_calls(rank: int, world: int) -> None:
    """A repeated call runs from the engine's kept plan; a change of settings drops what it kept."""
    from hocc.engine.group_engines import get_engine

    eng = get_engine(dist.group.WORLD, torch.device("cpu"))  # type: ignore[arg-type]
    x = torch.ones(5)
    for algo in ("ring", "native", "ring"):
        hocc.configure(algo=algo)
        for _ in range(3):
            hocc.all_reduce(x)
            plan = hocc.last_plan()
            assert plan is not None and plan.algo == algo, (algo, plan)
        assert list(eng._ready) == [("all_reduce", 5, 4, algo, "float32")], eng._ready
    assert torch.all(x == world ** 9)
    hocc.all_reduce(x, algo="native")  # a call's own algo is part of the shape
    assert hocc.last_plan().algo == "native" and len(eng._ready) == 2  # type: ignore[union-attr]


def test_ready_calls_follow_the_settings() -> None:
    run_world(2, _world_ready_calls)


def test_the_model_settles_what_it_can_tell_apart() -> None:
    """By default a bucket is measured only between the candidates the model
    prices within TRY_WITHIN of its pick (HO-Ring at the model's K); one with
    no such rival runs the model's pick from its first call, measuring nothing."""
    tuner = _tuner(lambda v: v)
    pick, trial = tuner.pick("all_reduce", 1 << 18, 4, "float32")  # 1 MiB on 2x4: ho_ring 1.5x below the rest, settled
    want = model_pick("all_reduce", 1 << 18, 4, TOPO, CPU)
    assert trial is None and (pick.algo, pick.chunks) == (want.algo, want.chunks) and "no other within" in pick.why
    price = predict_all("all_reduce", 1 << 18, 4, TOPO, CPU)[want.algo].seconds
    decided, _ = _to_decision(tuner, 1 << 18, lambda p: price)  # it runs as priced: its check keeps it
    assert (decided.algo, decided.chunks) == (want.algo, want.chunks) and "checked" in decided.why, decided
    assert tuner.decided()[("all_reduce", "float32", bucket_of(1 << 20))] == decided
    topo = parse_spec("4x2@nic=200mbit")  # 256 KiB: native, ring and ho_ring priced within TRY_WITHIN
    cfg = planner_settings(PlannerConfig(), "cpu", topo)
    close = Tuner(topo, cfg, "cpu", True, lambda v: v, None, "k", True)
    preds = predict_all("all_reduce", 1 << 16, 4, topo, cfg)
    best = min(p.seconds for p in preds.values())
    rivals = {(a, p.chunks if a == "ho_ring" else None) for a, p in preds.items() if p.seconds <= best * TRY_WITHIN}
    assert len(rivals) >= 2, preds
    model = model_pick("all_reduce", 1 << 16, 4, topo, cfg)
    seen, before = [], 0
    while True:
        pick, trial = close.pick("all_reduce", 1 << 16, 4, "float32")
        if (trial is None or trial.bucket.check) and not seen:  # before the trials: the model's pick, checked
            assert (pick.algo, pick.chunks) == (model.algo, model.chunks), pick
            if trial is not None:
                close.measured(trial, preds[model.algo].seconds)  # as priced: the rivals' trials when worth it
            before += 1
            continue
        if trial is None:
            break
        seen.append((pick.algo, pick.chunks))
        close.measured(trial, 0.01 if pick.algo == "native" else 0.02)
    # the model's rivals only, each at the model's K; the pick's check stood for its first round
    assert set(seen) | {(model.algo, model.chunks)} == rivals and len(seen) <= 50, seen
    assert pick.algo == "native" and pick.why.startswith("measured:")
    b = close._buckets[("all_reduce", "float32", bucket_of(1 << 18))]
    assert before == b.made + b.deferred and b.deferred > 0 and b.made > CHECK_CALLS


def _to_decision(tuner: Tuner, count: int, took: object) -> tuple[Pick, list[tuple[str, int | None, bool]]]:
    """Calls of one all_reduce size until its bucket is decided, each trial taking took(pick) seconds:
    the decision, and every call's (algo, chunks, trial?)."""
    calls: list[tuple[str, int | None, bool]] = []
    key = ("all_reduce", "float32", bucket_of(count * 4))
    while key not in tuner.decided():
        assert len(calls) < 500, calls[-10:]
        pick, trial = tuner.pick("all_reduce", count, 4, "float32")
        calls.append((pick.algo, pick.chunks, trial is not None))
        if trial is not None:
            tuner.measured(trial, took(pick))  # type: ignore[operator]
    return tuner.decided()[key], calls


@pytest.mark.parametrize(("behind", "stays"), [(1.03, True), (1.10, False)])
def test_a_narrow_win_does_not_unseat_the_models_pick(behind: float, stays: bool) -> None:
    """The trials replace the model's pick only with a rival measured more than STAY_WITHIN faster: a win
    within the spread of two runs of one plan keeps the pick (and says so), a clear one takes the bucket."""
    topo = parse_spec("4x2@nic=200mbit")  # 256 KiB all_reduce: native, ring and ho_ring priced within TRY_WITHIN
    cfg = planner_settings(PlannerConfig(), "cpu", topo)
    tuner = Tuner(topo, cfg, "cpu", True, lambda v: v, None, "k", True)
    model = model_pick("all_reduce", 1 << 16, 4, topo, cfg)
    price = predict_all("all_reduce", 1 << 16, 4, topo, cfg)[model.algo].seconds
    rival = next(a for a in ("native", "ring", "ho_ring") if a != model.algo)

    def took(p: Pick) -> float:
        return price * (behind if p.algo == model.algo else 1.0 if p.algo == rival else 2.0)

    decided, calls = _to_decision(tuner, 1 << 16, took)
    assert rival in {a for a, _, t in calls if t}, calls  # the rival was measured
    if stays:  # within STAY_WITHIN (1.05)
        assert (decided.algo, decided.chunks) == (model.algo, model.chunks), decided
        assert "the model's pick stays" in decided.why, decided
    else:
        assert decided.algo == rival and "stays" not in decided.why, decided


def test_a_lone_pick_is_checked_once() -> None:
    """A bucket the model settles alone runs its pick; after calls worth CHECK_S (at least one: the set-up,
    at most CHECK_DEFER) CHECK_CALLS of them are timed, the first after a barrier, the ranks agree once, and a
    pick that ran within CHECK_RATIO of its price is kept: no other algorithm ran."""
    agreed: list[list[float]] = []

    def agree(v: list[float]) -> list[float]:
        agreed.append(v)
        return v

    for count in (1, 1 << 18, 1 << 24):  # 4 B, 1 MiB, 64 MiB on 2x4: the model settles each alone
        agreed.clear()
        tuner = _tuner(agree)
        want = model_pick("all_reduce", count, 4, TOPO, CPU)
        price = predict_all("all_reduce", count, 4, TOPO, CPU)[want.algo].seconds
        decided, calls = _to_decision(tuner, count, lambda p, price=price: price * 1.5)
        assert {(a, k) for a, k, _ in calls} == {(want.algo, want.chunks)}, calls  # nothing else ran
        timed = [i for i, c in enumerate(calls) if c[2]]
        assert len(timed) == CHECK_CALLS and timed[-1] == len(calls) - 1, calls
        assert 1 <= timed[0] <= CHECK_DEFER and len(agreed) == 1 and len(agreed[0]) == 1, (timed, agreed)
        assert decided.why.endswith(f"{price * 1.5e3:.3f} ms measured, {price * 1e3:.3f} ms priced)"), decided
        assert tuner.settled("all_reduce", count, 4, "float32") and tuner.trial_calls(
            ("all_reduce", "float32", bucket_of(count * 4))) == CHECK_CALLS
    bucket = tuner._buckets[("all_reduce", "float32", bucket_of(1 << 26))]
    assert bucket.schedule[0] == (0, True, True)  # the check's first call starts after a barrier


def test_a_model_priced_for_the_wrong_links_measures_every_algorithm() -> None:
    """HOCC_TOPOLOGY says 10 Gbit/s where the links carry 200 Mbit/s: the check of a pick the model settles
    alone finds it far slower than priced, and the bucket runs trials between every algorithm the model can
    price; the fastest measured wins, and their times refit the model (later buckets are priced from the links
    as measured)."""
    wrong = parse_spec("2x4@nic=10gbit")
    cfg = planner_settings(PlannerConfig(), "cpu", wrong)
    tuner = Tuner(wrong, cfg, "cpu", True, lambda v: v, None, "k", True)
    count = 1 << 16  # 256 KiB: ho_ring, no other priced within 1.25x of it
    model = model_pick("all_reduce", count, 4, wrong, cfg)
    price = predict_all("all_reduce", count, 4, wrong, cfg)[model.algo].seconds
    best = next(a for a in ("native", "ring", "ho_ring") if a != model.algo)
    decided, calls = _to_decision(tuner, count, lambda p: 0.002 if p.algo == best else price * 20)
    assert decided.algo == best and decided.why.startswith("measured:"), decided
    ran = {a for a, _, t in calls if t}
    assert ran >= {"native", "ring", "ho_ring", model.algo}, ran  # every algorithm, not only the model's rivals
    assert len(calls) <= 50, len(calls)  # decided within a short job's first 50 calls of the size
    assert tuner.model_topo is wrong  # one size cannot refit the model
    count = 1 << 18  # 1 MiB, a second lone pick, also found wrong: the two sizes' times refit it
    price = predict_all("all_reduce", count, 4, wrong, cfg)[model_pick("all_reduce", count, 4, wrong, cfg).algo].seconds
    decided, _ = _to_decision(tuner, count, lambda p: 0.02 if p.algo == best else price * 20)
    assert decided.algo == best and tuner.model_topo is not wrong


def test_a_model_found_wrong_has_no_favourite() -> None:
    """Where the checks found the pick far over its price, the model is wrong for this cluster: the fastest
    measured wins even by less than STAY_WITHIN."""
    wrong = parse_spec("2x4@nic=10gbit")
    cfg = planner_settings(PlannerConfig(), "cpu", wrong)
    tuner = Tuner(wrong, cfg, "cpu", True, lambda v: v, None, "k", True)
    count = 1 << 15  # 128 KiB: ho_ring priced 0.52 ms, host_rails within 1.25x (as above)
    decided, _ = _to_decision(tuner, count, lambda p: 0.0100 if p.algo == "ho_ring" else 0.0098)
    assert decided.algo == "host_rails" and "stays" not in decided.why, decided


def test_a_busy_spell_in_a_check_is_not_a_wrong_model() -> None:
    """A check that finds the pick over CHECK_RATIO x its price (here, the machine busy for those three calls)
    is taken again at once; the second, as priced, keeps the pick: no trials, no other algorithm set up."""
    tuner = _tuner()
    count = 1 << 18  # 1 MiB all_reduce on 2x4: the model settles it alone
    want = model_pick("all_reduce", count, 4, TOPO, CPU)
    price = predict_all("all_reduce", count, 4, TOPO, CPU)[want.algo].seconds
    timed = []

    def took(p: Pick) -> float:
        timed.append(p)
        return price * (20 if len(timed) <= CHECK_CALLS else 1.2)

    decided, calls = _to_decision(tuner, count, took)
    assert (decided.algo, decided.chunks) == (want.algo, want.chunks) and "checked" in decided.why, decided
    assert {(a, k) for a, k, _ in calls} == {(want.algo, want.chunks)}, calls  # nothing else ran
    assert sum(t for *_, t in calls) == 2 * CHECK_CALLS, calls


def test_a_model_found_wrong_measures_its_rivals_at_once() -> None:
    """With the links described wrongly, a bucket with rivals does not wait for its trials by the wrong
    prices: its check finds the pick far slower than priced, and the rivals' trials start at once."""
    wrong = parse_spec("2x4@nic=10gbit")
    cfg = planner_settings(PlannerConfig(), "cpu", wrong)
    tuner = Tuner(wrong, cfg, "cpu", True, lambda v: v, None, "k", True)
    count = 1 << 15  # 128 KiB: ho_ring priced 0.52 ms, host_rails within 1.25x; ho_ring runs 10 ms
    model = model_pick("all_reduce", count, 4, wrong, cfg)
    assert model.algo == "ho_ring", model
    decided, calls = _to_decision(tuner, count, lambda p: 0.010 if p.algo == "ho_ring" else 0.0025)
    assert decided.algo == "host_rails" and len(calls) <= 40, (decided, len(calls))
    assert {a for a, _, t in calls if t} == {"host_rails", "ho_ring"}  # the rivals only
    # a failed check is checked again; the second's timed calls are the pick's first round: found 4x slower
    # there, it runs no trial of its own
    assert sum(a == "ho_ring" and t for a, _, t in calls) == 2 * CHECK_CALLS, calls


def test_a_short_job_pays_nothing_for_measuring() -> None:
    """A bucket's trials start only once its calls, on the model's pick, have cost what the trials would
    (their calls at the model's prices and SET_UP_S per candidate not run yet): before that every call is an
    ordinary call of the pick. Cheap calls wait longer than dear ones; hocc tune (measure_all) never waits."""
    topo = parse_spec("4x2@nic=200mbit")
    cfg = planner_settings(PlannerConfig(), "cpu", topo)
    waits = {}
    for size in (1 << 14, 1 << 20):  # 64 KiB and 4 MiB all_reduce: both measured on the 4x2
        tuner = Tuner(topo, cfg, "cpu", True, lambda v: v, None, "k", True)
        model = model_pick("all_reduce", size, 4, topo, cfg)
        preds = predict_all("all_reduce", size, 4, topo, cfg)
        n = 0
        while True:  # the pick's calls (its check's among them, timed as priced) until the rivals' first trial
            pick, trial = tuner.pick("all_reduce", size, 4, "float32")
            if trial is not None and not trial.bucket.check:
                break
            assert (pick.algo, pick.chunks) == (model.algo, model.chunks), (size, pick)
            if trial is not None:
                tuner.measured(trial, preds[model.algo].seconds)
            n += 1
        b = tuner._buckets[("all_reduce", "float32", bucket_of(size * 4))]
        trials = sum(preds[b.candidates[i].algo].seconds for i, _, _ in b.schedule + [e for r in b.later for e in r])
        assert n == b.made + b.deferred and b.made >= CHECK_CALLS + 1
        assert n * preds[model.algo].seconds >= min(trials, MAX_DEFER * preds[model.algo].seconds)
        assert not any(i == b.candidates.index(Pick(model.algo, model.chunks, "trial")) and not t for i, t, _ in
                       b.schedule), "the pick's calls before the trials set it up: no warm-up of its own"
        waits[size] = n
    assert waits[1 << 14] > 50 > waits[1 << 20] > 0, waits
    eager = Tuner(topo, cfg, "cpu", True, lambda v: v, None, "k", True)
    eager.measure_all()
    assert eager.pick("all_reduce", 1 << 14, 4, "float32")[1] is not None


def test_a_rival_far_behind_after_the_first_round_runs_no_more_trials() -> None:
    """The cut: after round 1 the ranks agree, and a candidate slower than
    KEEP_WITHIN x the fastest is dropped, so a rival the model priced wrongly
    costs one round, not ROUNDS; the rest are timed to the end."""
    agreed: list[list[float]] = []

    def agree(v: list[float]) -> list[float]:
        agreed.append(v)
        return v

    tuner = _tuner(agree)
    tuner.measure_all()  # every algorithm is a candidate
    secs = {"native": 0.010, "ho_ring": 0.011}  # the rest: 3x the fastest, dropped at the cut
    rounds: list[list[str]] = [[]]
    while True:
        pick, trial = tuner.pick("all_reduce", 1 << 12, 4, "float32")
        if trial is None:
            break
        if trial.timed:
            rounds[-1].append(pick.algo)
        t = secs.get(pick.algo, 0.030)
        if pick.algo == "ho_ring" and pick.chunks != min(c.chunks or 0 for c in trial.bucket.candidates
                                                         if c.algo == "ho_ring"):
            t = 0.030  # the other depths: far behind too
        tuner.measured(trial, t)
        if trial.last and not trial.bucket.done.is_set():
            rounds.append([])  # the cut kept more than one: later rounds follow
    first, later = rounds[0], [a for r in rounds[1:] for a in r]
    assert set(first) == set(names()) and set(later) == {"native", "ho_ring"}, rounds
    assert len(agreed) == 2 and len(agreed[0]) > len(agreed[1]) == 2  # the cut over all, the decision over two
    assert pick.algo == "native" and "dropped after round 1" in pick.why, pick
    # a cut that keeps one decides at once: one agreement, nothing after the first round
    agreed.clear()
    lone = _tuner(agree)
    lone.measure_all()
    calls = 0
    while True:
        pick, trial = lone.pick("all_gather", 1 << 10, 4, "float32")
        if trial is None:
            break
        calls += 1
        lone.measured(trial, 0.01 if pick.algo == "ring" else 0.05)
    assert pick.algo == "ring" and len(agreed) == 1 and calls == len(lone._buckets[next(iter(lone._buckets))].schedule)


def test_the_file_keeps_choices_and_a_later_tuner_measures_nothing(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    tuner = _tuner(file=TuningFile(path))
    tuner.measure_all()
    while True:
        _, trial = tuner.pick("all_gather", 100, 4, "float32")
        if trial is None:
            break
        tuner.measured(trial, 0.02 if trial.candidate == 1 else 0.03)
    want = tuner.decided()
    assert [p.algo for p in want.values()] == ["ring"]
    later = _tuner(file=TuningFile(path))
    later.measure_all()
    pick, trial = later.pick("all_gather", 100, 4, "float32")
    assert trial is None and (pick.algo, pick.why) == ("ring", next(iter(want.values())).why)
    assert later.pick("all_gather", 100, 4, "float64")[1] is not None  # another dtype: not in the file
    # what the model settled is not written: a later job with a refitted model decides it again
    settled = _tuner(file=TuningFile(tmp_path / "s.json"))
    assert settled.pick("all_reduce", 1 << 18, 4, "float32")[1] is None
    assert not (tmp_path / "s.json").exists() or not TuningFile(tmp_path / "s.json").picks("test-key")
    path.write_text("{not json")
    with pytest.raises(ValueError, match="cannot read it"):
        TuningFile(path)


def test_settings() -> None:
    assert hocc.Config.from_env({"HOCC_TUNE": "0"}).tune is False
    assert hocc.Config.from_env({}).tune is True
    assert hocc.Config.from_env({"HOCC_TUNING_FILE": "/x/t.json"}).tuning_file == "/x/t.json"
    with pytest.raises(ValueError, match="HOCC_TUNE"):
        hocc.Config.from_env({"HOCC_TUNE": "maybe"})


def _world_tuning(rank: int, world: int, path: str) -> None:
    """Trials run on every rank alike, results stay right through them, and every rank decides the same."""
    from hocc.engine.group_engines import get_engine

    tuner = get_engine(dist.group.WORLD, torch.device("cpu")).tuner()  # type: ignore[arg-type]
    tuner.measure_all()  # hocc tune's trials (every bucket measured), to exercise them in a real world
    sizes = (1, 6, 1000, 70001)
    for n in sizes:
        calls = 0
        while len(tuner.decided()) < 2 * (sizes.index(n) + 1):  # this size's two buckets decided
            calls += 1
            assert calls < 200, (n, tuner.decided())
            x = torch.arange(n, dtype=torch.float32) + rank
            want = x.clone()
            dist.all_reduce(want)
            hocc.all_reduce(x)
            torch.testing.assert_close(x, want)
            out = torch.empty(world * n)
            hocc.all_gather_into_tensor(out, torch.full((n,), float(rank)))
            assert torch.equal(out, torch.arange(world).repeat_interleave(n).float())
    hocc.all_reduce(torch.ones(sizes[-1]))  # a decided bucket: its plan says what was measured
    plan = hocc.last_plan()
    assert plan is not None and "measured:" in plan.reason, plan.reason
    # async calls run ahead of the worker, whose decisions refit the model that plans new buckets' trials:
    # every rank must still plan them alike (a difference would fail the call check)
    works = []
    for i in range(150):
        n = (3, 500, 30000)[i % 3]
        x = torch.full((n,), float(rank + i))
        works.append((hocc.all_reduce(x, async_op=True), x, sum(range(world)) + world * i))
    for w, x, v in works:
        assert w is not None
        w.wait()
        assert torch.all(x == v)
    mine = sorted((k, p.algo, p.chunks) for k, p in tuner.decided().items())
    every: list[object] = [None] * world
    dist.all_gather_object(every, mine)
    assert all(e == mine for e in every), every


def _world_loads(rank: int, world: int, path: str) -> None:
    for n in (1, 6, 1000, 70001):
        x = torch.ones(n)
        hocc.all_reduce(x)
        plan = hocc.last_plan()
        assert plan is not None and "trial" not in plan.reason and "measured:" in plan.reason, plan.reason
        assert torch.all(x == world)


@pytest.mark.slow
def test_a_world_tunes_alike_and_a_later_job_loads_it(tmp_path: Path) -> None:
    path = str(tmp_path / "tuning.json")
    env = {**hocc_env("2x2", "shm"), "HOCC_TUNING_FILE": path, "HOCC_TUNE": "1"}
    run_world(4, _world_tuning, path, env=env, timeout_s=300)
    assert Path(path).exists()
    run_world(4, _world_loads, path, env=env, timeout_s=120)


def _world_agreement(rank: int, world: int) -> None:
    from hocc.engine.group_engines import get_engine

    hocc.all_reduce(torch.ones(4))  # the world's engine
    eng = get_engine(dist.group.WORLD, torch.device("cpu"))  # type: ignore[arg-type]
    made = eng.calls_made
    for n in (1, 3, 7):  # a candidate count's worth of times, every rank's own
        mine = [rank * (k + 1) - (world - 1) * (k % 2) + 0.25 for k in range(n)]
        want = [max(r * (k + 1) - (world - 1) * (k % 2) + 0.25 for r in range(world)) for k in range(n)]
        assert eng._agree_max(mine) == want, (n, mine)
    assert eng._agree_max([]) == []
    assert eng.calls_made == made  # the tuner's agreement is no call of the user's: not numbered, not checked
    x = torch.full((5,), float(rank))
    hocc.all_reduce(x)  # calls go on, numbered alike on every rank
    assert torch.all(x == sum(range(world)))


@pytest.mark.parametrize("spec", ["2x2", "1x3"])
def test_the_tuners_agreement_is_the_slowest_ranks(spec: str) -> None:
    """The tuner's agreement (the slowest rank's times), run through the engine's own executor on CPU."""
    run_world(parse_spec(spec).world_size, _world_agreement, env=hocc_env(spec, "shm"), timeout_s=120)


def _world_tiny_edge(rank: int, world: int, tiny_bytes: int) -> None:
    """Sizes on both sides of the frame's room, every op and a few dtypes, against torch's own."""
    ops = (dist.ReduceOp.SUM, dist.ReduceOp.MAX, dist.ReduceOp.MIN, dist.ReduceOp.PRODUCT)
    for dtype in (torch.float32, torch.float64, torch.int32, torch.float16):
        es = torch.empty((), dtype=dtype).element_size()
        edge = tiny_bytes // (world * es)
        for n in (0, 1, edge - 1, edge, edge + 1):
            for op in ops:
                x = (torch.arange(n) % 3 + rank + 1).to(dtype)
                want = x.clone()
                dist.all_reduce(want, op=op)
                hocc.all_reduce(x, op=op, algo="native")
                assert torch.equal(x, want), (dtype, n, op)
            g = torch.empty(world * n, dtype=dtype)
            hocc.all_gather_into_tensor(g, torch.full((n,), rank, dtype=dtype), algo="native")
            assert torch.equal(g, torch.arange(world).repeat_interleave(n).to(dtype)), (dtype, n)
            rs_in = (torch.arange(world * n) % 5 + rank).to(dtype)
            rs, want_rs = torch.empty(n, dtype=dtype), torch.empty(n, dtype=dtype)
            hocc.reduce_scatter_tensor(rs, rs_in, algo="native")
            dist.reduce_scatter_tensor(want_rs, rs_in.clone())
            assert torch.equal(rs, want_rs), (dtype, n)
    # in place, and a tiny AVG
    x = torch.full((3,), float(rank))
    hocc.all_reduce(x, op=dist.ReduceOp.AVG, algo="native")
    assert torch.allclose(x, torch.full((3,), (world - 1) / 2))


@pytest.mark.parametrize("spec", ["1x2", "1x3", "2x2"])
def test_tiny_calls_at_the_frames_edge(spec: str) -> None:
    """Two members exchange their frames, more go up and down a tree (odd: the root's extra frame)."""
    from hocc.executor import load

    world = parse_spec(spec).world_size
    run_world(world, _world_tiny_edge, int(load().TINY_BYTES), env=hocc_env(spec, "shm"), timeout_s=300)


def test_pick_settings_fix_the_depth() -> None:
    assert Pick("ho_ring", 8, "").settings(CPU).chunks == 8
    assert Pick("native", None, "").settings(CPU) is CPU


def _world_deferred(rank: int, world: int) -> None:
    from hocc.config import get_config
    from hocc.engine.group_engines import find_engine

    def call(i: int) -> None:
        x = torch.full((5,), float(rank + i))
        hocc.all_reduce(x)
        assert torch.all(x == sum(range(world)) + world * i), (i, x)

    call(0), call(1)  # the first sets its communicators up; the second runs plain, and takes the calls left
    eng = find_engine(dist.group.WORLD, torch.device("cpu"))
    assert eng is not None
    b = eng.tuner(get_config())._buckets[("all_reduce", "float32", bucket_of(5 * 4))]
    left = b.deferred - 2
    assert left > 0 and b.ran_first == b.deferred, (b.deferred, b.ran_first)  # this test needs a wait to lease
    full = count_full_way(eng)
    for i in range(left):
        call(2 + i)
    assert full == [0], f"{full[0]} of the {left} calls before the trials took the engine's full way"
    i = 2 + left
    while not eng.tuner(get_config()).decided():  # the trials, then the decision, alike on every rank
        call(i)
        i += 1
        assert i < 2 + left + 400, "the trials never ended"
    assert full[0] > 0
    mine = sorted((k, p.algo, p.chunks) for k, p in eng.tuner(get_config()).decided().items())
    every: list[object] = [None] * world
    dist.all_gather_object(every, mine)
    assert all(e == mine for e in every), every


def test_the_calls_before_the_trials_are_prepared() -> None:
    """The model's pick runs a bucket's calls until its trials are worth their cost; those calls are prepared
    (counted: Tuner.lease), so they cost what a settled bucket's do, and every rank starts measuring at
    the same call after them."""
    run_world(4, _world_deferred, env={**hocc_env("2x2", "shm"), "HOCC_TUNE": "1"}, timeout_s=300)
