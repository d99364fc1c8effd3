"""Link tiers and rate parsing: what a byte costs on each level of the hierarchy."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

TIERS = ("host", "nic", "trunk")
"""Tier names, fastest first: ranks on one host, hosts under one switch, across switches."""


@dataclass(frozen=True)
class Link:
    """One tier's alpha-beta parameters.

    bandwidth: bytes/s one flow gets on an otherwise idle link of this tier.
    latency: seconds per message (the alpha term), software overhead included.
    burst: bytes a link passes at once before its rate applies (a shaper's
    token bucket, as tc's tbf has): a call whose bytes on the link fit it pays
    no bandwidth time there, a larger one pays only for what is beyond it.
    It refills while the link is idle, so it prices calls with gaps between
    them (a training step's, a barrier's); 0 for a link that has none.
    """

    bandwidth: float
    latency: float
    burst: float = 0.0

    def to_dict(self) -> dict[str, float]:
        return {"bandwidth": self.bandwidth, "latency": self.latency, "burst": self.burst}


@dataclass(frozen=True)
class LinkModel:
    """Per-tier links. Defaults match the CPU testbed (docs/testbed.md): a host's ranks
    share loopback, 200 Mbit/s host NICs, a trunk oversubscribed 4:1 relative to the
    NICs below it. Latencies are what one hop costs there with 8 ranks on 2 cores,
    not the wire's, fitted by `hocc calibrate` to the sweeps of 2026-12-05 over UCX
    (docs/cost-model.md, "CostParams"): a hop between hosts 40 us on top of the
    host stages, one inside a host (gloo's loopback, which only native steps use
    there) 130 us; loopback carries about 10 Gbit/s. A trunk hop costs what a
    NIC's does, 40 us (the testbed's trunk is one more veth pair and bridge,
    shaped as a NIC is): the 660 us fitted then came from calls of 64 KiB and
    up, where it never decided a pick, and priced the leaders' 32 B all_reduce on
    the emulated 2x2x2 at 1.4 ms against 0.15 ms measured; at 40 us the model's
    small-call picks there are the fastest at 18 of 18 sizes and ops
    (bench/results/model-picks.md, with its other scenarios and sizes). The testbed shapes each NIC
    and trunk with tc's tbf and a 64 KiB bucket (hocc.bench.emulated.TBF_BURST):
    their burst, which is why a call of a few KiB costs no NIC time there."""

    host: Link = Link(bandwidth=10e9 / 8, latency=130e-6)
    nic: Link = Link(bandwidth=200e6 / 8, latency=40e-6, burst=64 * 1024)
    trunk: Link = Link(bandwidth=100e6 / 8, latency=40e-6, burst=64 * 1024)

    def tier(self, name: str) -> Link:
        if name not in TIERS:
            raise ValueError(f"unknown link tier {name!r}; expected one of {TIERS}")
        link: Link = getattr(self, name)
        return link

    def with_tier(self, name: str, link: Link) -> LinkModel:
        self.tier(name)
        return replace(self, **{name: link})

    def to_dict(self) -> dict[str, dict[str, float]]:
        return {t: self.tier(t).to_dict() for t in TIERS}

    @staticmethod
    def from_dict(d: dict[str, object]) -> LinkModel:
        model = LinkModel()
        for name, val in d.items():
            base = model.tier(name)
            if isinstance(val, dict):
                bw = val.get("bandwidth", base.bandwidth)
                lat = val.get("latency", base.latency)
                burst = val.get("burst", base.burst)  # what a file leaves out is the default's, as in a spec
                link = Link(parse_rate(bw), parse_duration(lat),
                            float(burst) if isinstance(burst, (int, float)) else float(parse_size(burst)))
            else:
                link = replace(base, bandwidth=parse_rate(val))
            model = model.with_tier(name, link)
        return model


_RATE = re.compile(r"^\s*([0-9.]+(?:e[+-]?\d+)?)\s*([kmgt]?)(bit|bytes|byte|b)?(?:/s)?\s*$", re.I)
_SCALE = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}


def parse_rate(value: object) -> float:
    """A rate in bytes/s. Numbers are bytes/s; strings take units as tc and
    nccl-tests users write them: '200mbit', '1gbit', '25GB', '3.2e9'."""
    if isinstance(value, (int, float)):
        if value <= 0:
            raise ValueError(f"rate must be positive, got {value}")
        return float(value)
    m = _RATE.match(str(value))
    if not m:
        raise ValueError(f"cannot parse rate {value!r}; write e.g. '200mbit', '1gbit' or '25GB' (bytes/s)")
    num, scale, unit = float(m.group(1)), _SCALE[m.group(2).lower()], (m.group(3) or "B")
    bits = unit.lower() == "bit" or unit == "b"
    rate = num * scale / (8 if bits else 1)
    if rate <= 0:
        raise ValueError(f"rate must be positive, got {value!r}")
    return rate


_SIZE = re.compile(r"^\s*(\d+)\s*([kmgt]?)(?:i?b)?\s*$", re.I)
_SIZE_SCALE = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(value: str | int) -> int:
    """Bytes; strings take nccl-tests' and tc's suffixes, powers of 1024: '64K', '64kb', '1M', '2GiB'."""
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"size must not be negative, got {value}")
        return value
    m = _SIZE.match(str(value))
    if not m:
        raise ValueError(f"cannot parse size {value!r}; write bytes with an optional K, M or G suffix, e.g. 64K")
    return int(m.group(1)) * _SIZE_SCALE[m.group(2).lower()]


_DUR = re.compile(r"^\s*([0-9.]+(?:e[+-]?\d+)?)\s*(s|ms|us|ns)?\s*$", re.I)
_DUR_SCALE = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}


def parse_duration(value: object) -> float:
    """A duration in seconds; strings may say '5us', '1.5ms'."""
    if isinstance(value, (int, float)):
        return float(value)
    m = _DUR.match(str(value))
    if not m:
        raise ValueError(f"cannot parse duration {value!r}; write e.g. '20us' or '0.5ms'")
    return float(m.group(1)) * _DUR_SCALE[(m.group(2) or "s").lower()]


def format_rate(rate: float) -> str:
    """A rate (bytes/s) as specs write it ('400gbit', '450GB'), in a form
    parse_rate reads back exactly (else the plain number)."""
    bits = rate * 8
    units = [(u, d * 8) for u, d in (("GB", 1e9), ("MB", 1e6))] if rate >= 1e11 else []  # NVLink-class: GB
    units += [("tbit", 1e12), ("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3)]
    for unit, div in units:
        text = f"{round(bits / div, 3):g}{unit}"
        if bits >= div and parse_rate(text) == rate:
            return text
    return repr(float(rate))


def format_duration(seconds: float) -> str:
    """A duration as specs write it ('8us'), read back exactly by parse_duration."""
    for unit, div in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6), ("ns", 1e-9)):
        text = f"{round(seconds / div, 3):g}{unit}"
        if seconds >= div and parse_duration(text) == seconds:
            return text
    return repr(float(seconds))
