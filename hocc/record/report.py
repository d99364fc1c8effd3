"""Merge every rank's recorder dump and say what happened (`hocc trace DIR`).

For each group found in the dumps:
- hang or failure: the latest call any member began; which members never
  began it (no dump counts: a stopped or dead process writes none), and for
  each member that began it but did not end it, the step it was in (stage,
  tier, chunk, peers), which of its peers never began the call, and its error;
- arrival skew: per call that every member ended, each member's lateness
  against the earliest to begin it; members ranked by mean lateness;
- stages: per stage and tier, the seconds each member spent in its steps;
- links: each ring exchange is matched with its sender's (the k-th exchange
  from A to B in a step on A with the k-th from A on B), and the link's
  transfer time is B's end of the receive minus the later of the two posts,
  so that waiting for a late sender is not charged to the wire. Links between
  hosts are ranked by rate (bytes over transfer time), and each host by the
  links into and out of it: a slow NIC slows both.

The timeline merges wall clocks: across hosts it is as good as their clock
sync (NTP: about a millisecond; the emulated cluster: one clock).
"""

from __future__ import annotations

import json
import os
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from hocc.record.recorder import FORMAT, VERSION

# A rank, host or link is named as the culprit only when it stands out this
# much from the median of the others (lateness, or link rate), so that the
# noise of a healthy run names nobody.
STANDOUT = 2.0
MIN_LATE_S = 0.002  # mean lateness below this is noise, whatever the ratio


@dataclass
class Group:
    name: str
    device: str
    size: int
    global_ranks: list[int]
    hosts: list[str]
    dumps: dict[int, dict[str, Any]] = field(default_factory=dict)  # group rank -> dump

    def who(self, r: int) -> str:
        g = self.global_ranks[r] if r < len(self.global_ranks) else r
        host = self.hosts[r] if r < len(self.hosts) else "?"
        return f"rank {r}" + (f" (global {g})" if g != r else "") + f" on {host}"


def load(directory: str) -> list[Group]:
    """Every dump in `directory`, grouped by (group, device)."""
    groups: dict[tuple[Any, ...], Group] = {}
    names = sorted(n for n in os.listdir(directory) if n.endswith(".json"))
    for n in names:
        with open(os.path.join(directory, n)) as f:
            try:
                doc = json.load(f)
            except json.JSONDecodeError:
                continue
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            continue
        if doc.get("version") != VERSION:
            raise ValueError(f"{n}: recorder format version {doc.get('version')}; this hocc reads {VERSION}")
        # a group is its name and members: a stale dump of another job's group of that name stays apart
        key = (str(doc["group"]), str(doc["device"]), int(doc["size"]), tuple(doc["global_ranks"]))
        g = groups.setdefault(key, Group(key[0], key[1], key[2], list(key[3]), list(doc["hosts"])))
        g.dumps[int(doc["rank"])] = doc
    if not groups:
        raise FileNotFoundError(f"no hocc recorder dumps (hocc-record JSON) in {directory}")
    return list(groups.values())


def _by_seq(dump: dict[str, Any]) -> dict[int, dict[str, Any]]:
    return {int(c["seq"]): c for c in dump["calls"]}


# -- hangs and failures ------------------------------------------------------------------------------------------
def hang(g: Group) -> dict[str, Any] | None:
    """The call some member is stuck or failed in, and who never began it; None if every member ended its calls."""
    calls = {r: _by_seq(d) for r, d in g.dumps.items()}
    begun = {r: max((s for s, c in cs.items() if c["start_ns"]), default=-1) for r, cs in calls.items()}
    open_calls = [(s, r) for r, cs in calls.items() for s, c in cs.items() if c["state"] in ("running", "failed")]
    if not open_calls and len(g.dumps) == g.size:
        return None
    seq = max(s for s, _ in open_calls) if open_calls else max(begun.values())
    missing = [r for r in range(g.size) if r not in g.dumps]
    never = sorted(missing + [r for r, b in begun.items() if b < seq])
    waiting = []
    for r in sorted(calls):
        c = calls[r].get(seq)
        if c is None or not c["start_ns"] or c["state"] == "ok":
            continue
        open_steps = [st for st in c["steps"] if not st["end_ns"]]
        step = open_steps[0] if open_steps else None
        peers = [p for p in (step["ranks"] if step else []) if p != r]
        waiting.append({"rank": r, "state": c["state"], "error": c["error"],
                        "step": None if step is None else {k: step.get(k, "") for k in ("stage", "chunk", "op",
                                                                                         "tier", "impl", "transport",
                                                                                         "ranks")},
                        "waits_on_never_begun": [p for p in peers if p in never],
                        "steps_ended": sum(1 for st in c["steps"] if st["end_ns"])})
    ref = next((calls[r][seq] for r in calls if seq in calls[r]), None)
    what = (f"{ref['collective']} of {ref['count']} {ref['dtype']} ({ref['op']}, {ref['algo']})" if ref else "?")
    return {"seq": seq, "call": what, "never_began": never, "no_dump": missing, "waiting": waiting,
            "last_begun": begun, "last_ended": {r: max((s for s, c in cs.items() if c["state"] == "ok"), default=-1)
                                                 for r, cs in calls.items()}}


# -- slowness ----------------------------------------------------------------------------------------------------
def _complete_calls(g: Group) -> list[int]:
    """Calls every member recorded and ended well."""
    calls = [_by_seq(d) for d in g.dumps.values()]
    if len(calls) < g.size:
        return []
    common = set.intersection(*(set(s for s, c in cs.items() if c["state"] == "ok") for cs in calls))
    return sorted(common)


def skew(g: Group, seqs: list[int]) -> dict[str, Any]:
    calls = {r: _by_seq(d) for r, d in g.dumps.items()}
    late: dict[int, list[float]] = defaultdict(list)
    per_call = []
    for s in seqs:
        starts = {r: calls[r][s]["start_ns"] for r in calls}
        first = min(starts.values())
        for r, t in starts.items():
            late[r].append((t - first) / 1e9)
        lastr = max(starts, key=lambda r: starts[r])
        ends = {r: calls[r][s]["end_ns"] for r in calls}
        per_call.append({"seq": s, "collective": calls[lastr][s]["collective"], "skew_s": (starts[lastr] - first) / 1e9,
                         "latest": lastr, "duration_s": (max(ends.values()) - first) / 1e9})
    # the time a rank spends outside hocc before a call (since its previous call ended): a straggler's own work
    # makes it large; a rank that is late only because its previous call ended late has it as small as the others
    gaps: dict[int, list[float]] = defaultdict(list)
    for r, cs in calls.items():
        for s in seqs:
            prev = cs.get(s - 1)
            if prev is not None and prev["end_ns"] and prev["state"] == "ok":
                gaps[r].append((cs[s]["start_ns"] - prev["end_ns"]) / 1e9)
    ranks: list[dict[str, Any]] = []
    for r, v in late.items():
        ranks.append({"rank": r, "mean_late_s": statistics.fmean(v), "median_late_s": statistics.median(v),
                      "max_late_s": max(v), "last_in": sum(1 for c in per_call if c["latest"] == r),
                      "mean_gap_s": statistics.fmean(gaps[r]) if gaps[r] else None})
    ranks.sort(key=lambda x: -x["mean_late_s"])
    return {"calls": len(seqs), "ranks": ranks, "per_call": per_call}


def stages(g: Group, seqs: list[int]) -> list[dict[str, Any]]:
    """Seconds each member spent in each (collective, stage, tier) over the calls, summed over chunks."""
    wanted = set(seqs)
    tot: dict[tuple[str, int, str], dict[int, float]] = defaultdict(lambda: defaultdict(float))
    for r, d in g.dumps.items():
        for c in d["calls"]:
            if c["seq"] not in wanted:
                continue
            for st in c["steps"]:
                if st["end_ns"]:
                    tot[(c["collective"], st["stage"], st["tier"])][r] += (st["end_ns"] - st["begin_ns"]) / 1e9
    out = []
    for (collective, stage, tier), per in sorted(tot.items()):
        vals = list(per.values())
        out.append({"collective": collective, "stage": stage, "tier": tier, "seconds": dict(sorted(per.items())),
                    "max_s": max(vals),
                    "median_s": statistics.median(vals), "slowest": max(per, key=lambda r: per[r])})
    return out


def links(g: Group, seqs: list[int]) -> dict[str, Any]:
    """Per link between members (A -> B): bytes and transfer seconds of the ring exchanges on it (see the module's
    docstring), then per host pair and per host."""
    wanted = set(seqs)
    # (seq, stage, chunk, ranks, sender, receiver) -> [post ns of each exchange], in order, from each side
    sent: dict[tuple[Any, ...], list[int]] = defaultdict(list)
    got: dict[tuple[Any, ...], list[tuple[int, int, int]]] = defaultdict(list)
    tier_of: dict[tuple[int, int], str] = {}
    for r, d in g.dumps.items():
        for c in d["calls"]:
            if c["seq"] not in wanted:
                continue
            for st in c["steps"]:
                base = (c["seq"], st["stage"], st["chunk"], tuple(st["ranks"]))
                for to, frm, post, done, _end, _sent, received in st["exchanges"]:
                    sent[(*base, r, to)].append(post)
                    got[(*base, frm, r)].append((post, done, received))
                    tier_of[(frm, r)] = st["tier"]
    per: dict[tuple[int, int], list[float]] = defaultdict(lambda: [0.0, 0.0, 0])  # bytes, seconds, exchanges
    for key, recvs in got.items():
        posts = sent.get(key)
        if not posts:
            continue
        a, b = key[-2], key[-1]
        for (post_b, done_b, nbytes), post_a in zip(recvs, posts, strict=False):
            if not nbytes:
                continue
            acc = per[(a, b)]
            acc[0] += nbytes
            acc[1] += max(done_b - max(post_a, post_b), 0) / 1e9
            acc[2] += 1
    rank_links: list[dict[str, Any]] = [
        {"from": a, "to": b, "tier": tier_of.get((a, b), "?"), "bytes": int(v[0]), "seconds": v[1],
         "exchanges": int(v[2]), "bytes_per_s": v[0] / v[1] if v[1] > 0 else float("inf")}
        for (a, b), v in per.items()]
    host_pairs: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0.0])
    for lk in rank_links:
        ha, hb = g.hosts[lk["from"]], g.hosts[lk["to"]]
        if ha != hb:
            host_pairs[(ha, hb)][0] += lk["bytes"]
            host_pairs[(ha, hb)][1] += lk["seconds"]
    pairs: list[dict[str, Any]] = sorted(({"from": a, "to": b, "bytes": int(v[0]), "seconds": v[1],
                     "bytes_per_s": v[0] / v[1] if v[1] > 0 else float("inf")} for (a, b), v in host_pairs.items()),
                   key=lambda x: x["bytes_per_s"])
    hosts: list[dict[str, Any]] = []
    for h in sorted(set(g.hosts)):
        touching = [p for p in pairs if h in (p["from"], p["to"])]
        others = [p for p in pairs if h not in (p["from"], p["to"])]
        if not touching:
            continue
        rate = sum(p["bytes"] for p in touching) / max(sum(p["seconds"] for p in touching), 1e-12)
        other = (sum(p["bytes"] for p in others) / max(sum(p["seconds"] for p in others), 1e-12)) if others else None
        hosts.append({"host": h, "bytes_per_s": rate, "others_bytes_per_s": other,
                      "best_bytes_per_s": max(p["bytes_per_s"] for p in touching),
                      "in_bytes_per_s": _rate([p for p in touching if p["to"] == h]),
                      "out_bytes_per_s": _rate([p for p in touching if p["from"] == h])})
    # a slow NIC slows every link of its host, in and out; a healthy host has at least one fast link (its slow
    # ones are its neighbours' fault), so hosts rank by the fastest link through them
    hosts.sort(key=lambda x: x["best_bytes_per_s"])
    rank_links.sort(key=lambda x: x["bytes_per_s"])
    return {"rank_links": rank_links, "host_pairs": pairs, "hosts": hosts}


def _rate(pairs: list[dict[str, Any]]) -> float | None:
    s = sum(p["seconds"] for p in pairs)
    return sum(p["bytes"] for p in pairs) / s if s > 0 else None


# -- the verdict -------------------------------------------------------------------------------------------------
def analyze(g: Group) -> dict[str, Any]:
    seqs = _complete_calls(g)
    out: dict[str, Any] = {"group": g.name, "device": g.device, "size": g.size, "dumps": sorted(g.dumps),
                           "hosts": g.hosts, "global_ranks": g.global_ranks,
                           "reasons": sorted({d.get("reason", "") for d in g.dumps.values()}),
                           "hang": hang(g), "complete_calls": len(seqs)}
    out["skew"] = skew(g, seqs) if seqs else None
    out["stages"] = stages(g, seqs) if seqs else []
    out["links"] = links(g, seqs) if seqs else None
    out["findings"] = findings(g, out)
    return out


def findings(g: Group, a: dict[str, Any]) -> list[dict[str, Any]]:
    """The named culprits, most certain first: {'kind', 'rank'|'host'|..., 'text'}."""
    found: list[dict[str, Any]] = []
    h = a["hang"]
    if h is not None and not h["waiting"] and h["no_dump"]:  # nobody is stuck: some dumps are just missing
        found.append({"kind": "no_dump", "ranks": h["no_dump"],
                      "text": f"no dump from ranks {h['no_dump']}; the others ended every call they began (the "
                              f"latest #{h['seq']}): dump those ranks too (SIGUSR1, hocc.dump_record())"})
    elif h is not None and h["never_began"]:
        waiting = [w["rank"] for w in h["waiting"]]
        for r in h["never_began"]:
            how = "it wrote no dump (stopped, dead, or hung outside hocc)" if r in h["no_dump"] else (
                f"its last call begun was #{h['last_begun'].get(r, -1)}")
            direct = [w["rank"] for w in h["waiting"] if r in w["waits_on_never_begun"]]
            found.append({"kind": "never_began", "rank": r, "seq": h["seq"],
                          "text": f"{g.who(r)} never began call #{h['seq']} ({h['call']}) that ranks {waiting} "
                                  f"were waiting in: {how}" + (f"; ranks {direct} waited on it directly" if direct
                                                               else "")})
    sk = a["skew"]
    if sk and len(sk["ranks"]) > 1:
        top, rest = sk["ranks"][0], [x["mean_late_s"] for x in sk["ranks"][1:]]
        base = statistics.median(rest)
        others_gap = [x["mean_gap_s"] for x in sk["ranks"][1:] if x["mean_gap_s"] is not None]
        gap, base_gap = top["mean_gap_s"], statistics.median(others_gap) if others_gap else None
        own = gap is not None and base_gap is not None and gap - base_gap >= (top["mean_late_s"] - base) / 2
        if gap is not None and own and top["mean_late_s"] >= MIN_LATE_S and top["mean_late_s"] >= STANDOUT * max(
                base, 1e-4):
            found.append({"kind": "late_rank", "rank": top["rank"],
                          "text": f"{g.who(top['rank'])} arrives late: {top['mean_late_s'] * 1e3:.1f} ms after the "
                                  f"first member on average (the others' median {base * 1e3:.1f} ms), last to begin "
                                  f"{top['last_in']} of {sk['calls']} calls. Its own work is slow, not its "
                                  f"collectives: it spends {gap * 1e3:.1f} ms outside hocc before a call, the others "
                                  f"{(base_gap or 0.0) * 1e3:.1f} ms"})
    lk = a["links"]
    if lk and len(lk["hosts"]) >= 3:
        slow, rest = lk["hosts"][0], [x["best_bytes_per_s"] for x in lk["hosts"][1:]]
        base = statistics.median(rest)
        if slow["best_bytes_per_s"] * STANDOUT <= base:
            stage = _slowest_stage_of_links(a)
            found.append({"kind": "slow_host_link", "host": slow["host"], "stage": stage,
                          "text": f"{_host(slow['host'])}'s link is slow: every link through it is, at "
                                  f"{_mbit(slow['best_bytes_per_s'])} at best (in {_mbit(slow['in_bytes_per_s'])}, "
                                  f"out {_mbit(slow['out_bytes_per_s'])}), while each other host has a link of "
                                  f"{_mbit(base)} (median)"
                                  + (f"; it holds back {stage['collective']}'s stage {stage['stage']} (tier "
                                     f"{stage['tier']}, between hosts: the rail stage)" if stage else "")})
    return found


def _slowest_stage_of_links(a: dict[str, Any]) -> dict[str, Any] | None:
    inter = [s for s in a["stages"] if s["tier"] not in ("host", "shm")]
    return max(inter, key=lambda s: s["median_s"]) if inter else None


def _host(name: str) -> str:
    return name if name.startswith("host") else f"host {name}"


def _mbit(bps: float | None) -> str:
    return "?" if bps is None else f"{bps * 8 / 1e6:.0f} Mbit/s"


# -- text --------------------------------------------------------------------------------------------------------
def render(analyses: list[dict[str, Any]], top: int = 5) -> str:
    lines: list[str] = []
    for a in analyses:
        why = [r if len(r) <= 160 else r[:157] + "..." for r in a["reasons"]]
        lines.append(f"# group {a['group']!r} ({a['device']}), {a['size']} ranks; dumps from {len(a['dumps'])}: "
                     f"{a['dumps']}; why dumped ({len(why)} reasons): " + "; ".join(why[:3])
                     + ("; ..." if len(why) > 3 else ""))
        lines.append("## findings")
        lines += [f"- {f['text']}" for f in a["findings"]] or ["- nothing stands out"]
        h = a["hang"]
        if h is not None:
            lines.append(f"## call #{h['seq']}: {h['call']}")
            for r in sorted(set(h["last_begun"]) | set(h["no_dump"])):
                if r in h["no_dump"]:
                    lines.append(f"- rank {r}: no dump")
                    continue
                w = next((x for x in h["waiting"] if x["rank"] == r), None)
                state = (f"in it ({w['state']}), {w['steps_ended']} steps ended" if w else
                         "ended it" if h["last_ended"][r] >= h["seq"] else "not begun")
                lines.append(f"- rank {r}: last begun #{h['last_begun'][r]}, last ended #{h['last_ended'][r]}; "
                             f"{state}")
                if w and w["step"]:
                    st = w["step"]
                    over = f" ({st['transport']})" if st.get("transport") else ""
                    lines.append(f"    at stage {st['stage']} ({st['tier']}), chunk {st['chunk']}, "
                                 f"{st['impl']}{over} {st['op']} over ranks {st['ranks']}")
                if w and w["error"]:
                    lines.append(f"    error: {w['error'][:300]}")
        sk = a["skew"]
        if sk:
            lines.append(f"## arrival skew over {sk['calls']} calls every rank ended (lateness after the first)")
            lines.append("| rank | host | mean ms | median ms | max ms | last to begin | ms outside hocc before |")
            lines.append("| --- | --- | --- | --- | --- | --- | --- |")
            for x in sk["ranks"][:max(top, 8)]:
                gap = "?" if x["mean_gap_s"] is None else f"{x['mean_gap_s'] * 1e3:.2f}"
                lines.append(f"| {x['rank']} | {a['hosts'][x['rank']]} | {x['mean_late_s'] * 1e3:.2f} | "
                             f"{x['median_late_s'] * 1e3:.2f} | {x['max_late_s'] * 1e3:.2f} | {x['last_in']} | "
                             f"{gap} |")
        if a["stages"]:
            lines.append("## time per stage (seconds summed over those calls; median and slowest rank)")
            lines.append("| collective | stage | tier | median s | max s | slowest rank |")
            lines.append("| --- | --- | --- | --- | --- | --- |")
            for s in a["stages"]:
                lines.append(f"| {s['collective']} | {s['stage']} | {s['tier']} | {s['median_s']:.3f} | "
                             f"{s['max_s']:.3f} | "
                             f"{s['slowest']} |")
        lk = a["links"]
        if lk and lk["host_pairs"]:
            lines.append("## links between hosts, slowest first (ring exchanges; transfer time after both posted)")
            lines.append("| from | to | MiB | s | Mbit/s |")
            lines.append("| --- | --- | --- | --- | --- |")
            for p in lk["host_pairs"][:max(top, 8)]:
                lines.append(f"| {p['from']} | {p['to']} | {p['bytes'] / 2**20:.1f} | {p['seconds']:.3f} | "
                             f"{p['bytes_per_s'] * 8 / 1e6:.0f} |")
            lines.append("| host | its fastest link | in | out | all through it | links not through it |")
            lines.append("| --- | --- | --- | --- | --- | --- |")
            for x in lk["hosts"]:
                lines.append(f"| {x['host']} | {_mbit(x['best_bytes_per_s'])} | {_mbit(x['in_bytes_per_s'])} | "
                             f"{_mbit(x['out_bytes_per_s'])} | {_mbit(x['bytes_per_s'])} | "
                             f"{_mbit(x['others_bytes_per_s'])} |")
        elif a["complete_calls"]:
            lines.append("## links: no ring exchange between hosts recorded (only native steps, whose inside "
                         "hocc does not see; HOCC_RING_OPS runs more stages as rings)")
        if sk:
            worst = sorted(sk["per_call"], key=lambda c: -c["skew_s"])[:top]
            lines.append("## calls with the most skew")
            for c in worst:
                lines.append(f"- #{c['seq']} {c['collective']}: skew {c['skew_s'] * 1e3:.1f} ms (last: rank "
                             f"{c['latest']}), {c['duration_s'] * 1e3:.1f} ms from first arrival to last end")
        lines.append("")
    return "\n".join(lines)
