"""The `hocc` command: `hocc plan` (predictions, crossovers, pictures),
`hocc calibrate` (fit the cost model to hocc-bench results or nccl-tests
logs) and `hocc topo` (what this machine's topology looks like). None needs
ranks, torch.distributed or a GPU."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from hocc.tools import calibrate_cli, plan_cli, topo_cli


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="hocc", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    plan_cli.add_arguments(sub.add_parser("plan", help="predict each algorithm's time; auto's picks; --draw",
                                          description=plan_cli.__doc__,
                                          formatter_class=argparse.RawDescriptionHelpFormatter))
    calibrate_cli.add_arguments(sub.add_parser("calibrate", help="fit the cost model to hocc-bench JSON",
                                               description=calibrate_cli.__doc__,
                                               formatter_class=argparse.RawDescriptionHelpFormatter))
    topo_cli.add_arguments(sub.add_parser("topo", help="detect this machine's GPUs, NVLink and NICs; print a spec",
                                          description=topo_cli.__doc__,
                                          formatter_class=argparse.RawDescriptionHelpFormatter))
    a = p.parse_args(argv)
    runs = {"plan": plan_cli.run, "calibrate": calibrate_cli.run, "topo": topo_cli.run}
    try:
        return runs[a.cmd](a)
    except (ValueError, FileNotFoundError) as e:
        print(f"hocc {a.cmd}: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
