"""hocc trace DIR: merge the flight recorder's dumps of every rank (written
on a failed call, on SIGUSR1, or by hocc.dump_record()) and say what
happened: who never began the call the others wait in, who arrives late, and
which stage, host and link are slow (hocc/record/report.py; docs/recorder.md).

    hocc trace /tmp/hocc-record
    hocc trace DIR --json report.json --plot timelines.png"""

from __future__ import annotations

import argparse
import json
import os

from hocc.record import report


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("dir", help="a directory of dumps (HOCC_RECORD_DIR; default <tmp>/hocc-record)")
    p.add_argument("--group", help="only this group (by name, as in the dumps)")
    p.add_argument("--json", metavar="FILE", help="the whole analysis as JSON ('-': stdout)")
    p.add_argument("--plot", metavar="FILE.png", help="per-rank timelines of the worst calls (one file per group "
                                                      "when there are several: FILE.<group>.png)")
    p.add_argument("--top", type=int, default=5, help="rows of each ranking (default 5)")


def run(a: argparse.Namespace) -> int:
    if not os.path.isdir(a.dir):
        raise FileNotFoundError(f"{a.dir} is not a directory")
    groups = [g for g in report.load(a.dir) if a.group is None or g.name == a.group]
    if not groups:
        raise ValueError(f"no dumps of group {a.group!r} in {a.dir}")
    analyses = [report.analyze(g) for g in groups]
    if a.json == "-":
        print(json.dumps(analyses, indent=1, default=str))
    else:
        print(report.render(analyses, a.top))
        if a.json:
            with open(a.json, "w") as f:
                json.dump(analyses, f, indent=1, default=str)
    if a.plot:
        from hocc.record.plot import plot

        for g, an in zip(groups, analyses, strict=True):
            path = a.plot if len(groups) == 1 else a.plot.replace(".png", f".{g.name}.png")
            plot(g, an, path)
            print(f"# wrote {path}")
    return 0
