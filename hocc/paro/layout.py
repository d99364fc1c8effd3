"""Where each rank's shards live and the process groups that move them.

The intra-group (I) is a host by default: hocc's topology (HOCC_TOPOLOGY or
the ranks' hostnames, `hocc.parse_spec`), or explicit rank lists, or one
dimension of a 2-D DeviceMesh. The inter-groups (rails) are the ranks at the
same position in every intra-group. Every rank builds every group in the same
order (torch.distributed requires it).

A unit's flat vector (its parameters, concatenated and padded to W blocks of
B elements) is laid out rail-major, so that every shard is one contiguous
range and no collective needs its blocks permuted:

    [ I_0 | I_1 | ... | I_{G-1} ]       I_l: the I shard of intra-group position l
    I_l = [ B_0 | B_1 | ... | B_{H-1} ]  B_j: the G shard of rail l's j-th member

A host all-gather of the members' I shards (in position order) is the whole
vector; a rail all-gather of the members' G blocks (in rail order) is I_l; a
world-scope collective is the two of them (hocc/paro/strategy.py)."""

from __future__ import annotations

import socket
from collections.abc import Sequence
from dataclasses import dataclass

import torch.distributed as dist

from hocc.config import get_config
from hocc.topology import from_hostnames, parse_spec


@dataclass
class Groups:
    """The rank's groups and its place in them. hosts[h] / rails[l] are world
    ranks sorted (a group's rank order, as torch.distributed assigns it)."""

    world: dist.ProcessGroup
    host: dist.ProcessGroup
    rail: dist.ProcessGroup
    hosts: list[tuple[int, ...]]
    rails: list[tuple[int, ...]]
    rank: int
    size: int

    @property
    def group_size(self) -> int:
        return len(self.hosts[0])

    @property
    def n_groups(self) -> int:
        return len(self.hosts)

    @property
    def position(self) -> int:
        """l: this rank's index inside its intra-group (its rail)."""
        return next(h.index(self.rank) for h in self.hosts if self.rank in h)

    @property
    def rail_index(self) -> int:
        """j: this rank's index inside its rail (its G block inside I_l)."""
        return self.rails[self.position].index(self.rank)


@dataclass(frozen=True)
class ShardLayout:
    """One unit's flat vector of `numel` elements on `groups`' ranks: padded
    to W blocks of `block` elements, rail-major (module docstring). `range(s)`
    is this rank's shard at scope s, as [start, stop) of the flat vector."""

    numel: int
    block: int
    world: int
    n_groups: int
    position: int
    rail_index: int

    @classmethod
    def of(cls, numel: int, g: Groups) -> ShardLayout:
        block = max(1, -(-numel // g.size))
        return cls(numel, block, g.size, g.n_groups, g.position, g.rail_index)

    @property
    def padded(self) -> int:
        return self.block * self.world

    def size(self, scope: str) -> int:
        return {"N": self.padded, "I": self.block * self.n_groups, "G": self.block}[scope]

    def range(self, scope: str) -> tuple[int, int]:
        i0 = self.position * self.n_groups * self.block
        if scope == "N":
            return 0, self.padded
        if scope == "I":
            return i0, i0 + self.n_groups * self.block
        g0 = i0 + self.rail_index * self.block
        return g0, g0 + self.block


def _hosts_from_topology(world: int) -> list[tuple[int, ...]]:
    spec = get_config().topology  # hocc's setting (HOCC_TOPOLOGY, or configure(topology=...))
    if spec:
        topo = parse_spec(spec)
        if topo.world_size != world:
            raise ValueError(f"HOCC_TOPOLOGY={spec!r} describes {topo.world_size} ranks but the world has {world}")
    else:
        names: list[object] = [None] * world
        dist.all_gather_object(names, socket.gethostname())
        topo = from_hostnames([str(n) for n in names])
    return topo.host_groups()


def intra_groups_of(mesh: object, dim: str | int) -> list[tuple[int, ...]]:
    """The rank lists along `dim` of a 2-D DeviceMesh (its intra-groups)."""
    ranks = mesh.mesh  # type: ignore[attr-defined]
    if ranks.dim() != 2:
        raise ValueError(f"a PaRO mesh must be 2-D (inter x intra); this one has shape {tuple(ranks.shape)}")
    names = getattr(mesh, "mesh_dim_names", None) or ()
    d = names.index(dim) if isinstance(dim, str) else int(dim)
    if isinstance(dim, str) and dim not in names:
        raise ValueError(f"mesh has no dimension {dim!r}; its dimensions are {names}")
    lines = ranks.transpose(0, 1) if d == 0 else ranks
    return [tuple(int(r) for r in row) for row in lines.tolist()]


_CACHE: dict[tuple[object, ...], Groups] = {}


def build_groups(intra: Sequence[Sequence[int]] | None = None, backend: str | None = None) -> Groups:
    """Host and rail groups for this world. `intra`: the intra-groups as rank
    lists (None: hosts from hocc's topology). The same intra-groups give the
    same Groups again (every unit of a model shares them), until the default
    group changes."""
    if not dist.is_initialized():
        raise RuntimeError("hocc.paro needs torch.distributed: call dist.init_process_group first")
    world, rank = dist.get_world_size(), dist.get_rank()
    hosts = [tuple(sorted(int(r) for r in h)) for h in (intra if intra is not None else _hosts_from_topology(world))]
    hosts.sort()
    key = (dist.group.WORLD, tuple(hosts), backend)
    if key in _CACHE:
        return _CACHE[key]
    flat = sorted(r for h in hosts for r in h)
    if flat != list(range(world)):
        raise ValueError(f"the intra-groups {hosts} must cover ranks 0..{world - 1} exactly once")
    sizes = {len(h) for h in hosts}
    if len(sizes) != 1:
        raise ValueError(f"PaRO's I scope needs intra-groups of equal size; got sizes {[len(h) for h in hosts]} "
                         f"({hosts}). Give equal groups (or use only N and G scopes with one group of all ranks)")
    width = sizes.pop()
    rails = [tuple(sorted(h[pos] for h in hosts)) for pos in range(width)]
    host_pg = rail_pg = None
    for h in hosts:  # every rank creates every group, in the same order
        pg = dist.new_group(list(h), backend=backend)
        if rank in h:
            host_pg = pg
    for r in rails:
        pg = dist.new_group(list(r), backend=backend)
        if rank in r:
            rail_pg = pg
    assert host_pg is not None and rail_pg is not None
    groups = Groups(dist.group.WORLD, host_pg, rail_pg, hosts, rails, rank, world)  # type: ignore[arg-type]
    _CACHE[key] = groups
    return groups
