"""Writes hocc._C's gcov counts before os._exit, for `make coverage` (which puts this folder on PYTHONPATH).

A --coverage build of hocc._C writes its .gcda counts when the process exits normally (the library's
destructors run then). A process that ends with os._exit skips them, and so loses everything it
executed: every rank that hocc's launcher starts (hocc/bench/launch.py, the multi-process tests)
comes from multiprocessing's forkserver, whose child calls os._exit once the rank's function returns,
and tests/test_errors.py's ranks end with os._exit on purpose. Python imports `sitecustomize` at start-up
from the first folder on sys.path that has one, so every interpreter of the run (pytest, the forkserver
and the ranks it forks, spawned processes, subprocesses) wraps os._exit to call the library's
__gcov_dump first; the Makefile links hocc._C with -Wl,-u,__gcov_dump so that libgcov's copy is in it
and exported. Processes killed by a signal (SIGKILL, an unhandled SIGTERM) still lose their counts, as
do subprocesses started with a PYTHONPATH without this folder (tests/test_soak.py sets its own).
"""

from __future__ import annotations

import os
import sys
from typing import NoReturn

_os_exit = os._exit


def _gcov_dump() -> None:
    """__gcov_dump of the loaded hocc._C, if it is loaded and instrumented."""
    path = getattr(sys.modules.get("hocc._C"), "__file__", None)
    if not path:
        return
    try:
        import ctypes

        ctypes.CDLL(path)["__gcov_dump"]()
    except (OSError, AttributeError):  # not a --coverage build, or not linked with -u __gcov_dump
        pass


def _exit(status: int) -> NoReturn:
    _gcov_dump()
    _os_exit(status)


os._exit = _exit
