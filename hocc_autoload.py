"""Registers the "hocc" torch.distributed backend when torch is imported, so
`dist.init_process_group("hocc")` works in processes that never import hocc
(mp.spawn children of a script that imports hocc only inside main(), a
framework's launcher). torch calls `register` through its "torch.backends"
entry point at the end of `import torch` (TORCH_DEVICE_BACKEND_AUTOLOAD=0
turns that off). It imports nothing of hocc: hocc loads at the group's
creation. A module of its own, outside the hocc package, so that `import
torch` does not import hocc."""

from __future__ import annotations

from typing import Any


def _create(opts: Any, pg_options: Any = None) -> Any:
    from hocc.backend.process_group import create

    return create(opts, pg_options)


def register() -> None:
    try:
        import torch.distributed as dist

        if dist.is_available() and "hocc" not in dist.Backend.backend_list:
            dist.Backend.register_backend("hocc", _create, extended_api=True, devices=["cpu", "cuda"])
    except Exception:  # noqa: BLE001 - an error here would fail every `import torch`; hocc's import registers too
        pass
