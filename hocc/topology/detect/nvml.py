"""NVLink connectivity from NVML (nvidia-ml-py, an optional dependency:
`pip install hocc[nvml]`). Without it, or without a driver, the detector
says so (None) and detection falls back to `nvidia-smi topo -m`."""

from __future__ import annotations

from types import ModuleType
from typing import Any


def load() -> ModuleType | None:
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:  # no driver: NVMLError_LibraryNotFound and friends
        return None
    mod: ModuleType = pynvml
    return mod


def nvlink_fabric(nvml: Any | None = None, max_links: int = 18) -> dict[str, Any] | None:
    """{"gpus": [PCI address...], "links": [active NVLinks per GPU], "nvswitch": bool},
    or None without NVML. On NVSwitch machines every active link's remote end
    is an NVSwitch (NVML's remote device type), so all GPUs reach each other."""
    nvml = nvml if nvml is not None else load()
    if nvml is None:
        return None
    error = getattr(nvml, "NVMLError", RuntimeError)  # what NVML raises past a GPU's last link
    count = nvml.nvmlDeviceGetCount()
    gpus, links, switched = [], [], True
    for i in range(count):
        h = nvml.nvmlDeviceGetHandleByIndex(i)
        pci = nvml.nvmlDeviceGetPciInfo(h).busId
        gpus.append((pci.decode() if isinstance(pci, bytes) else str(pci)).lower()[-12:])
        active = 0
        for link in range(max_links):
            try:
                if nvml.nvmlDeviceGetNvLinkState(h, link) != nvml.NVML_FEATURE_ENABLED:
                    continue
            except error:
                break
            active += 1
            kind = nvml.nvmlDeviceGetNvLinkRemoteDeviceType(h, link)
            switched = switched and kind == nvml.NVML_NVLINK_DEVICE_TYPE_SWITCH
        links.append(active)
    return {"gpus": gpus, "links": links, "nvswitch": count > 1 and switched and all(links)}
