"""The object an async hocc call returns, shaped like torch.distributed's Work."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from concurrent.futures import Future
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from hocc.engine.queue import Ticket


def on_stream(stream: Any) -> Any:
    """A context in which `stream` (a CUDA stream) is current; nothing when it is None (CPU)."""
    return torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()


def copy_out(flat: torch.Tensor, tensors: list[torch.Tensor]) -> None:
    """Split `flat` into equal parts, one into each of `tensors` (a list form's
    outputs). Under inference_mode, as a backend's own C++ copy is: the copy
    runs on hocc's worker thread, where the caller's autograd modes do not
    hold, and must take inference tensors as well as normal ones (normal ones
    still get their version bumped)."""
    n = flat.numel() // max(len(tensors), 1)
    with torch.inference_mode():
        for i, t in enumerate(tensors):
            t.view(-1).copy_(flat[i * n:(i + 1) * n])


class Work:
    """wait(), is_completed(), is_success(), exception() and get_future(), as c10d's
    Work has them. An error in the collective is raised by wait(). `fut` is the
    engine queue's Ticket for the call (or, for then(), a Future).

    On CUDA the future's result is a CUDA event recorded after the call's
    kernels were enqueued (on the stream that was current at the call). As
    ProcessGroupNCCL's Work does, wait() then makes the caller's current stream
    wait for that event (the host does not block), and is_completed() asks the
    event whether the kernels have finished. What runs after the call (a
    then() continuation, a get_future() callback) runs on the call's stream,
    so it is ordered after the call's kernels whichever thread runs it."""

    def __init__(self, fut: Future[Any] | Ticket, result: list[torch.Tensor], stream: Any = None) -> None:
        self._fut = fut
        self._result = result
        self._stream = stream  # the call's CUDA stream; None on CPU
        self._torch_fut: torch.futures.Future[Any] | None = None

    def wait(self, timeout: timedelta | float | None = None) -> bool:
        secs = timeout.total_seconds() if isinstance(timeout, timedelta) else timeout
        done = self._fut.result(timeout=secs)
        if isinstance(done, torch.cuda.Event):
            torch.cuda.current_stream().wait_event(done)
        return True

    def run_if_next(self) -> None:
        """Run the call on this thread if the worker has not begun it and it is next (Ticket.run_if_next):
        for a waiter that is about to block on it anyway."""
        run = getattr(self._fut, "run_if_next", None)  # a queued call's Ticket (then()'s Future has none)
        if run is not None:
            run()

    def is_completed(self) -> bool:
        if not self._fut.done():
            return False
        done = None if self._fut.exception() is not None else self._fut.result()
        return not isinstance(done, torch.cuda.Event) or bool(done.query())

    def is_success(self) -> bool:
        return self._fut.done() and self._fut.exception() is None

    def exception(self) -> BaseException | None:
        return self._fut.exception() if self._fut.done() else None

    def result(self) -> list[torch.Tensor]:
        self.wait()
        return self._result

    def then(self, after: Callable[[], None], result: list[torch.Tensor]) -> Work:
        """A Work that completes once this one has and `after` has run."""
        fut: Future[Any] = Future()

        def done(_: Any) -> None:
            try:
                self._fut.result()
                with on_stream(self._stream):  # after the call's kernels, in that stream's order
                    after()
                    if self._stream is None:
                        fut.set_result(None)
                        return
                    ended = torch.cuda.Event()
                    ended.record(self._stream)
                    fut.set_result(ended)
            except BaseException as e:  # noqa: BLE001 - handed to the waiter
                fut.set_exception(e)

        self._fut.add_done_callback(done)
        return Work(fut, result, self._stream)

    def get_future(self) -> torch.futures.Future[Any]:
        """A torch.futures.Future that completes with the output tensors. On
        CUDA it is a CUDA-aware future, as ProcessGroupNCCL's: its value is set
        on the call's stream, so whoever waits on it or chains then() (DDP's
        reducer, a comm hook) has its stream ordered after the call's kernels."""
        if self._torch_fut is None:
            devices = [self._stream.device] if self._stream is not None else None
            tf: torch.futures.Future[Any] = torch.futures.Future(devices=devices)

            def done(f: Any) -> None:
                exc = f.exception()
                if exc is not None:
                    tf.set_exception(exc)
                    return
                with on_stream(self._stream):
                    tf.set_result(self._result)

            self._fut.add_done_callback(done)
            self._torch_fut = tf
        return self._torch_fut

