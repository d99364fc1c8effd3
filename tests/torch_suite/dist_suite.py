"""torch's own distributed_test.py (torch/testing/_internal/distributed/)
on a backend named by SUITE_BACKEND (hocc, default, or gloo for the
comparison). The module is imported as for gloo (torch gates tests by the
backend at import) and the backend its tests initialize is switched after, so
both runs select the same tests and run their code unchanged (torch gates
its barrier-timeout tests to gloo: "Only gloo backend supports timeouts";
tests/test_torch_suite.py runs those on hocc this way):

    WORLD_SIZE=4 SUITE_BACKEND=gloo python tests/torch_suite/dist_suite.py -k all_reduce -k all_gather \\
        -k reduce_scatter -k allgather
    WORLD_SIZE=4 SUITE_BACKEND=hocc python tests/torch_suite/dist_suite.py -k all_reduce ...
"""

import os
import tempfile

os.environ.setdefault("TEMP_DIR", tempfile.mkdtemp())
os.environ.setdefault("WORLD_SIZE", "4")
os.environ.update(BACKEND="gloo", INIT_METHOD=f"file://{os.environ['TEMP_DIR']}/init")
os.environ.pop("CI", None)  # torch's harness would write XML reports through xmlrunner (not installed)

import torch.testing._internal.distributed.distributed_test as torch_suite
from torch.testing._internal.common_utils import run_tests

import hocc  # noqa: F401 - registers the backend, in each spawned rank too (they import this file)

torch_suite.BACKEND = os.environ.get("SUITE_BACKEND", "hocc")


class TestBackend(torch_suite.TestDistBackend, torch_suite.DistributedTest._DistTestBase):
    def setUp(self) -> None:
        super().setUp()
        self._spawn_processes()


if __name__ == "__main__":
    run_tests()
