"""Topology detection on fixtures (tests/fixtures): a DGX-H100-like /sys and
/proc tree (make_dgx_sysfs.py), `nvidia-smi topo -m` outputs, an NCCL topology
dump; and the Topology built from the ranks' host reports, with its one-line
fallback message."""

from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from hocc.tools.cli import main
from hocc.topology import parse_spec
from hocc.topology.detect import cuda, detect_local, from_host_reports, host_report, nccl_xml, nvml, nvsmi, pci, sysfs

FIX = Path(__file__).parent / "fixtures"
SYS = FIX / "dgx_h100_sys"
TOPO = (FIX / "nvidia_smi_topo_dgx_h100.txt").read_text()


def test_sysfs_rdma_ports() -> None:
    nics = sysfs.detect_nics(SYS)
    assert [n["name"] for n in nics] == [f"mlx5_{i}" for i in range(8)]  # mlx5_8 is down
    assert {n["rate"] for n in nics} == {400e9 / 8} and {n["kind"] for n in nics} == {"ib"}
    assert nics[3]["pci"] == "0000:54:00.0"
    # the IPoIB netdevs belong to those ports: only the management NIC is plain Ethernet
    eth = sysfs.ethernet_nics(SYS, sysfs.rdma_pcis(SYS))
    assert [(n["name"], n["rate"]) for n in eth] == [("eno1", 10e9 / 8)]


def test_sysfs_ethernet_without_rdma(tmp_path: Path) -> None:
    root = tmp_path / "sys_copy"
    shutil.copytree(SYS, root, symlinks=True)
    shutil.rmtree(root / "sys" / "class" / "infiniband")
    nics = sysfs.detect_nics(root)  # RoCE-less Ethernet box: every physical interface that is up
    assert len(nics) == 9 and {n["kind"] for n in nics} == {"eth"}
    assert "docker0" not in {n["name"] for n in nics}  # virtual: no PCI device
    assert sorted({n["rate"] for n in nics}) == [10e9 / 8, 400e9 / 8]


def test_gpus_from_procfs() -> None:
    gpus = cuda.procfs_gpus(SYS, env={})
    assert gpus is not None and len(gpus) == 8 and gpus == sorted(gpus) and gpus[0] == "0000:03:00.0"
    assert cuda.procfs_gpus(SYS, env={"CUDA_VISIBLE_DEVICES": "3,1"}) == [gpus[3], gpus[1]]
    assert cuda.procfs_gpus(FIX / "nowhere", env={}) is None
    assert cuda.detect_gpus(SYS, env={}) == (gpus, "procfs")


def test_pci_affinity() -> None:
    gpus = cuda.procfs_gpus(SYS, env={})
    assert gpus is not None
    nics = [n["pci"] for n in sysfs.detect_nics(SYS)]
    assert pci.nearest_nics(gpus, nics, SYS) == list(range(8))  # GPU i shares a PCIe switch with mlx5_i
    # two NICs on the first root complex only: GPUs 0/1 take their switch's NIC, the others share evenly
    near = pci.nearest_nics(gpus, [nics[0], nics[1]], SYS)
    assert near is not None and near[:2] == [0, 1] and sorted(near[2:]) == [0, 0, 0, 1, 1, 1]
    assert pci.nearest_nics(gpus, ["0000:ff:00.0"], SYS) is None  # a NIC whose path is not there


def test_nvidia_smi_topo() -> None:
    m = nvsmi.parse_topo(TOPO)
    assert m.gpus == 8 and m.nvswitch and m.nics == [f"mlx5_{i}" for i in range(9)]
    assert m.nearest_nics() == list(range(8))
    box = nvsmi.parse_topo((FIX / "nvidia_smi_topo_pcie4.txt").read_text())
    assert box.gpus == 4 and not box.nvswitch and box.nics == ["mlx5_0"] and box.nearest_nics() == [0, 0, 0, 0]
    with pytest.raises(ValueError, match="GPU0"):
        nvsmi.parse_topo("no matrix here")


def test_nccl_topology_dump(tmp_path: Path) -> None:
    seen = nccl_xml.read_dump(FIX / "nccl_topo_dgx_h100.xml")
    assert len(seen["gpus"]) == 8 and seen["nvswitch"] and seen["gpu_nic"] == list(range(8))
    assert [n["name"] for n in seen["nics"]] == [f"mlx5_{i}" for i in range(8)]
    assert {n["rate"] for n in seen["nics"]} == {400e9 / 8} and seen["nvlinks"] == [18] * 8
    bad = tmp_path / "bad.xml"
    bad.write_text("<graphs></graphs>")
    with pytest.raises(ValueError, match="<system>"):
        nccl_xml.read_dump(bad)


class _FakeNvml:
    """NVML's calls as pynvml names them, for two GPUs whose links all end at NVSwitches."""

    NVML_FEATURE_ENABLED = 1
    NVML_NVLINK_DEVICE_TYPE_SWITCH = 2

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetPciInfo(self, h: int) -> SimpleNamespace:
        return SimpleNamespace(busId=f"00000000:{0x19 + h:02x}:00.0".encode())

    def nvmlDeviceGetNvLinkState(self, h: int, link: int) -> int:
        if link >= 18:
            raise RuntimeError("NVML_ERROR_INVALID_ARGUMENT")
        return 1

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, h: int, link: int) -> int:
        return 2


def test_nvml() -> None:
    fabric = nvml.nvlink_fabric(_FakeNvml())
    assert fabric == {"gpus": ["0000:19:00.0", "0000:1a:00.0"], "links": [18, 18], "nvswitch": True}
    if nvml.load() is None:  # nvidia-ml-py is optional: without it (or a driver) the detector says so
        assert nvml.nvlink_fabric() is None


def test_detect_local_on_the_fixture() -> None:
    rep = detect_local(SYS, topo_text=TOPO, hostname="dgx0", env={})
    assert rep["unseen"] == [] and rep["nvswitch"] and rep["gpu_nic"] == list(range(8))
    assert rep["sources"] == {"gpus": "procfs", "nics": "sysfs", "nvlink": "nvidia-smi", "affinity": "pci"}
    blind = detect_local(SYS, hostname="dgx0", env={})  # no nvidia-smi output: NVLink unseen
    assert blind["unseen"] == ["NVLink"] and blind["nvswitch"] is None
    dumped = detect_local(FIX / "nowhere", nccl_dump=FIX / "nccl_topo_dgx_h100.xml", hostname="x", env={})
    assert dumped["sources"]["nics"] == "nccl-xml" and dumped["unseen"] == []


def test_affinity_from_nvidia_smi_when_pci_paths_are_unseen(tmp_path: Path) -> None:
    root = tmp_path / "no_proc"
    shutil.copytree(SYS, root, symlinks=True)
    shutil.rmtree(root / "proc")
    rep = detect_local(root, topo_text=TOPO, hostname="h", env={})
    assert rep["sources"]["gpus"] == "nvidia-smi" and rep["sources"]["affinity"] == "nvidia-smi"
    assert rep["gpu_nic"] == list(range(8)) and rep["unseen"] == []


def test_topology_from_host_reports() -> None:
    rep = detect_local(SYS, topo_text=TOPO, hostname="dgx0", env={})
    names = ["dgx0"] * 8 + ["dgx1"] * 8
    devices = [7 - i for i in range(8)] + list(range(8))  # host dgx0's ranks use the GPUs in reverse
    reports = [dict(rep, hostname=h, device=d) for h, d in zip(names, devices, strict=True)]
    lines: list[str] = []
    topo = from_host_reports(names, reports, warn=lines.append)
    assert lines == []
    assert [topo.nic_of(r) for r in range(16)] == devices
    h0 = topo.host_infos()[0]
    assert h0.nics == 8 and h0.fabric == "nvswitch" and h0.nic_names[0] == "mlx5_0"
    assert topo.links.nic.bandwidth == pytest.approx(50e9)
    # a host that saw nothing: grouped by hostname, one NIC, and ONE line says what was not seen
    blind = from_host_reports(names, reports[:8] + [None] * 8, warn=lines.append)
    assert len(lines) == 1 and "anything" in lines[0] and "dgx1" in lines[0]
    assert blind.host_infos()[1].nics == 1 and blind.host_infos()[1].fabric == "shared"
    assert blind.links.nic.bandwidth != pytest.approx(50e9)  # not every host knows its rate
    # each rank sees only its own GPU (CUDA_VISIBLE_DEVICES=i): its report says which NIC is nearest it
    own = [detect_local(SYS, topo_text=TOPO, hostname="dgx0", env={"CUDA_VISIBLE_DEVICES": str(i)}, device=0)
           for i in range(8)]
    assert all(len(r["gpus"]) == 1 for r in own)
    alone = from_host_reports(["dgx0"] * 8, own, warn=lines.append)
    assert [alone.nic_of(r) for r in range(8)] == list(range(8)) and len(lines) == 1
    with pytest.raises(ValueError, match="one of each per rank"):
        from_host_reports(names, reports[:3])


def test_hocc_topo(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "job.json"
    smi = FIX / "nvidia_smi_topo_dgx_h100.txt"
    assert main(["topo", "--root", str(SYS), "--nvidia-smi-topo", str(smi), "--hosts", "4", "-o", str(out),
                 "--no-nvml"]) == 0
    text = capsys.readouterr().out
    spec = next(ln for ln in text.splitlines() if ln.startswith("spec: ")).removeprefix("spec: ")
    assert spec.startswith("4x8@nics=8,fabric=nvswitch") and "nic=400gbit" in spec
    assert parse_spec(str(out)).host_infos()[0].nic_names[7] == "mlx5_7"
    assert parse_spec(spec).to_dict()["links"] == parse_spec(str(out)).to_dict()["links"]


def test_this_machine_once_per_process() -> None:
    """On the real machine (no GPU here): a report all the same, JSON-able, made once."""
    a, b = host_report(3), host_report(None)
    assert a["device"] == 3 and b["device"] is None and {**a, "device": None} == b
    a["nics"].append("changed")
    assert host_report()["nics"] != a["nics"]  # each call a fresh copy
    names = [a["hostname"]] * 2
    assert from_host_reports(names, [host_report(0), host_report(1)], warn=lambda _: None).world_size == 2
