"""Steps between hosts over UCX (hocc._C.UcxComm, csrc/transport/ucx.h): this
module connects one group's comm through the group's c10d store, as gloo's
own rendezvous does, so whatever launched gloo (torchrun, env://) launches it.

Each member publishes its ucp worker's address, or why it has none, under
`key`; each then reads its ring neighbours'. Every member reads every
member's entry, so all decide alike: under 'auto', one member without UCX
makes the whole group use gloo for that communicator (said once, in the log);
under 'ucx' that raises.
"""

from __future__ import annotations

import logging
import os
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from hocc.config import Config
from hocc.executor import load, ucx_unavailable
from hocc.topology import Topology
from hocc.topology.links import LinkModel

log = logging.getLogger("hocc")
_NONE = b"none:"  # an entry's prefix when its member has no UCX (the reason follows)
_said: set[str] = set()


def tcp_buffer_bytes(cfg: Config, topo: Topology) -> int:
    """The socket buffer for UCX's TCP connections (the setting ucx_tcp_buffer), 0 for UCX's own.

    A connection's buffer bounds its bytes in flight. Left to the kernel's autotuning it grows to
    megabytes, and a host NIC that queues in one FIFO (the emulated cluster's tc tbf, a switch port) then
    holds each rail's megabytes, with the acknowledgements of the other direction's flows waiting behind
    them: on the emulated 2x4 at 1 Gbit/s, 64 MiB ho_ring all_reduce 776-802 ms (67-69% of the NIC bound)
    autotuned, 620-630 ms (86-87%) at 32-64 KiB each way. 0.5 ms of the NIC's rate keeps a flow above its
    bandwidth-delay product on a host's own link and bounds the queue; where no rate is stated the kernel's
    autotuning stays (a fixed size would starve a fast NIC the model does not know)."""
    if cfg.ucx_tcp_buffer:
        return cfg.ucx_tcp_buffer
    stated = bool(cfg.topology) and ("nic=" in str(cfg.topology) or topo.links.nic != LinkModel().nic)
    return max(64 << 10, int(topo.links.nic.bandwidth * 0.5e-3)) if stated else 0


def _set_tcp_buffer(nbytes: int) -> None:
    """UCX reads its TCP settings from the environment when a worker opens its interfaces; a user's own
    UCX_TCP_SNDBUF / UCX_TCP_RCVBUF win."""
    if nbytes:
        for var in ("UCX_TCP_SNDBUF", "UCX_TCP_RCVBUF"):
            os.environ.setdefault(var, f"{nbytes}b")


def attach_ucx(store: dist.Store, key: str, me: int, n: int, timeout: timedelta, wanted: str,
               spin_us: int = 50, tcp_buffer: int = 0) -> Any | None:
    """A connected UcxComm for member `me` of `n` (collective over the n
    members), or None where the group falls back to gloo ('auto' only)."""
    _set_tcp_buffer(tcp_buffer)
    why = ucx_unavailable()
    comm = None
    if not why:
        try:
            comm = load().UcxComm(me, n, timeout.total_seconds(), float(spin_us))
        except Exception as e:  # noqa: BLE001 - a worker that cannot start: the group decides below
            why = str(e)
    entry: bytes = comm.address if comm is not None else _NONE + why.encode()
    store.set(f"{key}/{me}", entry)  # type: ignore[arg-type]  # c10d takes bytes too; its stub says str
    keys = [f"{key}/{m}" for m in range(n)]
    store.wait(keys, timeout)  # the group's timeout, not the store's (a member in another call never comes)
    entries = {m: store.get(k) for m, k in enumerate(keys)}
    missing = {m: e[len(_NONE):].decode() for m, e in entries.items() if e.startswith(_NONE)}
    if missing:
        m, reason = next(iter(missing.items()))
        said = f"hocc: UCX is not available on member {m} of this group ({reason}): gloo carries its steps"
        if wanted == "ucx":
            raise RuntimeError(said.replace(": gloo carries its steps", "") + " and HOCC_NET_TRANSPORT=ucx")
        if reason not in _said:
            _said.add(reason)
            log.warning(said)
        return None
    assert comm is not None
    comm.connect([entries[m] for m in range(n)])
    return comm
