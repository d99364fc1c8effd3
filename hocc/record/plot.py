"""Per-rank timelines of the worst calls, as a PNG (`hocc trace DIR --plot F.png`).

One panel per call (the ones with the most arrival skew, or the stuck call):
a row per rank, a bar per step coloured by tier (pale: it never ended; drawn
up to the call's failure, or the dump), a tick where the rank began the
call; time from the first member's arrival."""

from __future__ import annotations

from typing import Any

from hocc.record.report import Group

_COLOURS = ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown"]


def plot(g: Group, analysis: dict[str, Any], path: str, calls: int = 3) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    seqs: list[int] = []
    if analysis["hang"] is not None:
        seqs.append(analysis["hang"]["seq"])
    if analysis["skew"]:
        seqs += [c["seq"] for c in sorted(analysis["skew"]["per_call"], key=lambda c: -c["skew_s"])]
    seqs = list(dict.fromkeys(seqs))[:calls]
    if not seqs:
        raise ValueError(f"group {g.name!r}: no call to draw")
    tiers: dict[str, str] = {}
    fig, axes = plt.subplots(len(seqs), 1, figsize=(11, 1.0 + 0.45 * g.size * len(seqs)), squeeze=False)
    for ax, seq in zip(axes[:, 0], seqs, strict=True):
        mine = {r: next((c for c in d["calls"] if c["seq"] == seq), None) for r, d in g.dumps.items()}
        starts = [c["start_ns"] for c in mine.values() if c and c["start_ns"]]
        t0 = min(starts) if starts else 0
        title = "?"
        for r in range(g.size):
            c = mine.get(r)
            if c is None or not c["start_ns"]:
                ax.text(0, r, "  never began" if r in g.dumps or c is None else "", va="center", color="red",
                        fontsize=8)
                continue
            title = f"call #{seq}: {c['collective']} {c['count']} {c['dtype']} ({c['algo']})"
            ax.plot([(c["start_ns"] - t0) / 1e6] * 2, [r - 0.4, r + 0.4], color="black", lw=1)
            # a step that did not end ran until the call failed, or until the dump if it still runs
            until = c["end_ns"] or g.dumps[r]["dumped_ns"]
            for st in c["steps"]:
                colour = tiers.setdefault(st["tier"], _COLOURS[len(tiers) % len(_COLOURS)])
                end = st["end_ns"] or until
                ax.barh(r, max((end - st["begin_ns"]) / 1e6, 0.01), left=(st["begin_ns"] - t0) / 1e6, height=0.6,
                        color=colour, alpha=0.8 if st["end_ns"] else 0.3, edgecolor="none")
        ax.set_yticks(range(g.size), [f"rank {r} ({g.hosts[r]})" for r in range(g.size)], fontsize=8)
        ax.invert_yaxis()
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("ms after the first rank began the call", fontsize=8)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in tiers.values()]
    fig.legend(handles, [f"tier {t}" for t in tiers], loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
