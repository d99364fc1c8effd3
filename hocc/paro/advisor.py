"""The guideline: which PaRO strategy to train with (no torch).

Every strategy that runs is given its memory per rank (hocc/paro/memory.py)
and its communication per optimizer step priced by hocc's planner
(hocc/paro/comm.py); those that fit in the memory budget are ranked by
predicted communication time per step (less memory breaks ties), and the
winner is explained against the runner-up and against faster strategies that
do not fit. Communication is not overlapped with compute in this model, so
it ranks strategies by what they add to a step, not by a whole step's time."""

from __future__ import annotations

from dataclasses import dataclass

from hocc.paro.comm import StepComm, comm_per_step
from hocc.paro.memory import Memory, StateBytes, memory_per_rank
from hocc.paro.strategy import PAPER_STRATEGIES, all_strategies
from hocc.topology import Topology


@dataclass(frozen=True)
class Option:
    strategy: str
    memory: Memory
    comm: StepComm
    fits: bool

    @property
    def seconds(self) -> float:
        return self.comm.total("seconds")


def evaluate(numel: int, topo: Topology, accum: int = 1, memory_budget: float | None = None,
             per_param: StateBytes | None = None, elem_size: int = 2, backend: str = "gloo",
             strategies: tuple[str, ...] | None = None, reserve: float = 0.0) -> list[Option]:
    """Every strategy (or those named), ranked: fitting ones by predicted
    communication seconds per step, then the ones that do not fit."""
    if numel < 1:
        raise ValueError(f"the model needs at least one parameter, got {numel}")
    group = len(topo.host_groups()[0])
    names = strategies or tuple(s.name for s in all_strategies())
    out = []
    for name in names:
        mem = memory_per_rank(name, numel, topo.world_size, group, per_param)
        comm = comm_per_step(name, numel, topo, accum, elem_size, backend)
        fits = memory_budget is None or mem.total + reserve <= memory_budget
        out.append(Option(name, mem, comm, fits))
    return sorted(out, key=lambda o: (not o.fits, o.seconds, o.memory.total))


def _gb(n: float) -> str:
    return f"{n / 1e9:.3g} GB"


def explain(options: list[Option], memory_budget: float | None) -> str:
    """Why the top option wins, in a few sentences from the numbers."""
    fitting = [o for o in options if o.fits]
    if not fitting:
        least = min(options, key=lambda o: o.memory.total)
        return (f"No strategy fits: the least memory is {least.strategy}'s {_gb(least.memory.total)} per rank. "
                f"Add ranks, use a smaller model or free memory (activations are not counted here).")
    top = fitting[0]
    per_step, micro = top.comm.per("step"), top.comm.per("micro")
    lines = [f"{top.strategy} wins: {top.seconds:.4g} s of communication per optimizer step, "
             f"{_gb(top.memory.total)} per rank. Per step it sends {_gb(top.comm.total('inter_bytes'))} per rank "
             f"between groups in {top.comm.total('inter_rounds'):.0f} rounds "
             f"({micro['inter_rounds']:.0f} per micro-step, {per_step['inter_rounds']:.0f} once per step) and "
             f"{_gb(top.comm.total('intra_bytes'))} inside them."]
    if len(fitting) > 1:
        nxt = fitting[1]
        lines.append(f"The runner-up {nxt.strategy} needs {nxt.seconds / top.seconds:.2f}x the time "
                     f"({_gb(nxt.comm.total('inter_bytes'))} between groups in "
                     f"{nxt.comm.total('inter_rounds'):.0f} rounds) with {_gb(nxt.memory.total)} per rank.")
    faster = [o for o in options if not o.fits and o.seconds < top.seconds]
    if faster and memory_budget is not None:
        lines.append("Faster but over the budget of " + _gb(memory_budget) + ": "
                     + ", ".join(f"{o.strategy} ({_gb(o.memory.total)})" for o in faster) + ".")
    return "\n".join(lines)


def table(options: list[Option]) -> str:
    """A markdown table, ranked."""
    head = ("| rank | strategy | fits | comm s/step | inter GB/step | inter rounds/step | intra GB/step "
            "| params GB | grads GB | optim GB | total GB |")
    rows = [head, "|" + " --- |" * 11]
    for i, o in enumerate(options, 1):
        m, c = o.memory, o.comm
        tag = o.strategy + ("*" if o.strategy in PAPER_STRATEGIES else "")
        rows.append(f"| {i if o.fits else '-'} | {tag} | {'yes' if o.fits else 'no'} | {o.seconds:.4g} "
                    f"| {c.total('inter_bytes') / 1e9:.4g} | {c.total('inter_rounds'):.0f} "
                    f"| {c.total('intra_bytes') / 1e9:.4g} | {m.params / 1e9:.4g} | {m.grads / 1e9:.4g} "
                    f"| {m.optim / 1e9:.4g} | {m.total / 1e9:.4g} |")
    return "\n".join(rows)
