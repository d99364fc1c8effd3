"""`python -m hocc.executor`: what the C++ executor was built with (CI prints it)."""

from __future__ import annotations

import subprocess
import sys

from hocc.executor import available, load


def main() -> int:
    if not available():
        load()  # raises with the build hint
    c = load()
    path = str(c.__file__)
    print(f"hocc._C: {path}")
    if not c.cuda_built():
        print("hocc._C: CPU parts only (no CUDA kernels, no NCCL transport)")
        return 0
    print(f"hocc._C: CUDA kernels and NCCL transport built; NCCL {c.nccl_version()}")
    linked = subprocess.run(["ldd", path], capture_output=True, text=True, check=False).stdout
    for line in linked.splitlines():
        if "nccl" in line or "cuda" in line:
            print(f"hocc._C links {line.strip()}")
    symbols = subprocess.run(["nm", "-C", "--defined-only", path], capture_output=True, text=True,
                             check=False).stdout
    for name in ("hocc::NcclTransport::prepare", "hocc::reduce_cuda", "hocc::CudaDevice::reduce"):
        print(f"hocc._C defines {name}: {'yes' if name in symbols else 'NO'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
