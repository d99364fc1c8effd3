# Set-up and entry points. `make demo` and `make test` work on a fresh machine:
# they create .venv, install torch==2.13.0 (the CPU build on this machine's
# disk), then hocc in editable mode with its dev extras.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.hocc-installed
CSRC := $(shell find csrc -type f)

.PHONY: venv build demo demo-cluster test test-fast lint clean

# hocc._C builds against the venv's torch (its headers and pybind11), hence
# --no-build-isolation; ninja compiles in parallel. One build serves CPU and
# GPU: on CUDA it drives torch's own NCCL backend, so it needs no CUDA here.
$(STAMP): pyproject.toml setup.py $(CSRC)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q 'setuptools>=77' wheel ninja
	$(PY) -m pip install -q --no-build-isolation -e '.[dev]'
	$(PY) -m hocc.executor
	touch $@

venv: $(STAMP)

# rebuild hocc._C in place after editing csrc/ (faster than reinstalling)
build: $(STAMP)
	$(PY) setup.py -q build_ext --inplace

demo: $(STAMP)
	$(PY) -m hocc.bench --nprocs 8 --topology 2x4 -b 64K -e 4M -f 4 -n 5 -w 2 -c 1 \
		--op all_reduce,all_gather,reduce_scatter --algo native,ho_ring

demo-cluster: $(STAMP)
	$(VENV)/bin/python bench/cluster.py 2x4 -- -b 1M -e 64M -f 4 -n 5 -w 2 -c 1 --algo native,ho_ring,auto

lint: $(STAMP)
	$(VENV)/bin/ruff check hocc tests bench examples
	$(VENV)/bin/mypy

# a minute or two: the executor matrix on the in-process transport (world
# sizes 1-9, counts 0, 1 and primes, in and out of place, tiny chunks)
test-fast: $(STAMP)
	$(PY) -m pytest -q tests/test_executor_matrix.py

test: $(STAMP) lint
	$(PY) -m hocc.executor
	$(PY) -m pytest -q --durations=15 tests

clean:
	rm -rf $(VENV) build *.egg-info hocc/_C*.so
