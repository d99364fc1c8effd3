"""Ring steps over point-to-point sends, for members in any order.

Member i of an n-member ring sends to i+1 and receives from i-1.
reduce-scatter: at step t, send segment (i-t-1), receive segment (i-t-2) and
  reduce it into place; after n-1 steps member i holds segment i reduced.
all-gather: at step t, send segment (i-t), receive segment (i-t-1) in place.
Each member sends (n-1) segments per phase. Segments may differ in length
(all-reduce splits a region that need not divide by n).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from hocc.engine.reduce import reduce_into


def _exchange(pg: dist.ProcessGroup, send: torch.Tensor, recv: torch.Tensor, nxt: int, prv: int, tag: int) -> None:
    works = []
    if send.numel():
        works.append(pg.send([send], nxt, tag))
    if recv.numel():
        works.append(pg.recv([recv], prv, tag))
    for w in works:
        w.wait()


def ring_reduce_scatter(pg: dist.ProcessGroup, segs: list[torch.Tensor], me: int, op: str, tag: int) -> None:
    n = len(segs)
    nxt, prv = (me + 1) % n, (me - 1) % n
    scratch = torch.empty(max(s.numel() for s in segs), dtype=segs[0].dtype, device=segs[0].device)
    for t in range(n - 1):
        out, into = segs[(me - t - 1) % n], segs[(me - t - 2) % n]
        tmp = scratch[: into.numel()]
        _exchange(pg, out, tmp, nxt, prv, tag)
        reduce_into(into, tmp, op)


def ring_all_gather(pg: dist.ProcessGroup, segs: list[torch.Tensor], me: int, tag: int) -> None:
    n = len(segs)
    nxt, prv = (me + 1) % n, (me - 1) % n
    for t in range(n - 1):
        _exchange(pg, segs[(me - t) % n], segs[(me - t - 1) % n], nxt, prv, tag)


def split_even(region: torch.Tensor, n: int) -> list[torch.Tensor]:
    """n contiguous parts whose lengths differ by at most one."""
    q, r = divmod(region.numel(), n)
    out, start = [], 0
    for i in range(n):
        size = q + (1 if i < r else 0)
        out.append(region[start:start + size])
        start += size
    return out


def ring_all_reduce(pg: dist.ProcessGroup, region: torch.Tensor, me: int, n: int, op: str, tag: int) -> None:
    segs = split_even(region, n)
    ring_reduce_scatter(pg, segs, me, op, tag)
    ring_all_gather(pg, segs, me, tag)
