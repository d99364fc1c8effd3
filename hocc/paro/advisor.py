"""The guideline: which PaRO strategy to train with (no torch).

Every strategy that runs is given its memory per rank at its peak, during
forward and backward (hocc/paro/memory.py: the sharded states plus the units
a pass holds gathered), and its communication per optimizer step priced by
hocc's planner (hocc/paro/comm.py). Those whose peak fits in the memory
budget are ranked by predicted time per step (less memory breaks ties), and
the winner is explained against the runner-up and against faster strategies
that do not fit. Without a compute time the time is the communication
alone; with the measured compute time of a micro-step, as the paper's
guideline takes it, a micro-step costs the larger of its compute and its
communication (paro_shard overlaps the two; `overlap` < 1 where they share
the same cores) and the step's own reduction is added once."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hocc.paro.comm import StepComm, comm_per_step
from hocc.paro.memory import Memory, StateBytes, UnitSize, memory_per_rank, peak_per_rank
from hocc.paro.strategy import PAPER_STRATEGIES, all_strategies
from hocc.topology import Topology

# what torch offers for the same trade, where it has one
EQUIVALENTS = {
    "NNN": "DDP",
    "GGG": "FSDP2 fully_shard",
    "NGG": "FSDP2 fully_shard(reshard_after_forward=False) holds parameters whole from forward to the end of "
           "backward, as NGG does; between steps FSDP2 keeps them sharded (G)",
    "III": "HSDP: fully_shard on a 2-D mesh (replicate across hosts, shard inside)",
    "IGG": "FSDP2 fully_shard(reshard_after_forward=<host size>): backward gathers inside the host only",
}


@dataclass(frozen=True)
class Option:
    strategy: str
    memory: Memory      # held between micro-steps of an accumulation
    peak: Memory        # the most held during forward and backward
    comm: StepComm
    fits: bool
    compute_s: float | None = None
    overlap: float = 1.0  # the share of the shorter of compute and communication hidden behind the other

    @property
    def seconds(self) -> float:
        """Predicted seconds per optimizer step: communication alone, or with
        compute (module docstring): overlap 1 hides the shorter of a
        micro-step's compute and communication behind the other (the paper's
        guideline; a GPU's copy engines and NICs beside its cores), 0 adds
        them (ranks that share their CPU cores with their communication)."""
        if self.compute_s is None:
            return self.comm.total("seconds")
        micro = self.comm.per("micro")["seconds"]
        busy = self.compute_s + micro - self.overlap * min(self.compute_s, micro)
        return self.comm.accum * busy + self.comm.per("step")["seconds"]


def evaluate(numel: int, topo: Topology, accum: int = 1, memory_budget: float | None = None,
             per_param: StateBytes | None = None, elem_size: int = 2, backend: str = "gloo",
             strategies: tuple[str, ...] | None = None, reserve: float = 0.0,
             units: Sequence[int | UnitSize] | None = None, compute_s: float | None = None,
             trainable: int | None = None, overlap: float = 1.0) -> list[Option]:
    """Every strategy (or those named), ranked: fitting ones by predicted
    seconds per step, then the ones that do not fit. units: the parameters of
    each unit the model is wrapped as (forward order; a UnitSize says how many
    train); the root owns what they leave of `numel` (and of `trainable`, the
    model's trainable parameters; None: all). None: one unit, the whole model."""
    if numel < 1:
        raise ValueError(f"the model needs at least one parameter, got {numel}")
    if not 0.0 <= overlap <= 1.0:
        raise ValueError(f"overlap is a share between 0 and 1, got {overlap}")
    sized = [u if isinstance(u, UnitSize) else UnitSize(u) for u in units or []]
    held = sum(u.numel for u in sized)
    if held > numel:
        raise ValueError(f"the units hold {held} parameters, more than the model's {numel}")
    root = UnitSize(numel - held, None if trainable is None else max(trainable - sum(u.trains for u in sized), 0))
    group = len(topo.host_groups()[0])
    names = strategies or tuple(s.name for s in all_strategies())
    out = []
    for name in names:
        mem = memory_per_rank(name, numel, topo.world_size, group, per_param)
        peak = peak_per_rank(name, sized, root, topo.world_size, group, per_param, accum)
        comm = comm_per_step(name, numel, topo, accum, elem_size, backend, units=len(sized) + 1)
        fits = memory_budget is None or peak.total + reserve <= memory_budget
        out.append(Option(name, mem, peak, comm, fits, compute_s, overlap))
    return sorted(out, key=lambda o: (not o.fits, o.seconds, o.peak.total))


def _gb(n: float) -> str:
    return f"{n / 1e9:.3g} GB"


def explain(options: list[Option], memory_budget: float | None) -> str:
    """Why the top option wins, in a few sentences from the numbers."""
    fitting = [o for o in options if o.fits]
    if not fitting:
        least = min(options, key=lambda o: o.peak.total)
        return (f"No strategy fits: the least peak memory is {least.strategy}'s {_gb(least.peak.total)} per rank. "
                f"Add ranks, wrap smaller units, use a smaller model or free memory (activations are not counted "
                f"here).")
    top = fitting[0]
    per_step, micro = top.comm.per("step"), top.comm.per("micro")
    what = "communication" if top.compute_s is None else "time (compute overlapped)"
    lines = [f"{top.strategy} wins: {top.seconds:.4g} s of {what} per optimizer step, "
             f"{_gb(top.peak.total)} per rank at its peak. Per step it sends "
             f"{_gb(top.comm.total('inter_bytes'))} per rank "
             f"between groups in {top.comm.total('inter_rounds'):.0f} rounds "
             f"({micro['inter_rounds']:.0f} per micro-step, {per_step['inter_rounds']:.0f} once per step) and "
             f"{_gb(top.comm.total('intra_bytes'))} inside them."]
    if len(fitting) > 1:
        nxt = fitting[1]
        lines.append(f"The runner-up {nxt.strategy} needs {nxt.seconds / top.seconds:.2f}x the time "
                     f"({_gb(nxt.comm.total('inter_bytes'))} between groups in "
                     f"{nxt.comm.total('inter_rounds'):.0f} rounds) with {_gb(nxt.peak.total)} per rank at its peak.")
    faster = [o for o in options if not o.fits and o.seconds < top.seconds]
    if faster and memory_budget is not None:
        lines.append("Faster but over the budget of " + _gb(memory_budget) + ": "
                     + ", ".join(f"{o.strategy} ({_gb(o.peak.total)})" for o in faster) + ".")
    if top.strategy in EQUIVALENTS:
        lines.append(f"In torch: {EQUIVALENTS[top.strategy]}.")
    return "\n".join(lines)


def table(options: list[Option]) -> str:
    """A markdown table, ranked."""
    head = ("| rank | strategy | fits | s/step | inter GB/step | inter rounds/step | intra GB/step "
            "| params GB | grads GB | optim GB | at rest GB | peak GB | in torch |")
    rows = [head, "|" + " --- |" * 13]
    for i, o in enumerate(options, 1):
        m, c = o.memory, o.comm
        tag = o.strategy + ("*" if o.strategy in PAPER_STRATEGIES else "")
        rows.append(f"| {i if o.fits else '-'} | {tag} | {'yes' if o.fits else 'no'} | {o.seconds:.4g} "
                    f"| {c.total('inter_bytes') / 1e9:.4g} | {c.total('inter_rounds'):.0f} "
                    f"| {c.total('intra_bytes') / 1e9:.4g} | {m.params / 1e9:.4g} | {m.grads / 1e9:.4g} "
                    f"| {m.optim / 1e9:.4g} | {m.total / 1e9:.4g} | {o.peak.total / 1e9:.4g} "
                    f"| {EQUIVALENTS.get(o.strategy, '').split(' holds')[0].split(':')[0]} |")
    return "\n".join(rows)
