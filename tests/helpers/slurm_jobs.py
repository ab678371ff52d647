"""Launcher commands and Slurm queries for the tests on the real loopback cluster
(slurm/testcluster): a tiny grid and presets file written for partition ``debug``, the
launcher run in its own process group, the job ids it recorded, what sacct and squeue say."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from helpers.deadlines import deadline
from helpers.paths import REPO
from helpers.procs import run_group


JOB_S = 240  # generous bound for one launcher on a 2-CPU cluster shared with other tests


def write_presets(path: Path, tasks: int = 1) -> Path:
    path.write_text(
        "defaults: {partition: debug, cpus_per_task: 1, mem_gb: 1, time_min: 10, signal_delay_s: 30}\n"
        "scales:\n"
        f"  tiny:\n    train: {{gpus_per_node: 0, tasks_per_node: {tasks}}}\n    eval: {{gpus_per_node: 0}}\n")
    return path


def write_grid(grids: Path, name: str, steps: int, tying: bool = True, checkpoint_every: int = 4) -> Path:
    """A 1- or 2-run grid at the 'tiny' scale (vanilla + middle-cycle recursive)."""
    grids.mkdir(parents=True, exist_ok=True)
    blocks = "  - label: Vanilla\n    set: {model.variant: vanilla}\n    axes: {model.scale: [135M]}\n"
    if tying:
        blocks += ("  - label: \"{model_tying}\"\n    set: {model.variant: recursive, model.num_recursions: 2}\n"
                   "    axes: {model.scale: [135M], model.tying: [middle_cycle]}\n")
    path = grids / f"{name}.yaml"
    path.write_text(
        f"name: {name}\nartifacts: [tables/table10]\ndefaults:\n  data: {{source: django-docs, tokenizer: bpe-4096}}\n"
        f"runs:\n{blocks}modes:\n  local:\n    scale_map: {{135M: tiny}}\n    set:\n"
        f"      train: {{tokens: {steps * 8 * 32}, seq_len: 32, global_batch: 8, micro_batch: 4, "
        f"checkpoint_every: {checkpoint_every}}}\n"
        "      eval: {nll_tokens: 1024, batch: 8}\n"
        "reference:\n  - {paper_scale: 135M, variant: recursive, tying: middle_cycle, num_recursions: 2, val_nll: 3.0330}\n")
    return path


def env() -> dict:
    """Launchers that look for results every 0.5 s and ask Slurm every 1 s; a job that ended
    without a result gets 2 s for it to show up (local disk), a vanished one 30 s."""
    return dict(os.environ, PYTHONPATH=str(REPO / "src"), MOR_LAUNCH_POLL_S="0.5", MOR_LAUNCH_STATE_POLL_S="1",
                MOR_LAUNCH_RESULT_WAIT_S="2", MOR_LAUNCH_UNKNOWN_S="30")


def launch(kind: str, grid: Path, run_id: str, workdir: Path, data_root: Path, *extra: str, popen=False):
    cmd = [sys.executable, "-m", "mor.launch", kind, "--grid", str(grid), "--run-id", run_id, "--mode", "local",
           "--run-dir", f"runs/{run_id}", "--data-root", str(data_root), *extra]
    if popen:
        return subprocess.Popen(cmd, cwd=workdir, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return run_group(cmd, cwd=workdir, env=env(), timeout=deadline(JOB_S))


def job_ids(workdir: Path) -> dict[str, str]:
    """{'<run_id>/<kind>': slurm job id} from the launchers' job.json records."""
    return {f"{p.parent.parent.name}/{p.parent.name}": json.loads(p.read_text())["job_id"]
            for p in (workdir / "logs" / "slurm").rglob("job.json")}


def sacct_states(job_id: str) -> list[str]:
    """Every state sacct recorded for the job, oldest first (a requeue leaves a REQUEUED record)."""
    out = subprocess.run(["sacct", "-n", "-X", "-P", "--duplicates", "-j", job_id, "-o", "State"],
                         capture_output=True, text=True, timeout=deadline(30), check=True).stdout
    return [ln.split()[0] for ln in out.splitlines() if ln.strip()]


def squeue_state(job_id: str) -> str:
    return subprocess.run(["squeue", "-h", "-t", "all", "-j", job_id, "-o", "%T"], capture_output=True, text=True,
                          timeout=deadline(30), check=False).stdout.strip()


def restarts(job_id: str) -> int:
    """How many times Slurm has requeued the job (``scontrol show job``'s Restarts=): a count
    that only grows, unlike the PENDING a requeued job may pass through between two polls."""
    out = subprocess.run(["scontrol", "-o", "show", "job", job_id], capture_output=True, text=True,
                         timeout=deadline(30), check=False).stdout
    field = next((f for f in out.split() if f.startswith("Restarts=")), "Restarts=0")
    return int(field.split("=", 1)[1])


def start_now(job_id: str, within_s: float = 60) -> None:
    """Let a requeued job start without Slurm's requeue delay (its BeginTime, ~2 min).

    Slurm counts the restart while the first session still completes, and refuses the update
    until the job pends again: so retry while it completes, update once it pends, and stop
    once it runs or ended (then there is no delay left to skip)."""
    def started() -> bool:
        state = squeue_state(job_id)
        if state == "PENDING":
            return subprocess.run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"], capture_output=True,
                                  timeout=deadline(30), check=False).returncode == 0
        return state not in ("COMPLETING", "REQUEUED", "REQUEUE_FED", "CONFIGURING")

    wait_for(started, f"job {job_id} to pend again, then to be released", within_s, explain=lambda: job_report(job_id))


def preempt(job_id: str, steps_logged, launcher, within_s: float = 60, slack: int = 3) -> int:
    """Send SIGUSR2 (as submitit's ``job._interrupt()``) until the job acts on it; the number sent.

    Acting on it is an event that stays: Slurm's restart count (the job checkpoints at the end
    of the step in progress and requeues itself), or the launcher returning. A signal can be
    lost on its way (seen: slurmd dropped one sent just after a resumed step trained again, and
    the run went on to its end); a job that acted logs at most the step in progress after it,
    so ``slack`` more logged steps mean the signal never arrived, and it is sent again."""
    sent, at = 0, 0

    def acted() -> bool:
        nonlocal sent, at
        if restarts(job_id) >= 1 or launcher.poll() is not None:
            return True
        if sent == 0 or steps_logged() >= at + slack:
            at = steps_logged()
            subprocess.run(["scancel", "--signal=USR2", job_id], check=True, timeout=deadline(30))
            sent += 1
        return False

    wait_for(acted, f"job {job_id} to act on SIGUSR2 (Restarts=1)", within_s, every_s=0.05,
             explain=lambda: f"signals sent: {sent}\n{job_report(job_id)}")
    return sent


def job_report(job_id: str, log: Path | None = None) -> str:
    """What the job did, for a failure message: squeue's state, every sacct record (state, exit
    code, restarts' trace), ``scontrol show job`` and the tail of its Slurm log."""
    def run(cmd):
        return subprocess.run(cmd, capture_output=True, text=True, timeout=deadline(30), check=False).stdout.strip()

    parts = [f"squeue: {squeue_state(job_id) or '(gone)'}",
             "sacct: " + run(["sacct", "-n", "-X", "-P", "--duplicates", "-j", job_id,
                              "-o", "JobID,State,ExitCode,Start,End,Reason"]).replace("\n", "; "),
             "scontrol: " + run(["scontrol", "-o", "show", "job", job_id])]
    if log is not None and log.exists():
        parts.append("log tail:\n" + "\n".join(log.read_text(errors="replace").splitlines()[-25:]))
    return "\n".join(parts)


def wait_for(pred, what: str, within_s: float = JOB_S, every_s: float = 0.2, explain=None):
    """Poll for an event; ``within_s`` (scaled by the machine factor) only bounds a hang.
    ``explain``: a callable whose text joins the timeout message (what the job did)."""
    limit = deadline(within_s)
    end = time.monotonic() + limit
    while not (value := pred()):
        if time.monotonic() >= end:
            detail = f"\n{explain()}" if explain else ""
            raise AssertionError(f"timed out after {limit:.0f}s waiting for {what}{detail}")
        time.sleep(every_s)
    return value
