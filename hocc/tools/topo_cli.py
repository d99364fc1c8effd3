"""`hocc topo`: what hocc detects on this machine (GPUs, NVLink, NICs and
their rates, which NIC each GPU sends through), printed as a topology spec
and as a topology file that HOCC_TOPOLOGY and `hocc plan` read.

    hocc topo                          # this host
    hocc topo --hosts 16 -o job.json   # a job of 16 hosts like this one
    hocc topo --nccl-xml system.xml    # from an NCCL_TOPO_DUMP_FILE
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from hocc.plan.nccl_defaults import NCCL_LINKS
from hocc.topology import LinkModel, save_file
from hocc.topology.detect import detect_local, from_host_reports
from hocc.topology.spec import to_spec


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--root", default="/", help="where /sys and /proc are (default /; a copy of them works too)")
    p.add_argument("--nccl-xml", help="an NCCL topology dump (NCCL_TOPO_DUMP_FILE) to read instead of the machine")
    p.add_argument("--nvidia-smi-topo", help="a saved `nvidia-smi topo -m` output to read instead of running it")
    p.add_argument("--no-nvml", action="store_true", help="do not ask NVML (nvidia-ml-py) for NVLinks")
    p.add_argument("--hosts", type=int, default=1, help="describe a job of this many hosts like this one")
    p.add_argument("--ranks-per-host", type=int, help="ranks per host (default: one per GPU seen, else 1)")
    p.add_argument("-o", "--output", help="write the topology file here")
    p.add_argument("--report", action="store_true", help="also print the host report (JSON) the detectors made")


def _summary(rep: dict[str, Any]) -> str:
    src = rep["sources"]
    parts = []
    if rep["gpus"]:
        parts.append(f"{len(rep['gpus'])} GPUs ({src.get('gpus', '?')})")
    if rep["nics"]:
        rates = sorted({n["rate"] * 8 / 1e9 for n in rep["nics"]})
        parts.append(f"{len(rep['nics'])} NICs {', '.join(n['name'] for n in rep['nics'])} at "
                     f"{'/'.join(f'{r:g}' for r in rates)} Gbit/s ({src.get('nics', '?')})")
    if rep["nvswitch"] is not None:
        parts.append(("NVSwitch" if rep["nvswitch"] else "no NVSwitch") + f" ({src.get('nvlink', '?')})")
    if rep["gpu_nic"] is not None:
        parts.append(f"GPU -> NIC {rep['gpu_nic']} ({src.get('affinity', '?')})")
    return "; ".join(parts) or "nothing"


def run(a: argparse.Namespace) -> int:
    text = Path(a.nvidia_smi_topo).read_text() if a.nvidia_smi_topo else None
    rep = detect_local(a.root, nccl_dump=a.nccl_xml, topo_text=text, use_nvml=not a.no_nvml)
    print(f"# detected on {rep['hostname']}: {_summary(rep)}")
    if rep["unseen"]:
        print(f"# could not see: {', '.join(rep['unseen'])}")
    per_host = a.ranks_per_host or (len(rep["gpus"]) if rep["gpus"] else 1)
    if a.hosts < 1 or per_host < 1:
        raise SystemExit("--hosts and --ranks-per-host must be >= 1")
    names = [f"{rep['hostname']}" if a.hosts == 1 else f"host{h}" for h in range(a.hosts) for _ in range(per_host)]
    reports = [dict(rep, device=i % per_host) for i in range(len(names))]
    topo = from_host_reports(names, reports, NCCL_LINKS if rep["gpus"] else LinkModel(),
                             warn=lambda line: print(f"# {line}"))
    if a.report:
        print(json.dumps(rep, indent=1))
    spec = to_spec(topo)
    print(f"spec: {spec}" if spec else "spec: (none: these hosts need a file, below)")
    print(topo.to_json())
    if a.output:
        save_file(topo, a.output)
        print(f"# wrote {a.output}; use it as HOCC_TOPOLOGY={a.output} or hocc plan {a.output} --backend nccl")
    return 0
