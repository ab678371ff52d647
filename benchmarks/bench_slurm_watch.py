"""What a workflow of many Slurm jobs costs the login node and the controller: one waiting
launcher per job (``--executor local --cores 64``, the profile before issue 44) against the
workflow's one watcher (``--executor mor-slurm --jobs 1000``, slurm/config.yaml now).

On the loopback test cluster (``bash slurm/testcluster/up.sh``; run as root, it resets ``sdiag``):

    source /tmp/mor-slurm/env.sh
    .venv/bin/python benchmarks/bench_slurm_watch.py --jobs 300 --sleep 1

For each way: N probe jobs (``mor.launch.probe``: the launch path of a train job, a job that
sleeps), most of them pending on the 2-CPU node. Measured: wall time to drain; slurmctld RPCs
per minute from ``sdiag`` (by type and by user; reset before each way, so other users of the
cluster count too); peak resident memory (sum of RSS) of the Snakemake process and everything
it starts, sampled every 0.2 s; the number of sacct / squeue calls per minute is derived from
the RPC counts (sacct talks to slurmdbd, not to slurmctld, so it is not in sdiag).
``--kill-at K``: the watcher run is SIGKILLed once K jobs have finished and restarted; the
number of jobs submitted twice is counted from the job.json records (0 expected).
The state interval is the watcher's default (30 s; MOR_LAUNCH_STATE_POLL_S, the fallback of --mor-slurm-state-poll-s) unless set.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from mor.launch.probe import write_workflow  # noqa: E402


def tree_rss_kib(root: int) -> int:
    """Sum of VmRSS over ``root`` and its descendants (from /proc)."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            st = (d / "stat").read_text()
            ppid = int(st.rsplit(")", 1)[1].split()[1])
            m = re.search(r"VmRSS:\s+(\d+)", (d / "status").read_text())
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(d.name))
        rss[int(d.name)] = int(m.group(1)) if m else 0
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += rss.get(pid, 0)
        todo += children.get(pid, [])
    return total


def sdiag() -> tuple[dict[str, int], dict[str, int]]:
    """slurmctld RPC counts since the last reset: by message type, by user."""
    out = subprocess.run(["sdiag"], capture_output=True, text=True, check=True).stdout
    by_type, by_user, section = {}, {}, None
    for line in out.splitlines():
        if "by message type" in line:
            section = by_type
        elif "by user" in line:
            section = by_user
        elif section is not None and (m := re.match(r"\s*(\S+)\s*\(\s*\d+\)\s*count:(\d+)", line)):
            section[m.group(1)] = int(m.group(2))
        elif section is not None and line.strip() and "count:" not in line and not line.startswith(" "):
            section = None
    return by_type, by_user


def records(workdir: Path) -> dict[str, str]:
    return {p.parent.name: json.loads(p.read_text())["job_id"] for p in (workdir / "slurm").glob("*/job.json")}


def run_workflow(workdir: Path, executor: list[str], kill_at: int | None = None, window_s: float | None = None) -> dict:
    cmd = [sys.executable, "-m", "snakemake", "--snakefile", str(workdir / "Snakefile"), "--directory", str(workdir),
           "--rerun-incomplete", "--latency-wait", "30", *executor]
    log = open(workdir / "snakemake.log", "a")
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    peak = 0
    stop = threading.Event()

    def sample():
        nonlocal peak
        while not stop.is_set():
            peak = max(peak, tree_rss_kib(proc.pid))
            stop.wait(0.2)

    threading.Thread(target=sample, daemon=True).start()
    killed = None
    if kill_at is not None:
        while proc.poll() is None and len(list((workdir / "out").glob("*.json"))) < kill_at:
            time.sleep(0.2)
        os.kill(proc.pid, signal.SIGKILL)  # the Snakemake process only, as a lost login session would
        killed = dict(records=records(workdir), done=len(list((workdir / "out").glob("*.json"))))
    if window_s is not None:
        try:
            proc.wait(timeout=window_s)
        except subprocess.TimeoutExpired:  # stopped as a user would (Ctrl-C): its jobs are cancelled
            os.kill(proc.pid, signal.SIGINT)
    rc = proc.wait()
    stop.set()
    return dict(rc=rc, wall_s=time.monotonic() - t0, peak_rss_mib=peak / 1024, killed=killed)


def one_way(name: str, executor: list[str], n: int, sleep: float, kill_at: int | None,
            window_s: float | None = None) -> dict:
    workdir = Path(tempfile.mkdtemp(prefix=f"bench-slurm-{name}-", dir="/tmp"))
    write_workflow(workdir, n, sleep)
    subprocess.run(["sdiag", "--reset"], check=True, capture_output=True)
    t0 = time.monotonic()
    first = run_workflow(workdir, executor, kill_at, window_s)
    window = time.monotonic() - t0
    runs = [first]
    if kill_at is not None:
        runs.append(run_workflow(workdir, executor))
    wall = time.monotonic() - t0
    by_type, by_user = sdiag()
    if window_s is not None:  # rates over the window; the drain was not waited for
        wall = window
    recs = records(workdir)
    outs = {p.stem: json.loads(p.read_text()) for p in (workdir / "out").glob("*.json")}
    ok = sorted(outs) == sorted(map(str, range(n))) and all(
        o == {"tag": k, "slept_s": sleep} for k, o in outs.items())
    res = dict(way=name, jobs=n, rc=[r["rc"] for r in runs], results_ok=ok, done=len(outs),
               drained=len(outs) == n, wall_s=round(wall, 1),
               peak_rss_mib=round(max(r["peak_rss_mib"] for r in runs), 1),
               rpc_per_min={k: round(v / (wall / 60), 1) for k, v in sorted(by_type.items(), key=lambda kv: -kv[1])},
               rpc_by_user_per_min={k: round(v / (wall / 60), 1) for k, v in by_user.items()},
               rpc_total=sum(by_type.values()), workdir=str(workdir))
    if kill_at is not None:
        before = first["killed"]["records"]
        res["killed_with"] = dict(submitted=len(before), done=first["killed"]["done"])
        res["resubmitted"] = sum(1 for k, j in before.items() if recs.get(k) != j)
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=300)
    ap.add_argument("--sleep", type=float, default=1.0)
    ap.add_argument("--ways", default="before,after", help="before (a launcher per job), after (the watcher)")
    ap.add_argument("--kill-at", type=int, default=None, help="after: SIGKILL Snakemake once this many jobs ended")
    ap.add_argument("--window-s", type=float, default=None,
                    help="stop each way after this many seconds (Ctrl-C) and report rates over it, not the drain")
    a = ap.parse_args()
    ways = {"before": ["--executor", "local", "--cores", "64"],
            "after": ["--executor", "mor-slurm", "--jobs", "1000"]}
    for name in a.ways.split(","):
        res = one_way(name, ways[name], a.jobs, a.sleep, a.kill_at if name == "after" else None, a.window_s)
        print(json.dumps(res), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
