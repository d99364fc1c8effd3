"""torch's own barrier-timeout tests (torch/testing/_internal/distributed/
distributed_test.py: test_barrier_timeout_global, _group, _full_group), run
on the hocc backend. torch gates them to gloo ("Only gloo backend supports
timeouts") when the module is imported, so it is imported as for gloo, and
the backend its tests initialize is switched to hocc afterwards: the tests'
code runs unchanged. Run: WORLD_SIZE=4 python barrier_timeout.py -k test_barrier_timeout."""

import os
import tempfile

os.environ.setdefault("TEMP_DIR", tempfile.mkdtemp())
os.environ.setdefault("WORLD_SIZE", "4")
os.environ.update(BACKEND="gloo", INIT_METHOD=f"file://{os.environ['TEMP_DIR']}/init")
# torch's harness takes any CI variable as its own CI and then writes XML reports through xmlrunner,
# which hocc does not install; the result is the exit status either way.
os.environ.pop("CI", None)

import torch.testing._internal.distributed.distributed_test as torch_suite
from torch.testing._internal.common_utils import run_tests

import hocc  # noqa: F401 - registers the backend, in each spawned rank too (they import this file)

torch_suite.BACKEND = "hocc"


class TestHoccBackend(torch_suite.TestDistBackend, torch_suite.DistributedTest._DistTestBase):
    def setUp(self) -> None:
        super().setUp()
        self._spawn_processes()


if __name__ == "__main__":
    run_tests()
