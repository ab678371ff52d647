"""The workflow's one Slurm watcher (executor mor-slurm) on the real loopback cluster: many
probe jobs (``mor.launch.probe``: the launch path of a train job, a job that sleeps), Snakemake
SIGKILLed with jobs in flight and started again: running jobs adopted, finished ones
collected, none submitted twice, results those of an undisturbed run; Slurm asked in batches
(``sacct`` / ``squeue`` logged through wrappers on PATH), never per job per interval."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.deadlines import deadline
from helpers.slurm_jobs import JOB_S, env, wait_for
from mor.launch.probe import write_workflow

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

N, SLEEP = 12, 2.0
WRAP = '#!/bin/sh\necho "{name} $*" >> "{log}"\nexec {real} "$@"\n'


def logged_clients(tmp_path: Path) -> tuple[dict, Path]:
    """sacct and squeue wrapped to log every call, first on PATH for the workflow and its launchers."""
    bindir, log = tmp_path / "bin", tmp_path / "calls.log"
    bindir.mkdir()
    log.write_text("")
    for name in ("sacct", "squeue"):
        real = subprocess.run(["sh", "-c", f"command -v {name}"], capture_output=True, text=True).stdout.strip()
        (bindir / name).write_text(WRAP.format(name=name, log=log, real=real))
        (bindir / name).chmod(0o755)
    e = env()
    e["PATH"] = f"{bindir}{os.pathsep}{e['PATH']}"
    return e, log


def start(workdir: Path, e: dict) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "snakemake", "--snakefile", str(workdir / "Snakefile"), "--directory", str(workdir),
           "--executor", "mor-slurm", "--jobs", "1000", "--rerun-incomplete", "--latency-wait", "30"]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=e,
                            start_new_session=True)


def records(workdir: Path) -> dict[str, str]:
    return {p.parent.name: json.loads(p.read_text())["job_id"] for p in (workdir / "slurm").glob("*/job.json")}


def test_killed_workflow_restarted_adopts_its_jobs_and_submits_none_twice(slurm_cluster, tmp_path):
    workdir = tmp_path / "wf"
    write_workflow(workdir, N, SLEEP)
    e, calls = logged_clients(tmp_path)
    proc = start(workdir, e)
    try:
        outs = workdir / "out"
        wait_for(lambda: len(list(outs.glob("*.json"))) >= 3 or proc.poll() is not None, "3 collected jobs")
        assert proc.poll() is None, proc.communicate()[0][-3000:]
        os.kill(proc.pid, signal.SIGKILL)  # a lost login session: no chance to cancel anything
        proc.wait(timeout=deadline(30))
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    before = records(workdir)
    in_flight = [k for k in before if not (outs / f"{k}.json").exists()]
    assert in_flight, "the kill should leave jobs in flight"

    again = start(workdir, e)
    out, _ = again.communicate(timeout=deadline(4 * JOB_S))
    assert again.returncode == 0, out[-5000:]

    after = records(workdir)
    assert sorted(after) == sorted(map(str, range(N)))
    assert {k: after[k] for k in before} == before  # every job recorded before the kill kept its Slurm job
    for k, jid in after.items():  # ... and each folder holds the logs of that one job only
        assert {p.name.split("_")[0] for p in (workdir / "slurm" / k).glob("*_log.out")} == {jid}, k
        assert json.loads((outs / f"{k}.json").read_text()) == {"tag": k, "slept_s": SLEEP}
    for k in in_flight:  # adopted: the restarted workflow's log names the jobs it re-attached to
        assert f"re-attached to Slurm job {before[k]}" in (workdir / "logs" / f"{k}.log").read_text() or \
            f"Slurm job {before[k]} (probe {k})" in (workdir / "logs" / f"{k}.log").read_text()

    lines = calls.read_text().splitlines()
    batched = [ln for ln in lines if ln.startswith("squeue") and "%i %T" in ln]
    assert batched and max(len(ln.split(" -j ")[1].split()[0].split(",")) for ln in batched) >= 2, batched[:5]
    per_job = [ln for ln in lines if ln.startswith("squeue") and "%i %T" not in ln]
    assert len(per_job) <= len(in_flight), per_job  # only the re-attach asks about one job, once
    assert len([ln for ln in lines if ln.startswith("sacct") and "JobID,State" in ln]) == len(batched)
