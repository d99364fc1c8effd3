"""`python -m hocc.executor`: the C++ executor this install has, and the path
each device's tensors take through it (CI prints it)."""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist

from hocc.executor import available, load


def main() -> int:
    if not available():
        load()  # raises with the build hint
    c = load()
    print(f"hocc._C: {c.__file__} (torch {torch.__version__})")
    print("CPU tensors: hocc's plans in the C++ executor, over shared memory within a host and "
          "torch's ProcessGroupGloo sub-groups (called from C++) between hosts")
    nccl = dist.is_nccl_available()
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    print("CUDA tensors: the same plans and executor; every step a collective of torch's ProcessGroupNCCL on its "
          "sub-group (torch's watchdog, timeouts, abort and flight recorder apply), copies and AVG by torch's kernels "
          f"on the caller's stream. Here: torch CUDA {'yes' if torch.version.cuda else 'no'}"
          f"{f' ({torch.version.cuda})' if torch.version.cuda else ''}, NCCL backend {'yes' if nccl else 'no'}"
          f"{f' ({torch.cuda.nccl.version()})' if nccl and gpus else ''}, GPUs {gpus}")
    if gpus:
        transport = c.GroupTransport(0, 1, "cuda:0")
        print(f"hocc._C: a CUDA GroupTransport on cuda:0, async: {transport.is_async}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
