"""Suite-wide settings, inherited by every rank the tests start.

None of hocc's: the suite runs the defaults users get, auto's measured
selection included (HOCC_TUNE=1). A test that needs a fixed plan pins it
itself and says why. Tests marked root skip with one reason when the run is
not root, and the run says so beside its counts."""

from __future__ import annotations

import os

import pytest

ROOT_REASON = "needs root (network namespaces and tc for the emulated cluster): run as root, as CI does"


def _is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked root skip here, with one reason, when the run is not root."""
    if _is_root():
        return
    for item in items:
        if item.get_closest_marker("root") is not None:
            item.add_marker(pytest.mark.skip(reason=ROOT_REASON))


NOT_ROOT = "not run (needs root)"


def pytest_report_teststatus(report: pytest.TestReport) -> tuple[str, str, str] | None:
    """A root test skipped for want of root is counted apart in the run's last line
    ("1140 passed, 12 not run (needs root) in ..."), not folded into the skips."""
    if report.skipped and ROOT_REASON in str(report.longrepr):
        return NOT_ROOT, "R", "NOT RUN (needs root)"
    return None


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """A run that left out root tests says why, above the counts."""
    skipped = terminalreporter.stats.get(NOT_ROOT, [])
    if skipped:
        terminalreporter.write_line(f"hocc: {len(skipped)} root test(s) did not run: {ROOT_REASON}", yellow=True)
