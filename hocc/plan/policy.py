"""The planner policy: the one place that turns what a call runs on (device,
host transport, topology) into planner settings. The engine, `hocc plan`,
`hocc calibrate` and hocc-bench's JSON metadata all use it, so what is
predicted is what runs.

- ring_ops: on CPU, gloo's own reduce-scatter and all-gather lose to a
  point-to-point ring (bench/results), so HO-Ring runs those steps as rings;
  NCCL's collectives are the best there is, so none on CUDA.
- host_impl: CPU ranks of one host meet in shared memory ('shm') unless told
  to use the network ('net').
- params: on CUDA, NCCL's costs (hocc.plan.nccl_defaults) unless a calibrated
  file gave others; on CPU, the CPU testbed's defaults.
- min_chunk_bytes: the CPU's floor (PlannerConfig's default) unless set; on
  CUDA 512 KiB, the floor before the CPU's was lowered, until a GPU measures
  deeper pipelines there.
- max_chunk_bytes: between hosts over gloo, chunks of at most 0.1 s of NIC
  time keep shaped TCP links full (PlannerConfig.max_chunk_bytes); on fast
  links the rule never binds.
"""

from __future__ import annotations

from dataclasses import replace

from hocc.plan.cost import CostParams
from hocc.plan.nccl_defaults import NCCL_PARAMS
from hocc.plan.planner import PlannerConfig
from hocc.plan.registry import CPU_MIN_CHUNK_BYTES
from hocc.topology import Topology

CPU_RING_OPS: tuple[str, ...] = ("reduce_scatter", "all_gather")
HOST_TRANSPORTS: tuple[str, ...] = ("shm", "net")
CUDA_MIN_CHUNK_BYTES = 512 * 1024


def planner_settings(base: PlannerConfig, device: str, topo: Topology, host_transport: str = "shm",
                     ring_ops: tuple[str, ...] | None = None) -> PlannerConfig:
    """`base` with the settings for `device` ('cpu' or 'cuda'); ring_ops None
    takes the device's default, base.max_chunk_bytes set is kept."""
    if host_transport not in HOST_TRANSPORTS:
        raise ValueError(f"host transport {host_transport!r} is not one of {HOST_TRANSPORTS}")
    cpu = device == "cpu"
    if ring_ops is None:
        ring_ops = CPU_RING_OPS if cpu else ()
    host_impl = "shm" if cpu and host_transport == "shm" else ""
    max_chunk = base.max_chunk_bytes
    if max_chunk is None and cpu and len(topo.host_groups()) > 1:
        max_chunk = int(topo.links.nic.bandwidth * 0.1)
    params = NCCL_PARAMS if not cpu and base.params == CostParams() else base.params
    min_chunk = base.min_chunk_bytes
    if not cpu and min_chunk == CPU_MIN_CHUNK_BYTES:
        min_chunk = CUDA_MIN_CHUNK_BYTES
    return replace(base, ring_ops=ring_ops, host_impl=host_impl, max_chunk_bytes=max_chunk, params=params,
                   min_chunk_bytes=min_chunk)


def device_of(backend: str) -> str:
    """The device a backend runs on: gloo on CPU, NCCL on CUDA."""
    return "cuda" if backend == "nccl" else "cpu"


def settings_meta(cfg: PlannerConfig) -> dict[str, object]:
    """What a benchmark records of the settings it ran with (hocc calibrate reads it back)."""
    return {"ring_ops": list(cfg.ring_ops), "host_impl": cfg.host_impl, "max_chunk_bytes": cfg.max_chunk_bytes,
            "min_chunk_bytes": cfg.min_chunk_bytes}
