"""Build rules for hocc._C, the C++ executor (csrc/).

The CPU parts (executor, layout, in-process, shared-memory and c10d
transports, host reductions) always build, against torch's headers and its
copy of pybind11 (torch.utils.cpp_extension), so that transport/c10d.cc can
call torch.distributed's gloo backend from C++; only that file includes the
heavy torch headers, the rest uses plain pybind11 from the same copy. The CUDA
parts (reduction kernels, NCCL transport) build too when nvcc and NCCL (the
nvidia-nccl-cu12 package, or HOCC_NCCL_HOME) are found. HOCC_BUILD_CUDA=1
forces them (and fails if something is missing), HOCC_BUILD_CUDA=0 leaves them
out. NCCL's headers come from the installed package, so build with
`pip install --no-build-isolation` (as the Makefile does) to let the build see it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

ROOT = Path(__file__).parent
CPU_SOURCES = [
    "csrc/core/types.cc",
    "csrc/core/plan.cc",
    "csrc/core/call.cc",
    "csrc/kernels/reduce_cpu.cc",
    "csrc/device/cpu_device.cc",
    "csrc/transport/ring.cc",
    "csrc/transport/inproc.cc",
    "csrc/transport/shm.cc",
    "csrc/transport/group.cc",
    "csrc/transport/c10d.cc",
    "csrc/executor/layout.cc",
    "csrc/executor/executor.cc",
    "csrc/python/bindings.cc",
]
CUDA_HOST_SOURCES = ["csrc/device/cuda_device.cc", "csrc/transport/nccl.cc", "csrc/transport/nccl_watchdog.cc"]
CUDA_KERNELS = ["csrc/kernels/reduce_cuda.cu"]
# A100 (sm_80), H100/H200 (sm_90), and PTX for newer GPUs to compile at load
GENCODE = ["-gencode", "arch=compute_80,code=sm_80", "-gencode", "arch=compute_90,code=sm_90",
           "-gencode", "arch=compute_90,code=compute_90"]


def log(msg: str) -> None:
    print(f"hocc build: {msg}", file=sys.stderr, flush=True)


def find_cuda() -> Path | None:
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home:
        return Path(home)
    nvcc = shutil.which("nvcc")
    candidates = [Path(os.path.realpath(nvcc)).parent.parent] if nvcc else []
    candidates.append(Path("/usr/local/cuda"))  # nvcc on PATH may be a wrapper outside the toolkit
    for c in candidates:
        if (c / "bin" / "nvcc").exists() and (c / "include" / "cuda_runtime.h").exists():
            return c
    return None


def find_nccl() -> Path | None:
    home = os.environ.get("HOCC_NCCL_HOME")
    if home:
        return Path(home)
    try:
        import nvidia.nccl as pkg  # the nvidia-nccl-cu12 wheel
    except ImportError:
        return None
    for p in pkg.__path__:
        if (Path(p) / "include" / "nccl.h").exists():
            return Path(p)
    return None


def cuda_config() -> tuple[Path, Path] | None:
    """(CUDA home, NCCL home) when the CUDA parts are to be built, else None."""
    mode = os.environ.get("HOCC_BUILD_CUDA", "auto").strip().lower()
    if mode in ("0", "no", "off", "false"):
        log("CUDA parts off (HOCC_BUILD_CUDA=0)")
        return None
    cuda, nccl = find_cuda(), find_nccl()
    missing = []
    if cuda is None or not (cuda / "bin" / "nvcc").exists():
        missing.append("nvcc (put it on PATH or set CUDA_HOME)")
    if nccl is None:
        missing.append("NCCL (pip install nvidia-nccl-cu12, or set HOCC_NCCL_HOME)")
    if missing:
        if mode in ("1", "yes", "on", "true"):
            raise SystemExit("hocc build: HOCC_BUILD_CUDA=1 but " + " and ".join(missing) + " not found")
        log("CUDA parts skipped: " + " and ".join(missing) + " not found; CPU parts only")
        return None
    assert cuda is not None and nccl is not None
    log(f"CUDA parts on: nvcc from {cuda}, NCCL from {nccl}")
    return cuda, nccl


class BuildExt(BuildExtension):
    """Compiles the .cu kernels with nvcc first, then everything else as torch's
    extensions are built (its pybind11, its ABI flags, ninja in parallel)."""

    def build_extension(self, ext):  # type: ignore[no-untyped-def]
        for cu in getattr(ext, "cuda_kernels", []):
            cuda_home = ext.cuda_home
            obj = Path(self.build_temp) / (Path(cu).stem + ".o")
            obj.parent.mkdir(parents=True, exist_ok=True)
            src = ROOT / cu
            if not obj.exists() or obj.stat().st_mtime < max(p.stat().st_mtime for p in (ROOT / "csrc").rglob("*")):
                cmd = [str(cuda_home / "bin" / "nvcc"), "-c", str(src), "-o", str(obj), "-O3", "-std=c++17",
                       "-Xcompiler", "-fPIC", f"-I{ROOT / 'csrc'}", *GENCODE]
                log(" ".join(cmd))
                subprocess.check_call(cmd)
            ext.extra_objects.append(str(obj))
        super().build_extension(ext)


def extension() -> Extension:
    sources = list(CPU_SOURCES)
    kwargs: dict = dict(include_dirs=[str(ROOT / "csrc")], extra_compile_args=["-O3"],
                        libraries=["rt"], define_macros=[])
    cfg = cuda_config()
    if cfg is not None:
        cuda, nccl = cfg
        sources += CUDA_HOST_SOURCES
        nccl_lib = nccl / "lib"
        kwargs["define_macros"].append(("HOCC_WITH_CUDA", "1"))
        kwargs["include_dirs"] += [str(cuda / "include"), str(nccl / "include")]
        kwargs["library_dirs"] = [str(cuda / "lib64"), str(nccl_lib)]
        # the CUDA runtime statically; NCCL from the wheel (it ships only libnccl.so.2), found at run
        # time through an rpath: beside hocc in site-packages, or where the build found it
        kwargs["extra_link_args"] = ["-l:libnccl.so.2", "-lcudart_static", "-ldl", "-lpthread",
                                     "-Wl,-rpath,$ORIGIN/../nvidia/nccl/lib", f"-Wl,-rpath,{nccl_lib}"]
    ext = CppExtension("hocc._C", sources, **kwargs)
    if cfg is not None:
        ext.cuda_kernels = CUDA_KERNELS  # type: ignore[attr-defined]
        ext.cuda_home = cfg[0]  # type: ignore[attr-defined]
    return ext


setup(ext_modules=[extension()], cmdclass={"build_ext": BuildExt.with_options(use_ninja=True)})
