"""hocc._C, the C++ executor (csrc/), from Python: loading it.

Every plan runs there, on every device, from one build: CPU tensors over
shared memory and torch.distributed's gloo, CUDA tensors over torch's NCCL
backend, both called from C++; the GPU's copies and reductions go through
torch's own kernels (csrc/device/torch_device.cc), so the build needs no CUDA."""

from __future__ import annotations

from types import ModuleType

BUILD_HINT = ("build it with `pip install --no-build-isolation -e .` from the hocc checkout (needs a C++17 "
              "compiler, torch and ninja)")


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


def ucx_unavailable() -> str:
    """'' when this process can run UCX comms (hocc._C built with UCX, its libraries loadable), else why not."""
    c = load()
    return str(c.ucx_unavailable()) if hasattr(c, "ucx_unavailable") else "hocc._C predates UCX support (rebuild it)"
