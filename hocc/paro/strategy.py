"""PaRO-DP strategies: three scope letters (parameters, gradients, optimizer
states), each N (not sharded), I (sharded inside the intra-group, a host by
default) or G (sharded over all ranks); and the schedule of collectives each
one implies. No torch: the wrapper runs this schedule and the cost model
prices it, so both read the same data.

The layout the schedule assumes (hocc/paro/layout.py): a unit's flat vector,
padded to W blocks, rail-major: the I shard of intra-group position l is one
contiguous range holding the G blocks of rail l's members, in rail order. So
I -> G is a reduce-scatter over the rail and G -> I an all-gather over it,
N <-> I runs inside the host, and N <-> G over the world is the two of them in
sequence (rail stage and host stage: HO-Ring's two stages, with no block
permuted).

Which collectives, over which scope, how often (A micro-steps per optimizer step):

  per micro-step   p = I: all-gather parameters inside the host (I -> N)
                   p = G: all-gather parameters over the world (G -> N)
                   (paro_shard gathers for forward and again for backward, except the root's)
                   g = I: reduce-scatter the micro-step's gradients inside the host (N -> I)
                   g = G: reduce-scatter them over the world (N -> G)
                   (g = N accumulates locally: nothing moves)
  per opt. step    gradients to the optimizer's scope, from what accumulated (at the synced backward):
                     g = N, os = N: all-reduce over the world
                     g = N, os = I: reduce-scatter in the host, all-reduce over the rail
                     g = N, os = G: reduce-scatter over the world
                     g = I, os = I: all-reduce over the rail
                     g = I, os = G: reduce-scatter over the rail
                   updated parameters back to their scope (at the next forward):
                     os = G, p = N: all-gather over the world
                     os = G, p = I: all-gather over the rail
                     os = I, p = N: all-gather inside the host
So gradients cross hosts once per optimizer step unless g = G, and parameters
cross hosts every micro-step only when p = G: the paper's trade (memory
redundancy inside the group for fewer and smaller inter-group rounds).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

SCOPES = "NIG"
Scope = Literal["N", "I", "G"]
Where = Literal["host", "rail", "world"]
When = Literal["micro", "step"]

# The strategies the paper names, plus NNN (= DDP), in the paper's spirit: most
# memory first.
PAPER_STRATEGIES: tuple[str, ...] = ("NNN", "NNG", "NIG", "NGG", "ING", "IIG", "IGG", "III", "GGG")

_ORDER = {"N": 0, "I": 1, "G": 2}


@dataclass(frozen=True)
class Collective:
    """One collective a strategy runs: `op` over `where` ('host' = the
    intra-group, 'rail' = the inter-group of ranks at the same position,
    'world'), every micro-step or once per optimizer step, on `state`,
    turning scope `src` into scope `dst` (all_reduce keeps the scope)."""

    op: Literal["all_gather", "reduce_scatter", "all_reduce"]
    where: Where
    when: When
    state: Literal["params", "grads"]
    src: Scope
    dst: Scope

    def describe(self) -> str:
        arrow = f"{self.src}->{self.dst}" if self.src != self.dst else self.src
        return f"{self.op}({self.state} {arrow}) over {self.where}, per {self.when}"


@dataclass(frozen=True)
class Strategy:
    params: Scope
    grads: Scope
    optim: Scope

    @property
    def name(self) -> str:
        return self.params + self.grads + self.optim

    def __str__(self) -> str:
        return self.name

    def schedule(self) -> tuple[Collective, ...]:
        """The collectives of one optimizer step, in the order they run."""
        p, g, o = self.params, self.grads, self.optim
        out: list[Collective] = []
        if p == "I":
            out.append(Collective("all_gather", "host", "micro", "params", "I", "N"))
        elif p == "G":
            out.append(Collective("all_gather", "world", "micro", "params", "G", "N"))
        if g == "I":
            out.append(Collective("reduce_scatter", "host", "micro", "grads", "N", "I"))
        elif g == "G":
            out.append(Collective("reduce_scatter", "world", "micro", "grads", "N", "G"))
        if g == "N" and o == "N":
            out.append(Collective("all_reduce", "world", "step", "grads", "N", "N"))
        elif g == "N" and o == "I":
            out.append(Collective("reduce_scatter", "host", "step", "grads", "N", "I"))
            out.append(Collective("all_reduce", "rail", "step", "grads", "I", "I"))
        elif g == "N" and o == "G":
            out.append(Collective("reduce_scatter", "world", "step", "grads", "N", "G"))
        elif g == "I" and o == "I":
            out.append(Collective("all_reduce", "rail", "step", "grads", "I", "I"))
        elif g == "I" and o == "G":
            out.append(Collective("reduce_scatter", "rail", "step", "grads", "I", "G"))
        if o == "G" and p == "N":
            out.append(Collective("all_gather", "world", "step", "params", "G", "N"))
        elif o == "G" and p == "I":
            out.append(Collective("all_gather", "rail", "step", "params", "G", "I"))
        elif o == "I" and p == "N":
            out.append(Collective("all_gather", "host", "step", "params", "I", "N"))
        return tuple(out)


def rejection(name: str) -> str | None:
    """Why a well-formed three-letter name is not a strategy, or None if it is one."""
    p, g, o = name[0], name[1], name[2]
    if _ORDER[o] < _ORDER[g]:
        return (f"{name}: optimizer states ({o}) are sharded less than gradients ({g}); each rank's optimizer "
                f"would need gradients it does not hold, i.e. an extra all-gather of gradients every step, for "
                f"no memory saved. Reduce gradients to the optimizer's scope instead: use "
                f"{p}{g}{g} or {p}{o}{o}")
    if _ORDER[o] < _ORDER[p]:
        return (f"{name}: optimizer states ({o}) are sharded less than parameters ({p}); a rank would update "
                f"parameters it does not keep and throw the result away: optimizer memory without a use. "
                f"Use {p}{g}{p if _ORDER[p] >= _ORDER[g] else g}")
    return None


def all_strategies() -> tuple[Strategy, ...]:
    """Every combination that runs (14 of the 27): optimizer states sharded at
    least as finely as parameters and gradients."""
    names = [a + b + c for a in SCOPES for b in SCOPES for c in SCOPES]
    return tuple(parse(n) for n in names if rejection(n) is None)


def parse(name: str | Strategy) -> Strategy:
    """'NIG' -> Strategy('N', 'I', 'G'); a clear error for anything else."""
    if isinstance(name, Strategy):
        return name
    text = str(name).strip().upper()
    if len(text) != 3 or any(c not in SCOPES for c in text):
        raise ValueError(f"PaRO strategy {name!r} must be three letters from N, I, G (parameters, gradients, "
                         f"optimizer states), e.g. 'NIG', 'IIG', 'GGG'")
    why = rejection(text)
    if why is not None:
        raise ValueError(f"PaRO strategy {why}")
    return Strategy(text[0], text[1], text[2])  # type: ignore[arg-type]
