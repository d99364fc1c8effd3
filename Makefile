# Set-up and entry points. `make demo` and `make test` work on a fresh machine:
# they create .venv, install torch==2.13.0 (the CPU build on this machine's
# disk), then hocc in editable mode with its dev extras.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.hocc-installed
CSRC := $(shell find csrc -type f -not -path 'csrc/tests/*')

.PHONY: venv build demo demo-cluster test test-fast lint clean coverage sanitize

# hocc._C builds against the venv's torch (its headers and pybind11), hence
# --no-build-isolation; ninja compiles in parallel. libucx-cu12 goes in before
# the build too: its headers are what setup.py builds the UCX transport with
# (pip installs a package's dependencies only after building it). One build serves CPU and
# GPU: on CUDA it drives torch's own NCCL backend, so it needs no CUDA here.
$(STAMP): pyproject.toml setup.py $(CSRC)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q 'setuptools>=77' wheel ninja libucx-cu12
	$(PY) -m pip install -q --no-build-isolation -e '.[dev,test]'
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

# under two minutes, every layer: plans, cost model and planner, the executor matrix on the
# in-process transport (world sizes 1-5), a few small multi-process worlds through the engine and
# the backend, the API's errors (tests marked slow, root or gpu are left to `make test`)
test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow and not root and not gpu" --durations=10 tests

test: $(STAMP) lint sanitize
	$(PY) -m hocc.executor
	$(PY) -m pytest -q --durations=15 tests

# The C++ core under sanitizers (about 95 CPU-seconds, compiling included: a minute on 2 idle cores, about
# 20 s when nothing needs rebuilding; no torch; the venv only for its libucx):
# csrc/tests/sanitize_main.cc runs plans on ranks as threads (in-process and shared-memory transports,
# several lanes at once; UCX rails in the ASan build) and as forked processes (shared memory), checks every
# result, and drives the abort, fault, mismatch, dead-peer and timeout paths. It and the csrc/ files that need neither torch nor
# pybind11 are built twice into build/sanitize/ (never hocc/_C*.so), with ASan+UBSan and with TSan, and
# both run (csrc/tests/run_sanitized.sh; output in build/sanitize/*/hocc_sanitize.log); a report, a wrong
# result or a hang fails the target. A binary that dies at start with "unexpected memory mapping" (TSan where
# ASLR puts libraries where its shadow memory goes) runs under `setarch -R` (ASLR off). No suppressions of
# hocc's code: the one file of them (below) is UCX's leaks at exit.
SAN_DIR := build/sanitize
# every .cc under csrc/ (what setup.py builds, with the sanitizer's driver in csrc/tests/) but those that
# need torch or pybind11
SAN_NEEDS_MORE := device/torch_device.cc transport/c10d.cc python/%.cc
# UCX: the ASan build takes transport/ucx.cc with the libucx wheel that setup.py builds hocc._C with (the
# venv's; the sanitize recipe finds it), and runs the UCX rails; the TSan build takes it without UCX (the
# library is not instrumented, so each of its own accesses would be a report), as does a machine without it.
# Its leaks at exit (UCX's process-wide state) are suppressed by csrc/tests/lsan_ucx.supp, UCX's only.
SAN_UCX ?=
SAN_UCX_CFLAGS := $(if $(SAN_UCX),-DHOCC_HAVE_UCX -I$(SAN_UCX)/include)
SAN_RPATH := -Wl,-rpath,
SAN_UCX_LIBS := $(if $(SAN_UCX),-L$(SAN_UCX)/lib $(SAN_RPATH)$(SAN_UCX)/lib -lucp -lucs)
SAN_FIND_UCX := import importlib.util as u, pathlib as p; s = u.find_spec("libucx"); \
	d = p.Path(next(iter(s.submodule_search_locations))) if s else None; \
	print(d if d and (d / "include/ucp/api/ucp.h").exists() else "")
SAN_SRCS := $(filter-out $(SAN_NEEDS_MORE),$(patsubst csrc/%,%,$(wildcard csrc/*/*.cc)))
SAN_CXX ?= g++
SAN_CXXFLAGS := -std=c++17 -O1 -g -fno-omit-frame-pointer -pthread -Wall -Icsrc
SAN_FLAGS_asan := -fsanitize=address,undefined -fno-sanitize-recover=all
SAN_FLAGS_tsan := -fsanitize=thread
SAN_ENV_asan := ASAN_OPTIONS=detect_leaks=1:detect_stack_use_after_return=1:check_initialization_order=1 \
	UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 LSAN_OPTIONS=suppressions=$(CURDIR)/csrc/tests/lsan_ucx.supp
SAN_ENV_tsan := TSAN_OPTIONS=second_deadlock_stack=1:halt_on_error=0
SAN_BINS := $(SAN_DIR)/asan/hocc_sanitize $(SAN_DIR)/tsan/hocc_sanitize

$(SAN_DIR)/asan/%.o: csrc/%.cc $(filter %.h,$(CSRC)) csrc/tests/check.h
	@mkdir -p $(@D)
	$(SAN_CXX) $(SAN_CXXFLAGS) $(SAN_FLAGS_asan) $(if $(filter transport/ucx.cc,$*.cc),$(SAN_UCX_CFLAGS)) -c $< -o $@
$(SAN_DIR)/tsan/%.o: csrc/%.cc $(filter %.h,$(CSRC)) csrc/tests/check.h
	@mkdir -p $(@D)
	$(SAN_CXX) $(SAN_CXXFLAGS) $(SAN_FLAGS_tsan) -c $< -o $@
$(SAN_DIR)/asan/hocc_sanitize: $(SAN_SRCS:%.cc=$(SAN_DIR)/asan/%.o)
	$(SAN_CXX) $(SAN_FLAGS_asan) -pthread $^ $(SAN_UCX_LIBS) -o $@
$(SAN_DIR)/tsan/hocc_sanitize: $(SAN_SRCS:%.cc=$(SAN_DIR)/tsan/%.o)
	$(SAN_CXX) $(SAN_FLAGS_tsan) -pthread $^ -o $@

sanitize:
	@$(MAKE) --no-print-directory -j2 $(SAN_BINS) SAN_UCX="$$($(PY) -c '$(SAN_FIND_UCX)' 2>/dev/null)"
	@echo "== ASan + UBSan"; sh csrc/tests/run_sanitized.sh $(SAN_DIR)/asan/hocc_sanitize $(SAN_ENV_asan)
	@echo "== TSan"; sh csrc/tests/run_sanitized.sh $(SAN_DIR)/tsan/hocc_sanitize $(SAN_ENV_tsan)

clean:
	rm -rf $(VENV) build *.egg-info hocc/_C*.so

# Line coverage of csrc/ by the whole test suite (25-30 minutes on 2 cores): hocc._C rebuilt in place with
# gcov instrumentation (its objects and their .gcda counts in build/coverage), pytest over it,
# bench/csrc_coverage.py's table into bench/results/coverage/csrc.md and csrc.json, then the normal
# hocc._C rebuilt in place (--force: the instrumented one is newer than the sources; after an
# interrupted run, `$(PY) setup.py -q build_ext --inplace --force` restores it). setup.py takes no
# flags of its own; CFLAGS from the environment would come before its -O3 (and replace Python's
# -DNDEBUG -g -fwrapv -Wall), so CXX names a wrapper that appends --coverage $(COV_OPT) after it.
# LDFLAGS links libgcov and keeps its __gcov_dump, which bench/gcov_site/sitecustomize.py calls
# before os._exit (the way the forkserver's ranks end) so that their counts are written too. A failed
# test fails the target after the table is written and the normal build is back.
COV_DIR := build/coverage
COV_OUT := bench/results/coverage
COV_OPT ?= -O0

coverage: $(STAMP)
	mkdir -p $(COV_DIR) $(COV_OUT)
	printf '#!/bin/sh\nexec c++ "$$@" --coverage $(COV_OPT)\n' > $(COV_DIR)/c++
	chmod +x $(COV_DIR)/c++
	find $(COV_DIR) -name '*.gcda' -delete
	CXX=$(CURDIR)/$(COV_DIR)/c++ LDFLAGS='--coverage -Wl,-u,__gcov_dump' TORCH_NO_COMPILER_WRAPPER=1 \
		$(PY) setup.py -q build_ext --inplace --force --build-temp $(COV_DIR) --build-lib $(COV_DIR)/lib
	rc=0; \
	PYTHONPATH=$(CURDIR)/bench/gcov_site$${PYTHONPATH:+:$$PYTHONPATH} $(PY) -m pytest -q tests || rc=$$?; \
	$(PY) bench/csrc_coverage.py $(COV_DIR) --markdown $(COV_OUT)/csrc.md --json $(COV_OUT)/csrc.json || rc=$$?; \
	$(PY) setup.py -q build_ext --inplace --force || rc=$$?; \
	exit $$rc
