"""The `hocc` command: `hocc plan` (predictions, crossovers, pictures),
`hocc calibrate` (fit the cost model to hocc-bench results or nccl-tests
logs), `hocc topo` (what this machine's topology looks like) and `hocc paro`
(PaRO-DP: which sharding strategy to train with), `hocc trace` (read the
flight recorder's dumps) need no ranks, torch.distributed or GPU; `hocc tune`
(measure auto's choices into a tuning file) runs under torchrun."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from hocc.tools import calibrate_cli, paro_cli, plan_cli, topo_cli, trace_cli, tune_cli


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="hocc", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    commands = (("plan", plan_cli, "predict each algorithm's time; auto's picks; --draw"),
                ("calibrate", calibrate_cli, "fit the cost model to hocc-bench JSON or nccl-tests logs"),
                ("topo", topo_cli, "detect this machine's GPUs, NVLink and NICs; print a spec"),
                ("paro", paro_cli, "PaRO-DP: advise a sharding strategy"),
                ("tune", tune_cli, "under torchrun: measure auto's choices per size into a tuning file"),
                ("trace", trace_cli, "merge every rank's flight-recorder dump: who hangs, who is slow, where"))
    for name, mod, help_text in commands:
        mod.add_arguments(sub.add_parser(name, help=help_text, description=mod.__doc__,
                                         formatter_class=argparse.RawDescriptionHelpFormatter))
    a = p.parse_args(argv)
    runs = {name: mod.run for name, mod, _ in commands}
    try:
        return int(runs[a.cmd](a))
    except (ValueError, FileNotFoundError) as e:
        print(f"hocc {a.cmd}: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
