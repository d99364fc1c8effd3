"""What HO-Ring's two builders share: one chunk's stages as data, how a
stage's groups run, and the K chunks' steps from one chunk's stages."""

from __future__ import annotations

from collections.abc import Sequence

from hocc.plan.types import GroupSlice, Step

# per chunk, in stage order: (op, tier, impl, groups as (offset, seg, members) in units of the chunk)
Stage = tuple[str, str, str, list[tuple[int, int, tuple[int, ...]]]]


def step_impl(op: str, tier: str, members: Sequence[tuple[int, ...]], ring_ops: tuple[str, ...],
              host_impl: str) -> str:
    """How a stage's groups run: `host_impl` on the host tier if set; else the
    backend's collective where every group is in rank order and op is not in
    ring_ops; else a point-to-point ring in the listed order."""
    if host_impl and tier == "host":
        return host_impl
    native = op not in ring_ops and all(list(m) == sorted(m) for m in members)
    return "native" if native else "ring"


def emit(stages: list[Stage], chunks: int, chunk_len: int, scale: int) -> tuple[Step, ...]:
    """The steps of K chunks: chunk k's stage i is stages[i] with its units
    times `scale`, at k * chunk_len."""
    return tuple(Step(i, k, op, impl, tier,
                      tuple(GroupSlice(m, k * chunk_len + off * scale, seg * scale) for off, seg, m in groups))
                 for k in range(chunks) for i, (op, tier, impl, groups) in enumerate(stages))
