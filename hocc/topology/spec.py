"""HOCC_TOPOLOGY specs: compact strings or a JSON/YAML file.

Compact forms (hosts and switches numbered in order):
  8             one host of 8 ranks
  2x4           2 hosts x 4 ranks, numbered host by host
  2x4:scattered rank r on host r mod 2
  2x2x2         2 switches x 2 hosts x 2 ranks
  3+5           hosts of unequal size under one switch
Any form may end with '@' and link settings, e.g. '2x4@nic=1gbit,host=20gbit'
(rates as tc writes them; 'nic_latency=50us' sets a latency), and host
settings: 'nics=8' NICs per host (ranks split over them in blocks: one per
GPU when nics equals the ranks per host; 'nic' is then each NIC's rate) and
'fabric=nvswitch' (each rank its own host-tier link, as NVLink into an
NVSwitch; default 'shared', one link all of a host's ranks share), e.g. a DGX
H100 cluster: '4x8@nics=8,fabric=nvswitch,nic=400gbit,host=450GB'.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from typing import Any

from hocc.topology.links import (
    TIERS,
    LinkModel,
    format_duration,
    format_rate,
    parse_duration,
    parse_rate,
    parse_size,
)
from hocc.topology.model import FABRICS, Topology, from_sizes, uniform, with_nics

HOST_KEYS = ("nics", "fabric")


def split_host_settings(text: str) -> tuple[str, dict[str, str]]:
    """The link settings of an '@' suffix, and its host settings (nics=, fabric=)."""
    links, host = [], {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        key, _, val = (s.strip() for s in item.partition("="))
        if key in HOST_KEYS:
            host[key] = val
        else:
            links.append(item)
    return ",".join(links), host


def apply_host_settings(topo: Topology, host: dict[str, str]) -> Topology:
    if not host:
        return topo
    nics = None
    if "nics" in host:
        try:
            nics = int(host["nics"])
        except ValueError:
            raise ValueError(f"nics={host['nics']!r}: give the NICs per host as a number, e.g. nics=8") from None
        if nics < 1:
            raise ValueError(f"nics={nics}: a host needs at least one NIC")
    fabric = host.get("fabric")
    if fabric is not None and fabric not in FABRICS:
        raise ValueError(f"fabric={fabric!r}: use one of {FABRICS}")
    return with_nics(topo, nics, fabric)


def parse_links(text: str, base: LinkModel | None = None) -> LinkModel:
    model = base or LinkModel()
    for item in filter(None, (p.strip() for p in text.split(","))):
        if "=" not in item:
            raise ValueError(f"link setting {item!r} needs the form tier=rate, e.g. nic=200mbit")
        key, val = (s.strip() for s in item.split("=", 1))
        tier, _, what = key.partition("_")
        if tier not in TIERS or what not in ("", "latency", "bandwidth", "burst"):
            raise ValueError(f"unknown link setting {key!r}; use one of {TIERS}, optionally with _latency or _burst")
        old = model.tier(tier)
        if what == "latency":
            link = replace(old, latency=parse_duration(val))
        elif what == "burst":
            link = replace(old, burst=float(parse_size(val)))
        else:
            link = replace(old, bandwidth=parse_rate(val))
        model = model.with_tier(tier, link)
    return model


def parse_spec(spec: str, links: LinkModel | None = None) -> Topology:
    """A topology from a compact spec or the path of a .json/.yaml/.yml file."""
    spec = spec.strip()
    if not spec:
        raise ValueError("empty topology spec; write e.g. '2x4', '2x4:scattered', '2x2x2', '3+5' or a file path")
    if spec.endswith((".json", ".yaml", ".yml")) or os.path.sep in spec:
        return load_file(spec)
    shape, _, link_text = spec.partition("@")
    link_text, host = split_host_settings(link_text)
    model = parse_links(link_text, links)
    return apply_host_settings(_parse_shape(spec, shape, model), host)


def _parse_shape(spec: str, shape: str, model: LinkModel) -> Topology:
    shape, _, placement = shape.partition(":")
    placement = placement or "block"
    try:
        if "+" in shape:
            if placement != "block":
                raise ValueError("unequal hosts ('3+5') take no placement suffix")
            return from_sizes([int(p) for p in shape.split("+")], model)
        dims = [int(p) for p in shape.split("x")]
    except ValueError as e:
        if "placement" in str(e):
            raise
        raise ValueError(f"cannot parse topology spec {spec!r}; write e.g. '2x4', '2x4:scattered', "
                         "'2x2x2', '3+5' or a .json/.yaml file path") from None
    if any(d < 1 for d in dims):
        raise ValueError(f"topology spec {spec!r} has a zero or negative size")
    if len(dims) == 1:
        return uniform(1, dims[0], 1, placement, model)
    if len(dims) == 2:
        return uniform(dims[0], dims[1], 1, placement, model)
    if len(dims) == 3:
        return uniform(dims[0] * dims[1], dims[2], dims[0], placement, model)
    raise ValueError(f"topology spec {spec!r} has more than three levels; use a file for deeper trees")


def load_file(path: str) -> Topology:
    if not os.path.exists(path):
        raise FileNotFoundError(f"topology file {path!r} does not exist")
    with open(path) as f:
        text = f.read()
    data: Any
    if path.endswith((".yaml", ".yml")):
        try:
            import yaml
        except ImportError as e:  # pragma: no cover - pyyaml is a dependency
            raise ImportError("reading a YAML topology needs PyYAML: pip install pyyaml") from e
        data = yaml.safe_load(text)
    else:
        data = json.loads(text)
    if not isinstance(data, dict):
        raise ValueError(f"topology file {path!r} must hold a mapping with a 'hosts' list")
    return Topology.from_dict(data)


def save_file(topo: Topology, path: str) -> None:
    with open(path, "w") as f:
        f.write(topo.to_json() + "\n")


def to_spec(topo: Topology) -> str | None:
    """The compact spec of a topology whose hosts are alike (equal ranks,
    NICs in the default blocks, one fabric), with its NIC settings and
    links: what `parse_spec` reads back as the same model. None where only a
    file can say it (unequal hosts, an explicit NIC map, renamed hosts...)."""
    hosts = topo.host_infos()
    sizes = {len(h.ranks) for h in hosts}
    nics = {h.nics for h in hosts}
    fabrics = {h.fabric for h in hosts}
    if len(nics) != 1 or len(fabrics) != 1 or any(h.nic_of for h in hosts):
        return None
    shape = topo.shape()
    suffix = ""
    if len(sizes) == 1 and topo.ordered_ranks() != list(range(topo.world_size)):
        suffix = ":scattered"
    guess = parse_spec(shape + suffix)
    if [h.ranks for h in guess.host_infos()] != [h.ranks for h in hosts]:
        return None
    items = []
    if nics != {1}:
        items.append(f"nics={nics.pop()}")
    if fabrics != {"shared"}:
        items.append(f"fabric={fabrics.pop()}")
    for t in TIERS:
        link, base = topo.links.tier(t), LinkModel().tier(t)
        if link.bandwidth != base.bandwidth:
            items.append(f"{t}={format_rate(link.bandwidth)}")
        if link.latency != base.latency:
            items.append(f"{t}_latency={format_duration(link.latency)}")
        if link.burst != base.burst:
            items.append(f"{t}_burst={int(link.burst)}")
    return shape + suffix + ("@" + ",".join(items) if items else "")
