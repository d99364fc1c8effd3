"""hocc-bench: nccl-tests-style bandwidth benchmark (see cli.py)."""
