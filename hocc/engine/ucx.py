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
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from hocc.executor import load, ucx_unavailable

log = logging.getLogger("hocc")
_NONE = b"none:"  # an entry's prefix when its member has no UCX (the reason follows)
_said: set[str] = set()


def attach_ucx(store: dist.Store, key: str, me: int, n: int, timeout: timedelta, wanted: str,
               spin_us: int = 50) -> Any | None:
    """A connected UcxComm for member `me` of `n` (collective over the n
    members), or None where the group falls back to gloo ('auto' only)."""
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
    comm.connect(entries[(me - 1) % n], entries[(me + 1) % n])
    return comm
