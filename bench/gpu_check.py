"""What one lent GPU can check of hocc's CUDA path (run by bench/gpu_check.sh
after it built hocc._C). CUDA tensors take the CPU path: the same C++
executor, every step a collective of torch's ProcessGroupNCCL, copies and
reductions by torch's kernels (csrc/device/torch_device.cc). This file runs
the sections; the checks themselves are in gpu_results.py, gpu_costs.py and
gpu_faults.py. Sections:

- nccl_world1: an NCCL world of one: hocc's drop-in calls (all_reduce,
  all_gather_into_tensor, reduce_scatter_tensor) x algos x dtypes x ops x
  sizes, sync and async_op, against torch.distributed's own call (every group
  of a world of one has one member, so these run the executor and the device
  layer on CUDA, no NCCL step); then the c10d comm on NCCL directly
  (hocc._C.c10d_comm's collectives: NCCL's kernels on one member), empty
  tensors included, and one comm called again and again. A world > 1 over
  NCCL cannot run on one GPU: NCCL refuses two ranks on one device.
- inproc: 8 in-process ranks on the GPU (InProcWorld), topologies 2x4 and
  3+5, native / ring / ho_ring K=1 / ho_ring K=4 with ring reduce-scatter and
  all-gather, against a float64 reference.
- device_copy: the device layer's copy (hocc._C.reduce, op "copy") against a
  device-to-device cudaMemcpy, ok at >= 90% of its bandwidth; its sum
  reductions' bandwidth; its copy/sum/min/max/product right.
- capture, cupy, async_work, absent: bench/gpu_faults.py.
- memory: what hocc holds on the GPU after 200 mixed calls (1 KiB..64 MiB)
  against the same calls through torch.distributed alone; ok under 8 MiB (a
  small work buffer kept between calls; not anything the size of a call).
- paro: PaRO-DP on an NCCL world of one, all 14 strategies (and IIG on a
  stream of the caller's own) trained 3 steps against plain training, with
  the caller's stream kept busy so that a move the worker's stream ran out
  of order shows as a wrong result (tests/paro_one_rank.py, the suite's check).

Every section runs in a process of its own under a time limit (shrunk to
what is left of --deadline), so a hang or a crash costs only its section and
its verdict says how far it got; it prints one `VERDICT <section>:
ok|FAIL|SKIP (...)` line, and the JSON summary is rewritten after each. The
absent section's 2-rank torch group (which may hang until killed) starts at
the beginning, beside the other sections, where the GPU's compute mode
allows more than one process. `--device cpu` is the dry run: gloo in
place of NCCL, InProcWorld on the CPU, NumPy in place of CuPy, CPU timings
without a bound; capture is skipped. `--only a,b` runs some sections.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import gpu_faults
import torch
from gpu_costs import check_device_copy, check_memory
from gpu_faults import (
    PG_SLACK_S,
    PG_TIMEOUT_S,
    absent_pg,
    check_arrays,
    check_async_work,
    check_capture,
    is_cuda,
    note,
    world_of_one,
)
from gpu_results import check_absent, check_inproc, check_world1


def check_paro(device: str) -> dict:
    from tests.paro_one_rank import check
    with world_of_one(device):
        return check(device, log=lambda line: print(f"paro {line}", flush=True))

# name: (seconds allowed on the GPU, on the CPU dry run (0: not run there), what it checks)
SECTIONS: dict[str, tuple[int, int, str]] = {
    "nccl_world1": (90, 300, "drop-in calls and the c10d comm on an NCCL world of one"),
    "inproc": (90, 300, "8 in-process ranks on the device against a float64 reference"),
    "device_copy": (45, 120, "the device layer's copy against cudaMemcpy, its reductions"),
    "capture": (30, 0, "a hocc call in torch.cuda.graph is refused, the stream stays usable"),
    "cupy": (30, 60, "CuPy arrays through the drop-in calls on CuPy's stream"),
    "async_work": (30, 60, "async Work ordering on CUDA streams"),
    "absent": (30, 60, "a rank that never comes: in-process, and a 2-rank torch group"),
    "memory": (60, 180, "what hocc holds on the GPU after 200 calls, against torch alone"),
    "paro": (60, 120, "PaRO-DP, every strategy on one rank against plain training (CUDA stream ordering)"),
}
ABSENT_PG_LIMIT_S = PG_TIMEOUT_S + PG_SLACK_S + 5  # a 2-rank group's rank 0 is killed after this



CHECKS: dict[str, Callable[[str], dict]] = {
    "nccl_world1": check_world1, "inproc": check_inproc, "device_copy": check_device_copy,
    "capture": check_capture, "cupy": check_arrays, "async_work": check_async_work, "absent": check_absent,
    "memory": check_memory, "paro": check_paro,
}


def run_child(name: str, device: str, result: Path, store_dir: str) -> int:
    """One section in this process, its result (and how far it got) in `result`."""
    gpu_faults.PROGRESS = result
    note(section=name, stage="starting")
    out = absent_pg(device, store_dir) if name == "absent_pg" else CHECKS[name](device)
    note(**out, done=True)
    sys.stdout.flush()
    if out.get("exit_at_once"):
        os._exit(0)  # nccl_world1 keeps comms that must not be dropped (see gpu_results._check_comm)
    return 0


# -- the sections, each in a process of its own ----------------------------------------------------
def _how_it_ended(rc: int) -> str:
    if rc < 0:
        try:
            return f"killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    return f"exit status {rc}"


class Child:
    """A section's process, started now; finish() waits for it within its limit."""

    def __init__(self, name: str, device: str, tmp: Path, limit: float, env: dict[str, str] | None = None,
                 tag: str = "", log: Path | None = None) -> None:
        self.name, self.limit = name, limit
        self.result = tmp / f"{name}{tag}.json"
        cmd = [sys.executable, __file__, "--child", name, "--device", device, "--result", str(self.result),
               "--store-dir", str(tmp / f"store{tag}")]
        (tmp / f"store{tag}").mkdir(exist_ok=True)
        self.start = time.time()
        out = open(log, "w") if log is not None else None  # noqa: SIM115 - the child's, closed by finish()
        self.proc = subprocess.Popen(cmd, start_new_session=True, env={**os.environ, **(env or {})}, stdout=out,
                                     stderr=subprocess.STDOUT if out is not None else None)
        self.log = log
        if out is not None:
            out.close()  # the child has its own copy

    def finish(self, deadline: float | None = None) -> dict:
        """The section's result: what it returned, or how far it got before it hung or died."""
        end = self.start + self.limit if deadline is None else min(deadline, self.start + self.limit)
        hung = False
        try:
            rc = self.proc.wait(timeout=max(0.0, end - time.time()))
        except subprocess.TimeoutExpired:
            hung = True
            os.killpg(self.proc.pid, signal.SIGKILL)  # the section's process group: this child and its own
            rc = self.proc.wait()
        res = json.loads(self.result.read_text()) if self.result.exists() else {}
        secs = time.time() - self.start
        res.update(seconds=secs, returncode=rc)
        stage = res.get("stage", "starting")
        if hung:
            res.update(ok=False, hung=True, summary=f"hung: killed after {secs:.0f} s, at {stage}"
                       + (f"; so far: {res['summary']}" if "summary" in res else ""))
        elif not res.get("done"):
            so_far = f"; so far: {res['summary']}" if "summary" in res else ""
            ended = _how_it_ended(rc)
            res.update(ok=False, summary=f"the process ended ({ended}) after {secs:.0f} s, at {stage}{so_far}")
        elif rc != 0:
            res.update(ok=False, summary=f"{res.get('summary', '')}; then the process ended ({_how_it_ended(rc)})")
        if self.log is not None:
            res["log"] = str(self.log)
        return res


def _nvidia_smi(fields: str) -> str:
    """GPU 0's `fields` as nvidia-smi reports them ('' without it)."""
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return (out.strip().splitlines() or [""])[0]


def _gpu_shared() -> bool:
    """Whether more than one process may use the GPU at once (compute mode Default)."""
    return _nvidia_smi("compute_mode") == "Default"


def _absent_pg_children(device: str, tmp: Path, logs: Path) -> list[tuple[str, Child]]:
    """Rank 0 of a 2-rank torch group whose rank 1 never comes: with torch's defaults, and (NCCL) with
    nonblocking communicator init, which makes torch poll NCCL's init against the group's timeout.
    What they print (torch's and NCCL's warnings) goes to logs/absent_pg*.log."""
    out = [("hocc", Child("absent_pg", device, tmp, ABSENT_PG_LIMIT_S, {"HOCC_ABSENT_CALL": "hocc"}, "_hocc",
                          logs / "absent_pg_hocc.log")),
           ("defaults", Child("absent_pg", device, tmp, ABSENT_PG_LIMIT_S, log=logs / "absent_pg.log"))]
    if is_cuda(device):
        out.append(("TORCH_NCCL_USE_COMM_NONBLOCKING=1", Child(
            "absent_pg", device, tmp, ABSENT_PG_LIMIT_S, {"TORCH_NCCL_USE_COMM_NONBLOCKING": "1"}, "_nonblocking",
            logs / "absent_pg_nonblocking.log")))
    return out


def _absent_pg_summary(res: dict) -> str:
    if res.get("done"):
        return res["summary"]
    secs = res["seconds"]  # from the process's start, imports included
    phase = res.get("phase", "its start (importing torch)")
    if res.get("hung"):
        return f"{res.get('backend', '?')}: hung in {phase} until killed after {secs:.0f} s"
    ended = _how_it_ended(res["returncode"])
    return f"{res.get('backend', '?')}: the process ended ({ended}) in {phase} after {secs:.0f} s"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda:0", help="cuda:0 (default) or cpu for a dry run")
    ap.add_argument("--json", default="gpu_check.json", help="the summary, rewritten after each section")
    ap.add_argument("--only", default="", help=f"comma-separated sections to run (default all: {','.join(SECTIONS)})")
    ap.add_argument("--deadline", type=float, default=0.0, help="epoch seconds by which every section must end")
    ap.add_argument("--build-json", default="", help="the build step's result (gpu_check.sh), kept in the summary")
    ap.add_argument("--child", default="", help=argparse.SUPPRESS)
    ap.add_argument("--result", default="", help=argparse.SUPPRESS)
    ap.add_argument("--store-dir", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return run_child(args.child, args.device, Path(args.result), args.store_dir)

    gpu = is_cuda(args.device)
    only = [x for x in args.only.split(",") if x]
    unknown = [x for x in only if x not in SECTIONS and x != "build"]
    if unknown:
        ap.error(f"unknown sections {unknown}; choose from build,{','.join(SECTIONS)}")
    selected = [s for s in SECTIONS if not only or s in only]  # the build is gpu_check.sh's
    deadline = args.deadline or time.time() + sum(v[0 if gpu else 1] for v in SECTIONS.values())
    report: dict = {"device": args.device, "started": time.strftime("%Y-%m-%d %H:%M:%S"), "torch": torch.__version__,
                    "sections": {}}
    if args.build_json and Path(args.build_json).exists():
        report["build"] = json.loads(Path(args.build_json).read_text())
    if gpu:  # from nvidia-smi: this process makes no CUDA context (the GPU may allow only one process)
        report["gpu"] = _nvidia_smi("name,compute_mode,driver_version,memory.total")
    verdicts: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="hocc-gpu-check-") as tmpdir:
        tmp = Path(tmpdir)
        shared = not gpu or _gpu_shared()
        logs = Path(args.json).resolve().parent
        absent_bg = _absent_pg_children(args.device, tmp, logs) if "absent" in selected and shared else []
        if absent_bg:
            print(f"absent: the 2-rank group's rank 0 runs beside the other sections (up to {ABSENT_PG_LIMIT_S:.0f} s)",
                  flush=True)
        for name in selected:
            gpu_limit, cpu_limit, what = SECTIONS[name]
            limit = min(gpu_limit if gpu else cpu_limit, deadline - time.time() - 3)
            if not gpu and not cpu_limit:
                res = {"ok": None, "summary": f"{what}: CUDA only, not run on the CPU"}
            elif limit < 10:
                res = {"ok": False, "summary": f"not run: {max(0.0, deadline - time.time()):.0f} s of the budget left"}
            else:
                print(f"-- {name}: {what} (limit {limit:.0f} s)", flush=True)
                res = Child(name, args.device, tmp, limit).finish()
                if name == "absent":
                    res = _with_absent_pg(res, absent_bg or _absent_pg_children(args.device, tmp, logs), deadline)
            word = "SKIP" if res["ok"] is None else "ok" if res["ok"] else "FAIL"
            secs = f"; {res['seconds']:.0f} s" if "seconds" in res else ""
            print(f"VERDICT {name}: {word} ({res['summary']}{secs})", flush=True)
            verdicts[name] = word
            report["sections"][name] = res
            report["verdicts"] = verdicts
            Path(args.json).write_text(json.dumps(report, indent=1, default=str))
        for _, child in absent_bg:  # only left running where the absent section was not reached
            if child.proc.poll() is None:
                os.killpg(child.proc.pid, signal.SIGKILL)
                child.proc.wait()
    failed = [k for k, v in verdicts.items() if v == "FAIL"]
    print(f"gpu_check: {len(verdicts)} sections: {sum(v == 'ok' for v in verdicts.values())} ok, "
          f"{len(failed)} FAIL{' (' + ', '.join(failed) + ')' if failed else ''}, "
          f"{sum(v == 'SKIP' for v in verdicts.values())} SKIP; summary in {args.json}", flush=True)
    return 1 if failed else 0


def _with_absent_pg(res: dict, children: list[tuple[str, Child]], deadline: float) -> dict:
    """The absent section's result with the 2-rank group's: ok only if hocc's call raised within its
    bound. What torch's own call does there (with its defaults and nonblocking init) is reported beside
    it: a finding about torch and NCCL, which hocc's first call on a group does not rely on (its set-up
    meets every member through the store under the group's timeout first, hocc/engine/group.py)."""
    pgs = {}
    for label, child in children:
        pg = child.finish(deadline)
        pg["summary"] = _absent_pg_summary(pg)
        pgs[label] = pg
        call = "hocc's all_reduce" if label == "hocc" else f"torch's all_reduce, {label}"
        print(f"absent: rank 0 of 2, rank 1 never comes, timeout {PG_TIMEOUT_S:.0f} s, {call}: {pg['summary']}",
              flush=True)
    ours = pgs["hocc"]
    raised = ours.get("outcome") == "raised" and ours.get("ok")
    parts = [res.get("summary", ""), f"2-rank group, rank 1 absent: {ours['summary']}"
             + ("" if raised else f" (ok needs a raise within {PG_TIMEOUT_S + PG_SLACK_S:.0f} s)")]
    parts += [f"torch's own all_reduce there, {label}: {pg['summary']}" for label, pg in pgs.items()
              if label != "hocc"]
    return {**res, "absent_pg": pgs, "ok": bool(res.get("ok")) and bool(raised), "summary": "; ".join(parts)}


if __name__ == "__main__":
    sys.exit(main())
