#!/usr/bin/env python3
"""The emulated multi-host cluster's command (docs/testbed.md); the cluster
itself is hocc/bench/emulated.py (hocc.bench.emulated to the tests and the
package).

    sudo .venv/bin/python bench/cluster.py 2x4 [--rate 200mbit] -- -b 1M -e 64M --op all --algo native,ho_ring
    sudo .venv/bin/python bench/cluster.py 2x4 --script bench/per_host_run.py -- --size 64M
    sudo .venv/bin/python bench/cluster.py --cleanup

It runs that file by path, not by import: it is stdlib only, and
bench/regression.py runs this command with PYTHONPATH at an older checkout,
whose hocc the ranks import and which may not have the module."""

import runpy
from pathlib import Path

runpy.run_path(str(Path(__file__).resolve().parents[1] / "hocc" / "bench" / "emulated.py"), run_name="__main__")
