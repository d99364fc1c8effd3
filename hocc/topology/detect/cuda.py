"""The GPUs of this host: from the CUDA driver when it loads (ctypes, at
call time; nothing imported), else from the NVIDIA driver's
/proc/driver/nvidia/gpus. Each GPU is its PCI address (None when unknown),
in CUDA's device order (by PCI address, as CUDA_DEVICE_ORDER=PCI_BUS_ID),
limited by CUDA_VISIBLE_DEVICES when it lists indices."""

from __future__ import annotations

import ctypes
import os
from collections.abc import Mapping
from pathlib import Path


def cuda_driver_gpus() -> list[str | None] | None:
    """PCI addresses of the devices the CUDA driver sees, or None without a driver."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    count = ctypes.c_int(0)
    if lib.cuInit(0) != 0 or lib.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return None
    out: list[str | None] = []
    for i in range(count.value):
        dev, buf = ctypes.c_int(0), ctypes.create_string_buffer(32)
        ok = lib.cuDeviceGet(ctypes.byref(dev), i) == 0 and lib.cuDeviceGetPCIBusId(buf, 32, dev) == 0
        out.append(buf.value.decode().lower() if ok else None)
    return out


def procfs_gpus(root: str | Path = "/", env: Mapping[str, str] | None = None) -> list[str | None] | None:
    """PCI addresses listed by the NVIDIA kernel driver, sorted (CUDA's
    PCI_BUS_ID order), filtered by CUDA_VISIBLE_DEVICES; None without it."""
    base = Path(root) / "proc" / "driver" / "nvidia" / "gpus"
    if not base.is_dir():
        return None
    gpus: list[str | None] = list(sorted(p.name.lower() for p in base.iterdir()))
    visible = (env if env is not None else os.environ).get("CUDA_VISIBLE_DEVICES")
    if visible is not None and all(v.strip().isdigit() for v in visible.split(",") if v.strip()):
        picks = [int(v) for v in visible.split(",") if v.strip()]
        gpus = [gpus[i] for i in picks if i < len(gpus)]
    return gpus


def detect_gpus(root: str | Path = "/", env: Mapping[str, str] | None = None,
                use_driver: bool = True) -> tuple[list[str | None] | None, str]:
    """(GPUs, where they were seen: 'cuda', 'procfs' or '')."""
    if use_driver and str(root) == "/":
        gpus = cuda_driver_gpus()
        if gpus is not None:
            return gpus, "cuda"
    gpus = procfs_gpus(root, env)
    return (gpus, "procfs") if gpus is not None else (None, "")
