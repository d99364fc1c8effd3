"""`python -m hocc.executor`: the C++ executor this install has, and the path
each device's tensors take through it (CI prints it)."""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist

from hocc.config import get_config
from hocc.executor import available, load, ucx_unavailable


def main() -> int:
    if not available():
        load()  # raises with the build hint
    c = load()
    print(f"hocc._C: {c.__file__} (torch {torch.__version__})")
    why = ucx_unavailable()
    net = get_config().net_transport
    tls = os.environ.get("UCX_TLS", "tcp, hocc's default")
    between = ("torch's ProcessGroupGloo sub-groups (called from C++)" if net == "gloo" or why else
               f"UCX {c.ucx_version()} (ucp tag messages progressed on the calling thread, UCX_TLS {tls}"
               + ("; gloo where a member lacks UCX)" if net == "auto" else ")"))
    print(f"CPU tensors: hocc's plans in the C++ executor, over shared memory within a host and, between hosts, "
          f"{between} (HOCC_NET_TRANSPORT={net})")
    if why:
        print(f"UCX: not available here: {why}" + ("; HOCC_NET_TRANSPORT=ucx will fail" if net == "ucx" else ""))
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
