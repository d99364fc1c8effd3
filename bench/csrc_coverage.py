"""Line coverage of csrc/ from a gcov-instrumented build of hocc._C (`make coverage`).

    python bench/csrc_coverage.py BUILD_DIR [--root REPO] [--device-layer FILE...] [--json OUT] [--markdown OUT]

BUILD_DIR holds the .gcno files of a `--coverage` build (the objects' directory, `--build-temp`) and the
.gcda counts that the instrumented library wrote beside them when processes using it ended. gcov reads
each object's pair (`gcov --json-format --stdout` where this gcc has it; its .gcov.json.gz files, or else
its text .gcov files, on older ones) and this prints, for every file under REPO/csrc/ that has executable
lines in some object, the lines executable, executed, the percentage and the lines never executed (as
ranges); then a total, and a total without the "device layer" files (default: csrc/device/ files other
than cpu_device.cc), which a CPU-only run cannot execute. A header counts where some object emitted code
from it (an inline function no object uses has no executable lines); a line is executed if any object's
copy of it ran. Source files (.cc, .cu) under csrc/ without a .gcno in BUILD_DIR (not compiled in that
build, or compiled by nvcc, which gcov does not instrument) are listed apart. Only files under csrc/
count: torch's, pybind11's and the standard library's headers do not.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SOURCE_SUFFIXES = (".cc", ".cpp", ".cxx", ".c", ".cu")
HEADER_SUFFIXES = (".h", ".hh", ".hpp", ".cuh")
GCOV_TEXT_LINE = re.compile(r"^\s*([^:]+):\s*(\d+):(.*)$")


@dataclass
class FileCoverage:
    """Per line of one source file: the largest count any object gave it (0: never executed)."""

    path: str  # relative to the repository root, "csrc/..."
    counts: dict[int, int] = field(default_factory=dict)

    def add(self, line: int, count: int) -> None:
        self.counts[line] = max(self.counts.get(line, 0), count)

    @property
    def executable(self) -> int:
        return len(self.counts)

    @property
    def executed(self) -> int:
        return sum(1 for c in self.counts.values() if c > 0)

    @property
    def missed(self) -> list[int]:
        return sorted(n for n, c in self.counts.items() if c == 0)


def percent(executed: int, executable: int) -> float | None:
    return round(100.0 * executed / executable, 1) if executable else None


def ranges(lines: Iterable[int]) -> str:
    """[3, 4, 5, 9, 11, 12] -> '3-5, 9, 11-12'."""
    out: list[str] = []
    run: list[int] = []
    for n in sorted(lines):
        if run and n == run[-1] + 1:
            run.append(n)
            continue
        if run:
            out.append(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}")
        run = [n]
    if run:
        out.append(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}")
    return ", ".join(out)


def gcov_features(gcov: str) -> tuple[bool, bool, str]:
    """(has --json-format, has --stdout, version line) of this gcov."""
    help_text = subprocess.run([gcov, "--help"], capture_output=True, text=True, check=False).stdout
    version = subprocess.run([gcov, "--version"], capture_output=True, text=True, check=False).stdout
    return "--json-format" in help_text, "--stdout" in help_text, (version.splitlines() or ["?"])[0]


def json_docs(text: str) -> Iterator[dict[str, Any]]:
    """The JSON documents of gcov's stdout: one per object, one per line (or concatenated)."""
    decoder = json.JSONDecoder()
    pos = 0
    while True:
        while pos < len(text) and text[pos].isspace():
            pos += 1
        if pos >= len(text):
            return
        doc, pos = decoder.raw_decode(text, pos)
        yield doc


def lines_from_json(doc: dict[str, Any]) -> Iterator[tuple[str, int, int]]:
    """(absolute source path, line number, count) for every line of a gcov JSON document."""
    cwd = str(doc.get("current_working_directory", ""))
    for f in doc.get("files", []):
        path = os.path.normpath(os.path.join(cwd, str(f["file"])))
        for ln in f.get("lines", []):
            yield path, int(ln["line_number"]), int(ln["count"])


def lines_from_text(gcov_file: Path, cwd: str) -> Iterator[tuple[str, int, int]]:
    """The same from a text .gcov file ('count:line:source'; '-' not executable, '#####' or '=====' never run)."""
    source = ""
    for raw in gcov_file.read_text(errors="replace").splitlines():
        m = GCOV_TEXT_LINE.match(raw)
        if not m:
            continue
        count, number, rest = m.group(1).strip(), int(m.group(2)), m.group(3)
        if number == 0:
            if rest.startswith("Source:"):
                source = os.path.normpath(os.path.join(cwd, rest[len("Source:"):]))
            continue
        if count == "-" or not source:
            continue
        if count.startswith(("#####", "=====")):
            yield source, number, 0
        else:
            digits = re.match(r"\d+", count.replace("*", ""))
            if digits:
                yield source, number, int(digits.group(0))


def run_gcov(gcov: str, notes: Path, mode: str) -> Iterator[tuple[str, int, int]]:
    """The lines gcov reports for one object (its .gcno, and the .gcda beside it if any process wrote one)."""
    if mode == "json-stdout":
        done = subprocess.run([gcov, "--json-format", "--stdout", str(notes)], capture_output=True, text=True,
                              check=False)
        if done.returncode != 0:
            raise SystemExit(f"gcov failed on {notes}: {done.stderr.strip()[-2000:]}")
        for doc in json_docs(done.stdout):
            yield from lines_from_json(doc)
        return
    with tempfile.TemporaryDirectory(prefix="csrc-coverage-") as tmp:
        args = [gcov, "--json-format"] if mode == "json-files" else [gcov, "--preserve-paths"]
        done = subprocess.run([*args, "--object-directory", str(notes.parent), str(notes)], cwd=tmp,
                              capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise SystemExit(f"gcov failed on {notes}: {done.stderr.strip()[-2000:]}")
        if mode == "json-files":
            for out in sorted(Path(tmp).glob("*.gcov.json.gz")):
                with gzip.open(out, "rt") as fh:
                    yield from lines_from_json(json.load(fh))
        else:
            for out in sorted(Path(tmp).glob("*.gcov")):
                yield from lines_from_text(out, str(notes.parent))


def collect(build_dir: Path, root: Path, gcov: str, mode: str) -> dict[str, FileCoverage]:
    """Coverage of every file under root/csrc/ that some object in build_dir has lines of."""
    csrc = root.resolve() / "csrc"
    files: dict[str, FileCoverage] = {}
    notes = sorted(build_dir.rglob("*.gcno"))
    if not notes:
        raise SystemExit(f"no .gcno files under {build_dir}: not a --coverage build directory")
    resolved: dict[str, Path | None] = {}
    for gcno in notes:
        for path, line, count in run_gcov(gcov, gcno, mode):
            if path not in resolved:
                real = Path(os.path.realpath(path))
                resolved[path] = real.relative_to(csrc.parent) if real.is_relative_to(csrc) else None
            rel = resolved[path]
            if rel is None:
                continue
            key = rel.as_posix()
            files.setdefault(key, FileCoverage(key)).add(line, count)
    return {k: v for k, v in sorted(files.items()) if v.executable > 0}


def csrc_files(root: Path) -> list[str]:
    csrc = root.resolve() / "csrc"
    return sorted(p.relative_to(csrc.parent).as_posix() for p in csrc.rglob("*")
                  if p.is_file() and p.suffix in SOURCE_SUFFIXES + HEADER_SUFFIXES)


def default_device_layer(root: Path) -> list[str]:
    return [f for f in csrc_files(root) if f.startswith("csrc/device/") and Path(f).name != "cpu_device.cc"]


def total(rows: Sequence[FileCoverage]) -> dict[str, Any]:
    executable = sum(r.executable for r in rows)
    executed = sum(r.executed for r in rows)
    return {"files": len(rows), "executable": executable, "executed": executed,
            "percent": percent(executed, executable)}


def report(files: dict[str, FileCoverage], root: Path, device_layer: Sequence[str], build_dir: Path,
           gcov_version: str, mode: str, note: str = "") -> dict[str, Any]:
    device = {Path(d).as_posix().removeprefix("./") for d in device_layer}
    rows = list(files.values())
    built_sources = {f for f in files if f.endswith(SOURCE_SUFFIXES)}
    objects_of = {g.relative_to(build_dir).with_suffix("").as_posix() for g in build_dir.rglob("*.gcno")}
    no_data = [f for f in csrc_files(root) if f.endswith(SOURCE_SUFFIXES) and f not in built_sources
                 and f.removesuffix(Path(f).suffix) not in objects_of]
    return {
        "note": note,
        "root": str(root.resolve()),
        "build_dir": str(build_dir.resolve()),
        "gcov": gcov_version,
        "gcov_mode": mode,
        "device_layer": sorted(device),
        "files": [{"file": r.path, "executable": r.executable, "executed": r.executed,
                   "percent": percent(r.executed, r.executable), "device_layer": r.path in device,
                   "missed": ranges(r.missed), "missed_lines": r.missed} for r in rows],
        "no_data": no_data,
        "total": total(rows),
        "total_excluding_device_layer": total([r for r in rows if r.path not in device]),
    }


def fmt_pct(p: float | None) -> str:
    return "-" if p is None else f"{p:.1f}%"


def text_table(rep: dict[str, Any]) -> str:
    rows = [(f["file"] + (" [device]" if f["device_layer"] else ""), str(f["executable"]), str(f["executed"]),
             fmt_pct(f["percent"]), f["missed"]) for f in rep["files"]]
    for name, key in (("TOTAL", "total"), ("TOTAL excluding device layer", "total_excluding_device_layer")):
        t = rep[key]
        rows.append((name, str(t["executable"]), str(t["executed"]), fmt_pct(t["percent"]), ""))
    head = ("file", "executable", "executed", "percent", "never executed")
    width = [max(len(r[i]) for r in [head, *rows]) for i in range(4)]
    out = []
    rule = "-" * (sum(width) + 3 * 2)
    for i, r in enumerate([head, *rows]):
        if i in (1, len(rows) - 1):
            out.append(rule)
        cells = [r[0].ljust(width[0]), *(c.rjust(w) for c, w in zip(r[1:4], width[1:], strict=True))]
        out.append("  ".join(cells) + ("  " + r[4] if r[4] else ""))
    if rep["no_data"]:
        out.append("no coverage data (no .gcno: not compiled, or compiled by nvcc): " + ", ".join(rep["no_data"]))
    out.append("device layer: " + (", ".join(rep["device_layer"]) or "none"))
    return "\n".join(out) + "\n"


def markdown_table(rep: dict[str, Any]) -> str:
    out = ["# Line coverage of csrc/", "", *([rep["note"], ""] if rep["note"] else []),
           f"From `bench/csrc_coverage.py` over `{rep['build_dir']}` ({rep['gcov']}, {rep['gcov_mode']}). "
           "A line is executable where the compiler emitted code for it; headers count where some object "
           "emitted code from them. Device-layer files are marked *(device)*.", "",
           "| file | executable | executed | % | never executed |", "|---|---:|---:|---:|---|"]
    for f in rep["files"]:
        name = f"`{f['file']}`" + (" *(device)*" if f["device_layer"] else "")
        out.append(f"| {name} | {f['executable']} | {f['executed']} | {fmt_pct(f['percent'])} | {f['missed']} |")
    for name, key in (("**total**", "total"), ("**total excluding device layer**", "total_excluding_device_layer")):
        t = rep[key]
        out.append(f"| {name} | {t['executable']} | {t['executed']} | {fmt_pct(t['percent'])} | |")
    out.append("")
    if rep["no_data"]:
        out.append("No coverage data (no .gcno: not compiled in this build, or compiled by nvcc): "
                   + ", ".join(f"`{f}`" for f in rep["no_data"]) + ".")
    out.append("Device layer: " + (", ".join(f"`{f}`" for f in rep["device_layer"]) or "none") + ".")
    return "\n".join(out) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("build_dir", type=Path, help="directory of the --coverage build's objects (.gcno, .gcda)")
    ap.add_argument("--root", type=Path, default=Path.cwd(), help="repository root holding csrc/ (default: .)")
    ap.add_argument("--device-layer", nargs="*", metavar="FILE", default=None,
                    help="files (csrc/...) left out of the second total (default: csrc/device/* but cpu_device.cc)")
    ap.add_argument("--json", type=Path, metavar="OUT", help="write the report as JSON")
    ap.add_argument("--markdown", type=Path, metavar="OUT", help="write the table as Markdown")
    ap.add_argument("--note", default="", help="a paragraph for the Markdown (and JSON): what was run, where")
    ap.add_argument("--gcov", default=os.environ.get("GCOV", "gcov"), help="gcov to run (default: $GCOV or gcov)")
    args = ap.parse_args(argv)
    if not (args.root / "csrc").is_dir():
        ap.error(f"{args.root}/csrc is not a directory (pass --root)")
    has_json, has_stdout, version = gcov_features(args.gcov)
    mode = "json-stdout" if has_json and has_stdout else "json-files" if has_json else "text"
    files = collect(args.build_dir, args.root, args.gcov, mode)
    device = args.device_layer if args.device_layer is not None else default_device_layer(args.root)
    rep = report(files, args.root, device, args.build_dir, version, mode, args.note)
    sys.stdout.write(text_table(rep))
    for out, text in ((args.json, json.dumps(rep, indent=1) + "\n"), (args.markdown, markdown_table(rep))):
        if out is not None:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
