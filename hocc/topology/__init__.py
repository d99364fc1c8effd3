"""Topology model: ranks, hosts, switches and the links between them (no torch)."""

from hocc.topology.links import TIERS, Link, LinkModel, parse_duration, parse_rate
from hocc.topology.model import FABRICS, HostInfo, Topology, from_hostnames, from_sizes, uniform, with_nics
from hocc.topology.spec import load_file, parse_links, parse_spec, save_file

__all__ = [
    "FABRICS", "TIERS", "HostInfo", "Link", "LinkModel", "Topology", "from_hostnames", "from_sizes",
    "load_file", "parse_duration", "parse_links", "parse_rate", "parse_spec", "save_file", "uniform",
    "with_nics",
]
