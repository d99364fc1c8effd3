"""A prepared call: a call shape an engine has run plainly (the executor's
run alone, set up, no trial) and will run the same way again, made once into
C++ (hocc._C.PreparedRun: the plan, executor, dtype, op and call check), so
that each repeat is one crossing with its buffers and call number."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hocc.engine.agreement import Call
from hocc.engine.plan_cache import Compiled


@dataclass(slots=True, eq=False, weakref_slot=True)  # weakly held outside its engine (hocc.api.repeat)
class Prepared:
    key: tuple[Any, ...]  # the engine's: collective, input and output numel, torch dtype, op, algo (as passed)
    run: Any  # hocc._C.PreparedRun; None once its engine dropped it (failed, closed, new settings, evicted)
    entry: Compiled  # what it runs (last_plan, and the error's names)
    collective: str
    count: int  # as the plan counts it (Call.count)
    dtype: str
    elem_size: int
    op: str

    def record_fields(self) -> tuple[str, int, str, int, str, Compiled]:
        """What the flight recorder notes of each of its calls, after the call's number (Recorder.made)."""
        return self.collective, self.count, self.dtype, self.elem_size, self.op, self.entry

    def call(self, seq: int) -> Call:
        """Call number `seq` of this shape (for its error, or the queued way)."""
        return Call(seq, self.collective, self.count, self.dtype, self.op, self.entry.algo, self.entry.hash)
