"""``python -m mor.launch.probe``: a Slurm job that only sleeps, launched exactly as a train or
eval job is (``mor.launch.slurm_handoff.run_or_hand_off``: submitit, job.json, re-attach, the
watcher's hand-off) but with no grid, model or data: what the launch path costs the login
node and the controller, measured by ``benchmarks/bench_slurm_watch.py`` on hundreds of jobs."""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from pathlib import Path

from mor.atomic import write_text_atomic
from mor.launch.presets import Preset
from mor.launch.slurm_handoff import run_or_hand_off
from mor.launch.slurm_submit import LaunchError, pythonpath_setup


def nap(seconds: float, tag: str) -> dict:
    time.sleep(seconds)
    return {"tag": tag, "slept_s": seconds}


SNAKEFILE = """\
# N probe jobs (mor.launch.probe) through the Slurm launcher: written by mor.launch.probe.write_workflow
from mor.workflow_guard import clear_stale_locks

clear_stale_locks()  # a workflow killed hard leaves its lock: the same command simply runs again
PY = {python!r}
LAUNCH_ARGS = "--launcher slurm"
N, SLEEP, PARTITION = {n}, {sleep}, {partition!r}

rule all:
    input: expand("out/{{i}}.json", i=range(N))

rule probe:
    output: "out/{{i}}.json"
    log: "logs/{{i}}.log"
    shell: "{{PY}} -m mor.launch.probe --tag {{wildcards.i}} --sleep {{SLEEP}} --folder slurm/{{wildcards.i}}"
           " --out {{output}} --partition {{PARTITION}} {{LAUNCH_ARGS}} > {{log}} 2>&1"
"""


def write_workflow(folder: Path, n: int, sleep: float, partition: str = "debug") -> Path:
    """A Snakefile of ``n`` probe jobs in ``folder`` (run it with ``--executor mor-slurm`` or
    ``--executor local``); each writes ``out/<i>.json`` = ``{"tag": "<i>", "slept_s": sleep}``."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "Snakefile"
    path.write_text(SNAKEFILE.format(python=sys.executable, n=int(n), sleep=float(sleep), partition=partition))
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mor.launch.probe", description=__doc__)
    ap.add_argument("--sleep", type=float, default=1.0)
    ap.add_argument("--tag", required=True)
    ap.add_argument("--folder", required=True, help="the submitit folder (job.json, Slurm logs)")
    ap.add_argument("--out", required=True, help="the result, written once the job has ended")
    ap.add_argument("--partition", default=None)
    ap.add_argument("--launcher", choices=("slurm",), default="slurm")
    a = ap.parse_args(argv)
    preset = Preset(partition=a.partition, cpus_per_task=1, mem_gb=0.1, time_min=10, signal_delay_s=30)
    try:
        results = run_or_hand_off(functools.partial(nap, a.sleep, a.tag), preset, Path(a.folder).absolute(),
                                  name=f"mor-probe-{a.tag}", what=f"probe {a.tag}", setup=pythonpath_setup())
    except LaunchError as e:
        print(e, file=sys.stderr)
        return 1
    if results is not None:
        write_text_atomic(Path(a.out), json.dumps(results[0]) + "\n")
        print(f"probe {a.tag}: slept {results[0]['slept_s']}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
