#!/usr/bin/env python3
"""A planted fault's rank program (hocc.bench.planted_faults, which
tests/test_recorder.py runs too), for bench/cluster.py --script:

    sudo .venv/bin/python bench/cluster.py 4x2 --host-rate 2=50mbit --script bench/planted_faults.py -- \\
        --fault slow-nic --dir D
    hocc trace D"""

import sys

from hocc.bench.planted_faults import main

if __name__ == "__main__":
    sys.exit(main())
