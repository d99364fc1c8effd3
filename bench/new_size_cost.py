"""What a call of a size never seen before costs hocc's Python side at scale,
without ranks: the crossover table made once per (collective, element size),
the unit plan made once per (algo, K) (hocc.plan.shapes), then for each new
size the table lookup and the engine's plan cache (the unit's C++ form
scaled, its hash), on a synthetic cluster. For comparison: building that
size's plan outright (plan, C++ form, hash), and the planner pricing every
algorithm for it (what auto ran per size before the tables).

    .venv/bin/python bench/new_size_cost.py --hosts 512 --ranks-per-host 8
"""

from __future__ import annotations

import argparse
import statistics
import time

from hocc.engine.agreement import plan_hash
from hocc.engine.plan_cache import PlanCache
from hocc.executor.cpp_form import to_cpp
from hocc.plan.crossover import Crossover
from hocc.plan.planner import PlannerConfig, build_plan, make_plan
from hocc.plan.policy import planner_settings
from hocc.topology import parse_spec


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hosts", type=int, default=512)
    p.add_argument("--ranks-per-host", type=int, default=8)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    p.add_argument("--sizes", type=int, default=8, help="new sizes to time per collective")
    a = p.parse_args()
    topo = parse_spec(f"{a.hosts}x{a.ranks_per_host}")
    cfg = planner_settings(PlannerConfig(), a.device, topo)
    print(f"# {a.hosts} x {a.ranks_per_host} = {topo.world_size} ranks, {a.device} settings")
    print(f"# {'collective':<15} {'table (once)':>13} {'units (once)':>13} {'lookup + plan':>14} "
          f"{'plan built outright':>20} {'planner (old path)':>19}")
    for coll in ("all_reduce", "all_gather", "reduce_scatter"):
        t0 = time.perf_counter()
        table = Crossover(coll, 4, topo, cfg)
        made = time.perf_counter() - t0
        cache = PlanCache(topo)
        t0 = time.perf_counter()
        for b in range(12, 40):  # every bucket's unit, both routings, as a job's first sizes would make them
            pick = table.pick(1 << b)
            for count in ((1 << b) // 4, (1 << b) // 4 + 1):
                cache.get(coll, count, 4, pick.algo, pick.settings(cfg))
        units = time.perf_counter() - t0
        counts = [1000 + 7919 * i * i for i in range(a.sizes)]  # new sizes, 4 KB .. a few MB per rank
        news, builds, planner = [], [], []
        for count in counts:  # the engine's path, alone (the outright builds below churn memory)
            t0 = time.perf_counter()
            pick = table.pick(count * 4)
            cache.get(coll, count, 4, pick.algo, pick.settings(cfg))
            news.append(time.perf_counter() - t0)
        for count in counts:
            pick = table.pick(count * 4)
            t0 = time.perf_counter()
            plan = build_plan(coll, count, 4, topo, pick.algo, pick.settings(cfg), pick.why)
            to_cpp(plan)
            plan_hash(plan)
            builds.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            make_plan(coll, count, 4, topo, "auto", cfg)
            planner.append(time.perf_counter() - t0)
        print(f"  {coll:<15} {made * 1e3:>10.1f} ms {units * 1e3:>10.1f} ms {statistics.median(news) * 1e6:>11.1f} us "
              f"{statistics.median(builds) * 1e3:>17.2f} ms {statistics.median(planner) * 1e3:>16.2f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
