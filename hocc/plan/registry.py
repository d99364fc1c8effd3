"""The algorithm registry: what the planner, the engine, config, hocc-bench's
CLI and the call check know of an algorithm, in one record per algorithm.

An algorithm is a name, a builder, a predictor and its constraints:

  build(collective, topo, count, cfg, chunks) -> Plan | None
      the plan for `count` elements per block (None: it cannot run on topo;
      the planner then runs `fallback` and says why). Every builder makes
      plans linear in their piece (hocc.plan.shapes): the engine builds one
      unit per K and scales it.
  predict(collective, topo, count, elem_size, cfg) -> Prediction | None
      the cost model's time (None: it cannot run), with the K it would use.
  chunked
      it has a pipeline depth K (cfg.chunks, else the model's per size);
      measured selection tries several.
  price(collective, topo, count, elem_size, cfg, chunks) -> (K, PlanCost) | None
      a chunked algorithm's compiled cost at K chunks without building that
      plan (calibration prices every row with it); None: build and compile.
  role
      "backend": the backend's own collective, auto's default that another
      pick must beat by cfg.native_margin; "ring": the point-to-point ring,
      that default instead for the ops in cfg.ring_ops. One of each.

A new algorithm is one module and one `register` call (hocc.plan.algorithms
registers the built-in native, ring and ho_ring). The ranks' call check
compares an algorithm's name by its first 8 characters, which register()
keeps unique.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields

from hocc.plan.cost import CostParams, PlanCost
from hocc.plan.types import Plan
from hocc.topology import Topology

CPU_MIN_CHUNK_BYTES = 64 * 1024  # PlannerConfig.min_chunk_bytes' default (hocc.plan.policy: CUDA's)


@dataclass(frozen=True)
class PlannerConfig:
    """What every algorithm's builder and predictor read.
    chunks: force a chunked algorithm's pipeline depth K (HO-Ring's; None: the cost model picks).
    min_chunk_bytes / max_chunks bound the K the cost model may pick. The floor guards against what the model
    does not price: 64 KiB, CPU ranks over shared memory and UCX, where deeper pipelines won wherever the model
    picked them (emulated 2x2x2 and 2x4 at 1 Gbit/s: 0.71-0.99x the time at the 512 KiB it was; 2x4 at
    200 Mbit/s level; bench/results/chunks/); on CUDA the policy keeps 512 KiB (hocc.plan.policy: not measured
    on a GPU).
    native_margin: auto leaves native only for a predicted gain above this.
    ring_ops: HO-Ring steps of these ops run as point-to-point rings instead of
    the backend's collective (the engine sets it per backend).
    host_impl: 'shm' runs HO-Ring's host-level steps through shared memory
    (CPU tensors); '' leaves them to native / ring_ops.
    max_chunk_bytes: K is at least the buffer over this. Large single messages
    through a shaped TCP link lose throughput, which the byte model does not
    see (2x4 @ 200 Mbit/s, 64 MiB all_gather: 52% of the link bound at K=1,
    68% at K=4, 82% at K=32; but at 1 Gbit/s, where the CPU is the limit,
    K=4 beat K=32); the engine sets it to 0.1 s of NIC time for gloo."""

    chunks: int | None = None
    min_chunk_bytes: int = CPU_MIN_CHUNK_BYTES
    max_chunks: int = 32
    native_margin: float = 0.05
    ring_ops: tuple[str, ...] = ()
    host_impl: str = ""
    max_chunk_bytes: int | None = None
    params: CostParams = field(default_factory=CostParams)

    def __hash__(self) -> int:
        # computed once: the engine's plan cache hashes these on every call (the generated hash walks
        # CostParams' fields each time, a few us a call)
        h: int | None = self.__dict__.get("_hash")
        if h is None:
            h = hash(tuple(getattr(self, f.name) for f in fields(self)))
            object.__setattr__(self, "_hash", h)
        return h

    def __getstate__(self) -> dict[str, object]:
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}  # str hashes differ between processes


@dataclass(frozen=True)
class Prediction:
    """One algorithm's predicted seconds for a call (`chunks`: its K)."""

    algo: str
    seconds: float
    chunks: int = 1


Builder = Callable[[str, Topology, int, PlannerConfig, int], "Plan | None"]
Predictor = Callable[[str, Topology, int, int, PlannerConfig], "Prediction | None"]
Pricer = Callable[[str, Topology, int, int, PlannerConfig, int], "tuple[int, PlanCost] | None"]
ROLES = ("backend", "ring")


@dataclass(frozen=True)
class Algorithm:
    name: str
    summary: str
    build: Builder
    predict: Predictor
    chunked: bool = False
    fallback: str | None = None  # what runs where build gives None (e.g. ho_ring -> ring)
    cannot: str = ""  # says why build gives None, for the fallback's reason
    price: Pricer | None = None
    role: str = ""

    def unit(self, collective: str, topo: Topology, cfg: PlannerConfig, chunks: int) -> Plan | None:
        """The size-generic unit (hocc.plan.shapes) with K = chunks (1 for
        unchunked algorithms), or None: a chunked algorithm whose K the model
        picks per size, or one that cannot run on topo."""
        if self.chunked and cfg.chunks is None:
            return None
        k = chunks if self.chunked else 1
        return self.build(collective, topo, k, cfg, k)


_REGISTRY: dict[str, Algorithm] = {}


CALL_NAME_CHARS = 8  # what of an algorithm's name a CallId carries (csrc/core/call.h)


def register(algo: Algorithm) -> Algorithm:
    if algo.name in _REGISTRY or algo.name == "auto":
        raise ValueError(f"algorithm {algo.name!r} is registered already (or reserved)")
    same = [n for n in (*_REGISTRY, "auto") if n[:CALL_NAME_CHARS] == algo.name[:CALL_NAME_CHARS]]
    if same:  # the call check (csrc/core/call.h) carries the first 8 characters: they must tell algorithms apart
        raise ValueError(f"algorithm {algo.name!r} shares its first {CALL_NAME_CHARS} characters with {same[0]!r}; "
                         "the ranks' call check could not tell them apart")
    if algo.fallback is not None and algo.fallback not in _REGISTRY:
        raise ValueError(f"{algo.name}'s fallback {algo.fallback!r} must be registered first")
    if algo.role and (algo.role not in ROLES or any(a.role == algo.role for a in _REGISTRY.values())):
        raise ValueError(f"{algo.name}'s role {algo.role!r}: one of {ROLES}, each held by one algorithm")
    _REGISTRY[algo.name] = algo
    return algo


def algorithm(name: str) -> Algorithm:
    """The registered algorithm `name`; a clear error for any other."""
    if name not in _REGISTRY:
        raise ValueError(f"unknown algo {name!r}; expected one of {(*names(), 'auto')}")
    return _REGISTRY[name]


def names() -> tuple[str, ...]:
    """Registered algorithms, in registration order."""
    return tuple(_REGISTRY)


def with_role(role: str) -> str:
    """The registered algorithm that plays `role` (ROLES)."""
    for a in _REGISTRY.values():
        if a.role == role:
            return a.name
    raise ValueError(f"no registered algorithm has the role {role!r}")
