"""The `hocc` command: `hocc plan` (predictions, crossovers, pictures) and
`hocc calibrate` (fit the cost model to hocc-bench results). Neither needs
ranks, torch.distributed or a GPU."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from hocc.tools import calibrate_cli, paro_cli, plan_cli


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="hocc", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    plan_cli.add_arguments(sub.add_parser("plan", help="predict each algorithm's time; auto's picks; --draw",
                                          description=plan_cli.__doc__,
                                          formatter_class=argparse.RawDescriptionHelpFormatter))
    calibrate_cli.add_arguments(sub.add_parser("calibrate", help="fit the cost model to hocc-bench JSON",
                                               description=calibrate_cli.__doc__,
                                               formatter_class=argparse.RawDescriptionHelpFormatter))
    paro_cli.add_arguments(sub.add_parser("paro", help="PaRO-DP: advise a sharding strategy",
                                          description=paro_cli.__doc__,
                                          formatter_class=argparse.RawDescriptionHelpFormatter))
    a = p.parse_args(argv)
    try:
        if a.cmd == "paro":
            return paro_cli.run(a)
        return plan_cli.run(a) if a.cmd == "plan" else calibrate_cli.run(a)
    except (ValueError, FileNotFoundError) as e:
        print(f"hocc {a.cmd}: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
