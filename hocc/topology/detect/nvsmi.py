"""`nvidia-smi topo -m`: which GPUs are joined by NVLink (NV#), and each
GPU's nearest NIC (PIX < PXB < PHB < NODE < SYS).

Both layouts nvidia-smi prints are read: NIC columns named NIC0.. with a
'NIC Legend' naming them (recent drivers), or named by device (mlx5_0, ...).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass

CLOSENESS = {"X": 0, "PIX": 1, "PXB": 2, "PHB": 3, "NODE": 4, "SYS": 5}


@dataclass(frozen=True)
class TopoMatrix:
    gpus: int
    nics: list[str]
    nvlinks: list[list[int]]  # NVLinks between GPU i and GPU j (0: none)
    gpu_nic: list[list[str]]  # relation of GPU i to NIC j ('PIX', ...)

    @property
    def nvswitch(self) -> bool:
        """Every GPU pair joined by the same number of NVLinks: an NVSwitch
        (a mesh of NVLink bridges joins only some pairs)."""
        counts = {self.nvlinks[i][j] for i in range(self.gpus) for j in range(self.gpus) if i != j}
        return self.gpus > 1 and len(counts) == 1 and counts.pop() > 0

    def nearest_nics(self) -> list[int] | None:
        """Each GPU's closest NIC; ties go to the NIC the fewest GPUs took."""
        if not self.nics:
            return None
        taken = [0] * len(self.nics)
        out = []
        for row in self.gpu_nic:
            best = min(range(len(self.nics)), key=lambda j: (CLOSENESS.get(row[j], 9), taken[j], j))
            taken[best] += 1
            out.append(best)
        return out


def parse_topo(text: str) -> TopoMatrix:
    """The matrix of `nvidia-smi topo -m` output."""
    lines = [ln.rstrip("\n") for ln in text.splitlines()]
    head = next((ln for ln in lines if "GPU0" in ln and ln.lstrip().startswith("GPU0")), None)
    if head is None:
        raise ValueError("no 'GPU0 GPU1 ...' header in this nvidia-smi topo -m output")
    cols = [c.strip() for c in head.split("\t") if c.strip()]
    cols = [c for c in cols if not c.endswith("Affinity") and c != "GPU NUMA ID"]
    legend = dict(re.findall(r"^\s*(NIC\d+):\s*(\S+)", text, re.M))
    gpu_cols = [i for i, c in enumerate(cols) if re.fullmatch(r"GPU\d+", c)]
    nic_cols = [i for i, c in enumerate(cols) if i not in gpu_cols]
    rows: dict[str, list[str]] = {}
    for ln in lines:
        cells = [c.strip() for c in ln.split("\t")]
        if cells and cells[0] in cols and len(cells) > len(cols):
            rows[cells[0]] = cells[1:len(cols) + 1]
    gpus = [cols[i] for i in gpu_cols]
    missing = [g for g in gpus if g not in rows]
    if missing:
        raise ValueError(f"nvidia-smi topo -m output lacks the rows of {missing}")

    def links(cell: str) -> int:
        m = re.fullmatch(r"NV(\d+)", cell)
        return int(m.group(1)) if m else 0

    return TopoMatrix(len(gpus), [legend.get(cols[i], cols[i]) for i in nic_cols],
                      [[links(rows[g][j]) for j in gpu_cols] for g in gpus],
                      [[rows[g][j] for j in nic_cols] for g in gpus])


def run_topo() -> str | None:
    """`nvidia-smi topo -m` on this machine, or None where it cannot run."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        done = subprocess.run([exe, "topo", "-m"], capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None
