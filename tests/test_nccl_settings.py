"""The NCCL watchdog's settings, read on the CPU (the watchdog itself needs a
GPU: bench/gpu_check.sh runs it): torch's TORCH_NCCL_ASYNC_ERROR_HANDLING and
TORCH_NCCL_BLOCKING_WAIT are honoured, HOCC_ ones take precedence, hocc's
default differs from torch's (abort the communicators, keep the process), and
a bad value says what the values mean."""

from __future__ import annotations

import pytest

from hocc.executor.nccl import ON_ERROR_DEFAULT, blocking_wait, on_error_mode

NAMES = ("HOCC_NCCL_ASYNC_ERROR_HANDLING", "TORCH_NCCL_ASYNC_ERROR_HANDLING", "HOCC_NCCL_BLOCKING_WAIT",
         "TORCH_NCCL_BLOCKING_WAIT")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in NAMES:
        monkeypatch.delenv(name, raising=False)


def test_async_error_handling_follows_torch_with_hocc_first(monkeypatch: pytest.MonkeyPatch) -> None:
    assert on_error_mode() == ON_ERROR_DEFAULT == 2
    monkeypatch.setenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", "3")
    assert on_error_mode() == 3
    monkeypatch.setenv("HOCC_NCCL_ASYNC_ERROR_HANDLING", "0")
    assert on_error_mode() == 0
    monkeypatch.setenv("HOCC_NCCL_ASYNC_ERROR_HANDLING", "abort")
    with pytest.raises(ValueError, match=r"HOCC_NCCL_ASYNC_ERROR_HANDLING='abort': use 0 .* 3"):
        on_error_mode()


def test_blocking_wait_follows_torch_with_hocc_first(monkeypatch: pytest.MonkeyPatch) -> None:
    assert not blocking_wait()
    monkeypatch.setenv("TORCH_NCCL_BLOCKING_WAIT", "1")
    assert blocking_wait()
    monkeypatch.setenv("HOCC_NCCL_BLOCKING_WAIT", "0")
    assert not blocking_wait()
