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

UCX (transport/ucx.cc, hocc's transport between hosts) comes from PyPI's
libucx-cu12 wheel: its headers and libraries are found here in the installed
`libucx` package, and hocc._C links libucp with that lib folder as its rpath
(plus the path a wheel install of hocc would see it at), so `import hocc._C`
needs no LD_LIBRARY_PATH. Without the package the build leaves UCX out
(HOCC_HAVE_UCX undefined) and hocc keeps gloo between hosts, saying so once.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

ROOT = Path(__file__).parent
# every .cc under csrc/ but the sanitizer's own driver (csrc/tests/): no list to keep in step with the
# Makefile's sanitizer build, which takes the same files less those that need torch, pybind11 or UCX
SOURCES = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "csrc").rglob("*.cc") if "tests" not in p.parts)



def ucx_dirs() -> tuple[Path, Path] | None:
    """The include and lib folders of the installed libucx wheel, or None."""
    spec = importlib.util.find_spec("libucx")
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(next(iter(spec.submodule_search_locations)))
    inc, lib = root / "include", root / "lib"
    return (inc, lib) if (inc / "ucp" / "api" / "ucp.h").exists() and (lib / "libucp.so").exists() else None


include_dirs, libraries, macros, link_args = [str(ROOT / "csrc")], ["rt"], [], []
ucx = ucx_dirs()
if ucx is not None:
    inc, lib = ucx
    include_dirs.append(str(inc))
    libraries += ["ucp", "ucs"]
    macros.append(("HOCC_HAVE_UCX", "1"))
    # the wheel's folder as found now (an editable or in-place build), and beside hocc/ in site-packages
    link_args += [f"-L{lib}", f"-Wl,-rpath,{lib}", "-Wl,-rpath,$ORIGIN/../libucx/lib"]
else:
    print("hocc: libucx (pip install libucx-cu12) not found: building without UCX; gloo carries steps between hosts")

ext = CppExtension("hocc._C", SOURCES, include_dirs=include_dirs, extra_compile_args=["-O3"], libraries=libraries,
                   define_macros=macros, extra_link_args=link_args)
setup(ext_modules=[ext], cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)})
