"""Plans are data: which group does what to which slice of the work buffer, in
which pipeline stage and chunk. The executor (hocc._C, csrc/executor/)
carries them out, on every device, and decides nothing.

Semantics of a step, for each of its groups (members listed in segment order,
as ranks of the process group the plan was made for; region offsets in
elements of each member's own work buffer, identical on all members):

  reduce_scatter  member i ends with segment i, [offset + i*seg, +seg), reduced
                  over the members; the rest of the region becomes undefined.
  all_gather      every member ends with every member's segment i in place.
  all_reduce      the region [offset, offset+seg) reduced over the members.
  broadcast       the region [offset, offset+seg) of the first member, on every
                  member (a step's op only: a host's leader hands its host the
                  result, hocc.plan.leaders).

A rank may belong to several groups of a step (HO-Ring on unequal hosts puts
a rank on several rails); their regions are disjoint on that rank. Executors
run a rank's groups of one step in the order listed, which is the same on
every rank (so two ranks that share two groups meet them in one order: no
deadlock), and the next stage of that chunk waits for all of them. 'shm'
groups stay one per rank per step (one host group).

impl 'native' runs the backend's collective on a sub-group (members must be in
rank order, as the backend assigns segments that way); 'ring' runs a ring of
point-to-point sends in the listed order; 'shm' (members on one host) goes
through a shared-memory segment.

Step (stage s, chunk k) may start once step (s-1, k) has ended; nothing else
orders steps, so steps that may overlap touch disjoint regions.

Buffers. A step reads `src` and writes `dst`, each one of:
  work    the work buffer, at the group's offsets (the semantics above)
  input   the caller's input: all_reduce and reduce_scatter read it at the
          group's offsets (the layout is the identity there, so work and input
          offsets agree); all_gather reads it whole as the member's segment
  output  the caller's output: reduce_scatter writes only the member's own
          segment, into the whole output (torch.distributed's form)
Where the work buffer lives (`work_at`): 'scratch' (private; unpacked into the
caller's output after every step ended (on CPU an unpadded all_reduce that packs
nothing works in the output instead, each chunk saved aside before its first
write and put back on failure: the executor's Journal), so a failed call leaves the caller's
tensors as they were), 'output' (the caller's output itself, where the layout
is the identity and the output is not the input: nothing to unpack), or
'none' (no step uses it). `pack`: the caller's input is first copied into the
work buffer by the layout. hocc.plan.buffers decides these; the executor
follows them.

The layout says how the caller's buffer maps onto the work buffer: the work
buffer is [chunks][blocks][piece]; work[k][i] holds elements
[k*piece, (k+1)*piece) of caller block order[i] (zero beyond block_elems).
For all_reduce there is one block (the whole tensor); for reduce_scatter and
all_gather there is one block per rank, and maybe pad slots: an order entry
PAD_BLOCK (-1) is a slot of no caller block, zeros on pack (so it adds
nothing where it is reduced) and skipped on unpack (HO-Ring pads the rails of
unequal hosts, hocc.plan.ho_ring.rails).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Collective = Literal["all_reduce", "all_gather", "reduce_scatter"]
# the collectives (a plan's, and each step's op), in the order of the C++ side's Op (csrc/core/plan.h), which
# hocc._C.COLLECTIVES exports; tests/test_stub.py checks the two agree
COLLECTIVES: tuple[str, ...] = ("all_reduce", "all_gather", "reduce_scatter")
IMPLS: tuple[str, ...] = ("native", "ring", "shm")
BUFFERS: tuple[str, ...] = ("work", "input", "output")
WORK_AT: tuple[str, ...] = ("scratch", "output", "none")
PAD_BLOCK = -1  # a layout slot of no caller block (see "The layout" above)


@dataclass(frozen=True)
class GroupSlice:
    ranks: tuple[int, ...]
    offset: int
    seg: int


@dataclass(frozen=True)
class Step:
    stage: int
    chunk: int
    collective: str  # the step's collective; the reduction is the call's, not the plan's
    impl: str
    tier: str
    groups: tuple[GroupSlice, ...]
    src: str = "work"
    dst: str = "work"

    def region(self, g: GroupSlice) -> tuple[int, int]:
        """[start, end) of the work buffer group g's members touch in this step
        (the semantics above): one segment for all_reduce and broadcast, one per member otherwise."""
        whole = self.collective in ("all_reduce", "broadcast")
        return g.offset, g.offset + (g.seg if whole else len(g.ranks) * g.seg)

    def groups_of(self, rank: int) -> tuple[GroupSlice, ...]:
        """Every group `rank` belongs to in this step, in the order to run them."""
        return tuple(g for g in self.groups if rank in g.ranks)


@dataclass(frozen=True)
class Layout:
    blocks: int
    block_elems: int
    chunks: int
    piece: int
    order: tuple[int, ...]

    @property
    def size(self) -> int:
        """Elements in the work buffer."""
        return self.chunks * self.blocks * self.piece

    @staticmethod
    def identity(blocks: int, block_elems: int) -> Layout:
        return Layout(blocks, block_elems, 1, block_elems, tuple(range(blocks)))


def chunks_for(count: int, chunks: int) -> int:
    """The K a plan of `count` elements per block really gets: no more chunks than elements, at least one."""
    return max(1, min(chunks, count))


@dataclass(frozen=True)
class Plan:
    """Immutable once built (steps are a tuple); derive a changed copy with
    dataclasses.replace."""

    collective: str
    algo: str
    world: int
    count: int
    layout: Layout
    steps: tuple[Step, ...]
    stages: int
    reason: str = ""
    predicted_s: float | None = None
    meta: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    work_at: str = "scratch"
    pack: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "steps", tuple(self.steps))

    @property
    def chunks(self) -> int:
        return self.layout.chunks

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self, indent: int | None = 1) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @staticmethod
    def from_dict(d: dict[str, Any]) -> Plan:
        lay = d["layout"]
        layout = Layout(lay["blocks"], lay["block_elems"], lay["chunks"], lay["piece"], tuple(lay["order"]))
        steps = [Step(s["stage"], s["chunk"], s.get("collective", s.get("op", "")), s["impl"], s["tier"],
                      tuple(GroupSlice(tuple(g["ranks"]), g["offset"], g["seg"]) for g in s["groups"]),
                      s.get("src", "work"), s.get("dst", "work"))
                 for s in d["steps"]]
        return Plan(d["collective"], d["algo"], d["world"], d["count"], layout, tuple(steps), d["stages"],
                    d.get("reason", ""), d.get("predicted_s"), d.get("meta", {}), d.get("work_at", "scratch"),
                    d.get("pack", True))

    @staticmethod
    def from_json(text: str) -> Plan:
        return Plan.from_dict(json.loads(text))

    def summary(self) -> str:
        pred = f", predicted {self.predicted_s * 1e3:.3f} ms" if self.predicted_s is not None else ""
        return (f"{self.collective} count={self.count} world={self.world}: {self.algo} "
                f"({self.stages} stages x {self.chunks} chunks{pred}){': ' + self.reason if self.reason else ''}")

    def describe(self) -> str:
        """Human-readable listing, one line per step."""
        lines = [self.summary(), f"layout: {self.layout.blocks} blocks x {self.layout.chunks} chunks "
                 f"x {self.layout.piece} elems, order {list(self.layout.order)}; work buffer: {self.work_at}"
                 f"{', packed' if self.pack else ''}"]
        for s in self.steps:
            groups = " ".join(f"{list(g.ranks)}@{g.offset}+{g.seg}" for g in s.groups)
            bufs = f" {s.src}->{s.dst}" if (s.src, s.dst) != ("work", "work") else ""
            lines.append(f"  stage {s.stage} chunk {s.chunk}: {s.collective:<14} {s.impl:<6} {s.tier:<5} "
                         f"{groups}{bufs}")
        return "\n".join(lines)

