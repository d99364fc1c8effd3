"""The tuning file (HOCC_TUNING_FILE): auto's measured choices, kept between
jobs. JSON, one entry per key (the group's topology, device and planner
settings: hocc.engine.tuning makes it), each with its picks per
'collective/dtype/bucket' and the cost model fitted to the measurements:

    {"hocc-tuning": 1, "entries": {"cpu 2x4 ...": {"picks": {"all_reduce/float32/12":
        {"algo": "ho_ring", "chunks": 4, "why": "measured: ..."}}, "fit": {...}}}}

Every rank of a group must read the same file: ranks that picked
differently are caught by the call check, which raises on all of them.
Writes merge into what is there (other groups' and jobs' entries stay), under
a lock, through a rename, so a reader never sees half a file."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hocc.plan.crossover import Pick

VERSION = 1


class TuningFile:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._doc = self._read()

    def _read(self) -> dict[str, Any]:
        try:
            doc = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {"hocc-tuning": VERSION, "entries": {}}
        except (OSError, ValueError) as e:
            raise ValueError(f"HOCC_TUNING_FILE {self.path}: cannot read it ({e}); fix or remove it") from e
        if not isinstance(doc, dict) or doc.get("hocc-tuning") != VERSION or not isinstance(doc.get("entries"), dict):
            raise ValueError(f"HOCC_TUNING_FILE {self.path}: not a hocc tuning file of version {VERSION}; "
                             "remove it (hocc tune writes a new one)")
        return doc

    def entry(self, key: str) -> dict[str, Any]:
        e: dict[str, Any] = self._doc["entries"].get(key, {})
        return e

    def picks(self, key: str) -> dict[tuple[str, str, int], Pick]:
        out: dict[tuple[str, str, int], Pick] = {}
        for name, p in self.entry(key).get("picks", {}).items():
            collective, dtype, bucket = name.split("/")
            out[(collective, dtype, int(bucket))] = Pick(p["algo"], p.get("chunks"), p.get("why", "tuning file"))
        return out

    def fit(self, key: str) -> dict[str, Any] | None:
        f: dict[str, Any] | None = self.entry(key).get("fit")
        return f

    def save(self, key: str, picks: dict[str, Pick], fit: dict[str, Any] | None) -> None:
        """Merge this key's picks (and fit, if any) into the file on disk."""
        with self._locked():
            doc = self._read()
            e = doc["entries"].setdefault(key, {})
            e["picks"] = {name: {"algo": p.algo, "chunks": p.chunks, "why": p.why} for name, p in sorted(picks.items())}
            if fit is not None:
                e["fit"] = fit
            tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(doc, indent=1, sort_keys=True))
            tmp.replace(self.path)
            self._doc = doc

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_name(f".{self.path.name}.lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)
