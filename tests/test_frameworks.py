"""Real frameworks trained on the "hocc" backend, each against the same run on gloo.

tests/frameworks/run_all.py runs four phases in one torchrun launch of 4 CPU ranks (the imports of torch and
Lightning on 4 ranks cost more than the training), each on a process group of its own:

- lightning_ddp: Lightning's DDP strategy: fit with `self.log(..., sync_dist=True)` and a validation loop,
  torchmetrics metrics synced across ranks, then `trainer.validate()` (under torch.inference_mode() on any
  backend but gloo).
- lightning_fsdp: Lightning's ModelParallelStrategy with FSDP2 (fully_shard in configure_model), resumed
  from a sharded checkpoint and from a full one.
- accelerate: Accelerate's Accelerator(cpu=True) on the group the script made, training,
  gather_for_metrics under torch.inference_mode(), save_state / load_state.
- fsdp_dcp: FSDP2 with torch.distributed.checkpoint: dcp.save, dcp.async_save, dcp.load, and full state
  dicts loaded with broadcast_from_rank0=True.

It runs three times: on gloo, on "hocc" (one host of 4 ranks; auto picks gloo's own collective for calls
this small) and on "hocc" with HOCC_TOPOLOGY=2x2 HOCC_ALGO=ho_ring (two hosts of 2, every planned collective
through HO-Ring: shared memory in a host, gloo between). Each phase's test checks that every rank ends with the
same parameters and logged values, that a resumed run ends where the uninterrupted one does, and on hocc that
parameters and every logged value match the gloo run's.
"""

from __future__ import annotations

import importlib.util
import math
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, NamedTuple

import pytest

FRAMEWORKS = Path(__file__).resolve().parent / "frameworks"
RANKS = 4
LAUNCH_TIMEOUT_S = 300  # one launch takes 45-90 s on 2 cores; run_all.py prints the stacks of a phase stuck 120 s
PARAM_TOL = 1e-5  # max abs difference of any parameter (hocc against gloo; ranks; resumed against continuous)
METRIC_RTOL, METRIC_ATOL = 1e-5, 1e-6

_MISSING = [m for m in ("lightning", "accelerate", "torchmetrics") if importlib.util.find_spec(m) is None]
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(bool(_MISSING), reason=f"needs {', '.join(_MISSING)}: pip install -e '.[test]'")]

# run name: (backend, hocc settings). With HOCC_ALGO=auto (the default) the frameworks' small collectives
# plan as "native" (gloo inside hocc's executor); the 2x2 run makes every planned collective HO-Ring's.
RUNS: dict[str, tuple[str, dict[str, str]]] = {
    "gloo": ("gloo", {}),
    "hocc": ("hocc", {}),
    "hocc-2x2-ho_ring": ("hocc", {"HOCC_TOPOLOGY": "2x2", "HOCC_ALGO": "ho_ring"}),
}


class Phase(NamedTuple):
    same: tuple[tuple[str, str], ...] = ()  # (tag, tag): params, and metrics "<tag>/...", equal within a run
    expect: tuple[tuple[str, list[float]], ...] = ()  # (metric, its known value)


PHASES = {
    "lightning_ddp": Phase(),
    "lightning_fsdp": Phase(same=(("resumed_sharded", "continuous"), ("resumed_full", "continuous"))),
    # 50 evaluation points: gather_for_metrics must drop the padding of the last batch
    "accelerate": Phase(same=(("resumed", "continuous"),),
                        expect=tuple((f"{tag}/eval_points", [50.0]) for tag in ("epochs12", "continuous", "resumed"))),
    "fsdp_dcp": Phase(same=(("sync", "continuous"), ("async", "continuous"), ("full", "continuous"))),
}


class Launch(NamedTuple):
    out: Path
    cmd: str
    returncode: int | None  # None: ran past LAUNCH_TIMEOUT_S
    output: str


def _launch(run: str, out: Path) -> Launch:
    backend, settings = RUNS[run]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(RANKS),
           str(FRAMEWORKS / "run_all.py"), "--backend", backend, "--out", str(out)]
    # no HOCC_* setting of the caller's: the defaults users get
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOCC_")}
    env.update(OMP_NUM_THREADS="1", **settings)
    # a session of its own, so that a timeout ends torchrun's ranks too
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=LAUNCH_TIMEOUT_S)
        returncode: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        returncode = None
    prefix = "".join(f"{k}={v} " for k, v in settings.items())
    return Launch(out, prefix + " ".join(cmd), returncode, output)


@pytest.fixture(scope="module")
def launches(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """run name -> its Launch, each launched once (on first use) for all the phases' tests."""
    done: dict[str, Launch] = {}

    def get(run: str) -> Launch:
        if run not in done:
            done[run] = _launch(run, tmp_path_factory.mktemp(f"frameworks-{run}"))
        return done[run]

    return get


def _results(launch: Launch, phase: str, run: str) -> list[dict[str, Any]]:
    """Every rank's results of the phase, or the test fails with why there are none."""
    import torch

    d = launch.out / phase
    errors = sorted(d.glob("error-rank*.txt"))
    if errors:
        first = errors[0].read_text().strip().splitlines()
        ranks = ", ".join(p.stem.removeprefix("error-rank") for p in errors)
        pytest.fail(f"{phase} on {run} raised on rank(s) {ranks}: {first[-1]}\n{errors[0].name}:\n"
                    + "\n".join(first[-30:]) + f"\n\n{launch.cmd}")
    files = [d / f"rank{r}.pt" for r in range(RANKS)]
    if not all(f.exists() for f in files):
        how = f"ran past {LAUNCH_TIMEOUT_S} s" if launch.returncode is None else f"exited {launch.returncode}"
        where = "in it" if (d / "started").exists() else "before it"
        pytest.fail(f"{phase} on {run}: no results; the launch {how} {where}:\n{launch.output[-6000:]}\n\n{launch.cmd}")
    return [torch.load(f, weights_only=True) for f in files]


def _param_diff(a: dict[str, Any], b: dict[str, Any]) -> float:
    assert a.keys() == b.keys(), (sorted(a), sorted(b))
    for name in a:
        assert a[name].shape == b[name].shape, (name, a[name].shape, b[name].shape)
    return max(float((a[name] - b[name]).abs().max()) for name in a)


def _close(a: Any, b: Any) -> bool:
    a, b = (a if isinstance(a, list) else [a]), (b if isinstance(b, list) else [b])
    if len(a) != len(b):
        return False
    return all(math.isclose(x, y, rel_tol=METRIC_RTOL, abs_tol=METRIC_ATOL) for x, y in zip(a, b, strict=True))


def _check_run(phase: str, run: str, ranks: list[dict[str, Any]]) -> None:
    """The same on every rank; resumed runs where the uninterrupted one ends; known values."""
    zero = ranks[0]
    for r, res in enumerate(ranks[1:], 1):
        for tag in zero["params"]:
            diff = _param_diff(res["params"][tag], zero["params"][tag])
            assert diff < PARAM_TOL, f"{phase} on {run}: rank {r}'s {tag} parameters differ from rank 0's by {diff}"
        assert res["metrics"].keys() == zero["metrics"].keys()
        bad = {k: (v, res["metrics"][k]) for k, v in zero["metrics"].items() if not _close(v, res["metrics"][k])}
        assert not bad, f"{phase} on {run}: rank {r}'s logged values differ from rank 0's (rank 0, rank {r}): {bad}"
    spec = PHASES[phase]
    for tag, ref in spec.same:
        diff = _param_diff(zero["params"][tag], zero["params"][ref])
        assert diff < PARAM_TOL, f"{phase} on {run}: {tag} ends {diff} away from {ref}"
        mine = [k for k in zero["metrics"] if k.startswith(f"{tag}/")]
        assert mine, f"{phase} on {run}: nothing logged under {tag}/"
        for k in mine:
            other = ref + k.removeprefix(tag)
            assert _close(zero["metrics"][k], zero["metrics"][other]), \
                f"{phase} on {run}: {k} {zero['metrics'][k]} but {other} {zero['metrics'][other]}"
    for k, want in spec.expect:
        assert zero["metrics"][k] == want, f"{phase} on {run}: {k} is {zero['metrics'][k]}, not {want}"


CASES = [(phase, run) for run in RUNS for phase in PHASES]


@pytest.mark.parametrize(("phase", "run"), CASES, ids=[f"{phase}-{run}" for phase, run in CASES])
def test_framework(phase: str, run: str, launches: Any) -> None:
    ranks = _results(launches(run), phase, run)
    _check_run(phase, run, ranks)
    if run == "gloo":
        return
    gloo_launch = launches("gloo")
    if not all((gloo_launch.out / phase / f"rank{r}.pt").exists() for r in range(RANKS)):
        pytest.fail(f"{phase}: the gloo run to compare with has no results (its own test says why)")
    gloo = _results(gloo_launch, phase, "gloo")[0]
    mine = ranks[0]
    assert mine["params"].keys() == gloo["params"].keys()
    for tag in gloo["params"]:
        diff = _param_diff(mine["params"][tag], gloo["params"][tag])
        assert diff < PARAM_TOL, f"{phase}: {tag} parameters on {run} differ from gloo's by {diff}"
    assert mine["metrics"].keys() == gloo["metrics"].keys(), (sorted(mine["metrics"]), sorted(gloo["metrics"]))
    bad = {k: (v, mine["metrics"][k]) for k, v in gloo["metrics"].items() if not _close(v, mine["metrics"][k])}
    assert not bad, f"{phase}: logged values on {run} differ from gloo's (gloo, {run}): {bad}"
