"""Build rules for hocc._C, the C++ executor (csrc/).

One build for every device, against torch's headers and its copy of pybind11
(torch.utils.cpp_extension): transport/c10d.cc calls torch.distributed's
backends from C++ (gloo on CPU, NCCL on GPUs) and device/torch_device.cc
drives a GPU through torch's device-generic streams, events and kernels, so
nothing here needs nvcc, CUDA or NCCL, and the same build runs on a CPU-only
torch and on a CUDA one (which brings CUDA and NCCL at run time). Only those
two files include torch's heavy headers; the rest uses plain pybind11.
Build with `pip install --no-build-isolation` (as the Makefile does) so the
build sees the venv's torch.
"""

from __future__ import annotations

from pathlib import Path

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

ROOT = Path(__file__).parent
SOURCES = [
    "csrc/core/types.cc",
    "csrc/core/plan.cc",
    "csrc/core/call.cc",
    "csrc/kernels/reduce_cpu.cc",
    "csrc/device/cpu_device.cc",
    "csrc/device/torch_device.cc",
    "csrc/transport/ring.cc",
    "csrc/transport/inproc.cc",
    "csrc/transport/shm.cc",
    "csrc/transport/group.cc",
    "csrc/transport/c10d.cc",
    "csrc/executor/layout.cc",
    "csrc/executor/executor.cc",
    "csrc/executor/call_queue.cc",
    "csrc/python/bindings.cc",
    "csrc/python/call_queue.cc",
]

ext = CppExtension("hocc._C", SOURCES, include_dirs=[str(ROOT / "csrc")], extra_compile_args=["-O3"],
                   libraries=["rt"])
setup(ext_modules=[ext], cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)})
