"""`hocc plan --draw`: the topology as a tree (core, switches, hosts, ranks)
and the rings of the plan auto picks, one picture. Switches are grey squares,
hosts blue boxes, ranks circles coloured by rail (local index); ring edges are
coloured by tier: host rings black, rail rings in their rail's colour, trunk
rings red. Large topologies show the first hosts of the first switches."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from hocc.plan.planner import PlannerConfig, build_plan, choose, predict_all
from hocc.plan.types import Plan
from hocc.topology import Topology


def first_chunk_plan(topo: Topology, op: str, count: int, elem: int, cfg: PlannerConfig) -> Plan:
    """auto's plan with one chunk (every chunk runs the same rings), whichever registered algorithm it is."""
    pick = choose(predict_all(op, count, elem, topo, cfg), cfg, op)
    return build_plan(op, count, elem, topo, pick, replace(cfg, chunks=1), "auto's pick, one chunk")


def draw_plan(topo: Topology, op: str, count: int, elem: int, cfg: PlannerConfig, path: str,
              max_switches: int = 4, max_hosts: int = 4) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import networkx as nx

    plan = first_chunk_plan(topo, op, count, elem, cfg)
    infos = topo.host_infos()
    switches = list(dict.fromkeys(h.switch for h in infos))[:max_switches]
    shown_hosts = [h for s in switches for h in [x for x in infos if x.switch == s][:max_hosts]]
    g = nx.DiGraph()
    pos: dict[tuple[str, object], tuple[float, float]] = {}
    x = 0.0
    rank_color: dict[int, int] = {}
    for h in shown_hosts:
        xs = []
        for i, r in enumerate(h.ranks):
            pos[("rank", r)] = (x, 0.0)
            rank_color[r] = i
            xs.append(x)
            x += 1.0
        pos[("host", h.name)] = (sum(xs) / len(xs), 1.2)
        x += 0.8
    for s in switches:
        hx = [pos[("host", h.name)][0] for h in shown_hosts if h.switch == s]
        pos[("switch", s)] = (sum(hx) / len(hx), 2.4)
    pos[("core", "core")] = (sum(p[0] for k, p in pos.items() if k[0] == "switch") / len(switches), 3.4)
    for h in shown_hosts:
        g.add_edge(("switch", h.switch), ("host", h.name))
        for r in h.ranks:
            g.add_edge(("host", h.name), ("rank", r))
    for s in switches:
        g.add_edge(("core", "core"), ("switch", s))
    width = max(8.0, min(40.0, 0.45 * len(rank_color) + 2))
    fig, ax = plt.subplots(figsize=(width, 6.5))
    cmap = plt.get_cmap("tab10")
    nx.draw_networkx_edges(g, pos, ax=ax, edge_color="#cccccc", arrows=False, width=1.0)
    nx.draw_networkx_nodes(g, pos, nodelist=[("core", "core")], node_shape="D", node_color="black",
                           node_size=250, ax=ax)
    nx.draw_networkx_nodes(g, pos, nodelist=[("switch", s) for s in switches], node_shape="s",
                           node_color="#888888", node_size=700, ax=ax)
    nx.draw_networkx_nodes(g, pos, nodelist=[("host", h.name) for h in shown_hosts], node_shape="s",
                           node_color="#9ecae1", node_size=900, ax=ax)
    ranks = list(rank_color)
    nx.draw_networkx_nodes(g, pos, nodelist=[("rank", r) for r in ranks], node_shape="o", node_size=320,
                           node_color=[cmap(rank_color[r] % 10) for r in ranks], ax=ax)
    nx.draw_networkx_labels(g, pos, labels={("rank", r): str(r) for r in ranks}, font_size=7, ax=ax)
    nx.draw_networkx_labels(g, pos, labels={**{("host", h.name): h.name for h in shown_hosts},
                                            **{("switch", s): s for s in switches}}, font_size=7, ax=ax)
    tier_style = {"host": ("black", 0.35), "nic": (None, -0.25), "trunk": ("red", -0.45)}
    seen: set[tuple[str, tuple[int, ...]]] = set()
    batches: dict[tuple[object, float], list[tuple[tuple[str, int], tuple[str, int]]]] = {}
    for step in plan.steps:
        for grp in step.groups:
            if len(grp.ranks) < 2 or (step.tier, grp.ranks) in seen:
                continue
            seen.add((step.tier, grp.ranks))
            ring = list(grp.ranks)
            edges = [(("rank", a), ("rank", b)) for a, b in zip(ring, ring[1:] + ring[:1], strict=True)
                     if a in rank_color and b in rank_color]
            if not edges:
                continue
            color, rad = tier_style.get(step.tier, ("purple", 0.3))
            ec: Any = color or cmap(rank_color[edges[0][0][1]] % 10)
            batches.setdefault((ec, rad), []).extend(edges)
    for (ec, rad), edges in batches.items():
        nx.draw_networkx_edges(nx.DiGraph(edges), pos, edgelist=edges, ax=ax, edge_color=[ec] * len(edges),
                               connectionstyle=f"arc3,rad={rad}", arrows=True, arrowsize=8, width=1.2,
                               node_size=320)
    hidden = len(infos) - len(shown_hosts)
    note = f"; showing {len(shown_hosts)} of {len(infos)} hosts" if hidden else ""
    ax.set_title(f"{topo.shape()} ({topo.world_size} ranks): {plan.algo} {op}, rings of one chunk "
                 f"(host rings black, rail rings in the rail's colour, trunk rings red){note}", fontsize=9)
    ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return f"{plan.algo} plan on {len(shown_hosts)} of {len(infos)} hosts"
