"""An engine's work buffers. On CPU one is kept between calls: a fresh large
allocation costs a page fault per 4 KiB (torch's CPU allocator returns big
blocks to the OS), which at 8 ranks on 2 cores costs more than the copies.
On CUDA torch's caching allocator does that already."""

from __future__ import annotations

import threading

import torch


class WorkPool:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._spare: torch.Tensor | None = None

    def take(self, nbytes: int, device: torch.device) -> torch.Tensor:
        """A byte buffer of at least `nbytes` on `device`."""
        if device.type != "cpu":
            return torch.empty(nbytes, dtype=torch.uint8, device=device)
        with self._lock:
            spare, self._spare = self._spare, None
        if spare is None or spare.numel() < nbytes:
            spare = torch.empty(max(nbytes, 1), dtype=torch.uint8)
        return spare

    def give_back(self, buf: torch.Tensor) -> None:
        """Keep a CPU buffer for the next call (only after a run ended well: a
        failed run's buffer may still be written by a backend op that timed out)."""
        if buf.device.type == "cpu":
            with self._lock:
                if self._spare is None or self._spare.numel() < buf.numel():
                    self._spare = buf

    def clear(self) -> None:
        with self._lock:
            self._spare = None
