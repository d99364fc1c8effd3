#!/usr/bin/env python3
"""The fault matrix's command (hocc.bench.faults, which tests/test_faults.py
runs too).

    .venv/bin/python bench/faults.py [--timeout 4] [--out bench/results/faults.md]   (cut cells need root)"""

import sys

from hocc.bench.faults import main

if __name__ == "__main__":
    sys.exit(main())
