"""hocc._C, the C++ executor (csrc/), from Python: loading it, and what was built.

Every plan runs there, on every device: CPU plans over shared memory and
torch.distributed's gloo (called from C++), CUDA plans over NCCL. The CPU
parts always build; the CUDA kernels and the NCCL transport only where nvcc
and nvidia-nccl-cu12 were present at build time (see setup.py)."""

from __future__ import annotations

from types import ModuleType

BUILD_HINT = ("build it with `pip install --no-build-isolation -e .` from the hocc checkout (needs a C++20 "
              "compiler, torch and ninja; for the CUDA/NCCL parts also nvcc and `pip install nvidia-nccl-cu12` "
              "first, or HOCC_BUILD_CUDA=1 to insist)")


def load() -> ModuleType:
    """The extension module, or a RuntimeError that says how to build it."""
    import torch  # noqa: F401 - hocc._C links torch's libraries: load them first

    try:
        from hocc import _C
    except ImportError as e:
        raise RuntimeError(f"hocc's C++ executor (hocc._C) is not available ({e}); {BUILD_HINT}") from e
    return _C


def available() -> bool:
    try:
        load()
    except RuntimeError:
        return False
    return True


def cuda_built() -> bool:
    """True when hocc._C has the CUDA kernels and the NCCL transport."""
    return available() and bool(load().cuda_built())


def require_cuda() -> ModuleType:
    c = load()
    if not c.cuda_built():
        raise RuntimeError(f"hocc's C++ executor was built without CUDA/NCCL, so it cannot run CUDA tensors; "
                           f"{BUILD_HINT}")
    return c
