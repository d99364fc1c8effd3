"""The GPU cost model against published nccl-tests figures
(bench/published_nccl_tests.py): the acceptance targets hold, so a change to
hocc.plan.nccl_native or its defaults that breaks them fails here. Pure model
evaluation (no GPU, no processes)."""

from __future__ import annotations

import math

from hocc.tools.nccl_model_check import calibration_carries, hit_rates, hosts, predicted_busbw
from hocc.tools.published_nccl_tests import FIGURES, MIB


def test_figures_cover_clusters_node_counts_and_sizes() -> None:
    assert len(FIGURES) >= 20 and all(f.source for f in FIGURES)
    assert len({f.cluster for f in FIGURES}) >= 4
    counts = {hosts(f) for f in FIGURES}
    assert {2, 4} <= counts and max(counts) >= 8
    assert min(f.size for f in FIGURES) <= MIB and max(f.size for f in FIGURES) >= 8 << 30


def test_defaults_predict_80_percent_of_rows() -> None:
    """Within 20% at 64 MiB and up, within 2x at 1 MiB and below, for 80% of rows each."""
    for key, (hit, total) in hit_rates().items():
        assert total and hit >= 0.8 * total, (key, hit, total)


def test_a_two_node_fit_carries_to_4_and_8_nodes() -> None:
    carried = calibration_carries()
    assert {hosts(f) for f in carried.fit_rows} == {2}
    assert {hosts(f) for f, _ in carried.predicted} == {4, 8}
    for f, pred in carried.predicted:
        assert 0.75 <= pred / f.busbw <= 1.25, (hosts(f), f.size, f.busbw, pred)
    # on rows it was not fitted on, the fit is no worse than the unfitted defaults (issue: a 2-node fit once
    # over-predicted 4 and 8 nodes by 1.37x where the defaults were within 18%)
    worst_fit = max(abs(math.log(pred / f.busbw)) for f, pred in carried.predicted)
    worst_default = max(abs(math.log(predicted_busbw(f)[1] / f.busbw)) for f, _ in carried.predicted)
    assert worst_fit <= worst_default, (math.exp(worst_fit), math.exp(worst_default))
