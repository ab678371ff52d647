"""A run's state (done, trained, running, queued, failed, stopped, not started) decided from what
``mor.status.read`` reads, and every run of the grids collected with the plan's hours.

The Slurm state names come from the launcher (``mor.launch.slurm_state``), so that status and the
launcher that waits on the job never disagree on what is queued or running.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

from mor import layout
from mor.grids import Grid
from mor.launch.slurm_state import QUEUED_STATES, RUNNING_STATES
from mor.status.hours import plan_hours
from mor.usage import run_cpu_s
from mor.status.read import (JobInfo, Paths, checkpoint_step, last_error_line, log_tail, measured_train_s,
                             read_val_nll, slurm_job_info, slurm_job_state, slurm_log_error)

SPEED_WINDOW = 20  # logged steps averaged for tokens/s
STALE_MIN_S = 300.0  # a local log older than max(this, 20 steps) is not being written
STATES = ("done", "trained", "running", "queued", "failed", "stopped", "not started")


@dataclass
class RunStatus:
    grid: str
    run_id: str
    label: str
    state: str
    steps: int
    step: int = 0
    tokens_per_s: float | None = None
    eta_s: float | None = None
    estimated: bool = False  # eta_s is the plan's estimate, not a measurement
    loss: float | None = None
    val_nll: float | None = None
    note: str = ""
    hours_total: float = 0.0  # device-hours of the run's planned jobs
    hours_spent: float = 0.0
    train_s: float | None = None  # measured device-seconds of training (train_summary.json), None without
    train_plan_s: float = 0.0  # the plan's device-seconds for the run's train job
    cpu_s: dict[str, float] = field(default_factory=dict)  # job -> CPU seconds its local jobs recorded (mor.usage)
    grids: list[str] = field(default_factory=list)  # the grids shown that list it (one run, one home: shown once)


@dataclass
class GridStatus:
    grid: Grid
    runs: list[RunStatus] = field(default_factory=list)
    device: str = "GPU"  # "CPU" when the presets run this grid's jobs on CPUs (hours per task)
    no_plan: str = ""  # why the presets give no hours for this grid (then none are shown)
    shared: dict[str, str] = field(default_factory=dict)  # run id -> the grid it is shown under (listed there first)

    def counts(self) -> dict[str, int]:
        return {s: n for s in STATES if (n := sum(r.state == s for r in self.runs))}


def slurm_note(job_id: str, state: str, info: JobInfo | None, error: str | None) -> str:
    """"Slurm job 7 RUNNING on node3, 0:12:03 of 1-00:00:00" (+ ": <last error line>")."""
    text = f"Slurm job {job_id} {state}"
    if info and info.node:
        text += f" on {info.node}"
    if info and info.elapsed and state not in QUEUED_STATES:
        text += f", {info.elapsed} of {info.limit or '?'}"
    elif info and info.limit:
        text += f", limit {info.limit}"
    return text + (f": {error}" if error else "")


def run_status(grid: Grid, run, paths: Paths, now: float, slurm_query=None, slurm_info=None) -> RunStatus:
    """The state of one run from its files and (when a job was recorded) Slurm. ``slurm_query``
    / ``slurm_info`` replace the Slurm clients (tests)."""
    cfg = run.config
    imported = bool(cfg.model.import_checkpoint)  # the authors' weights: nothing is trained (issue 62)
    st = RunStatus(grid.name, run.run_id, cfg.label, "not started", 0 if imported else cfg.train.steps)
    if imported:
        st.note = "import pending: model.import_checkpoint, nothing is trained"
    run_dir = paths.run_dir(grid.name, run.run_id)
    st.cpu_s = run_cpu_s(run_dir)
    tail = log_tail(run_dir / layout.TRAIN_LOG_FILE)
    if tail:
        last = tail[-1]
        st.step, st.loss = int(last["step"]), last.get("loss")
        speeds = [r["tokens_per_s"] for r in tail[-SPEED_WINDOW:] if r.get("tokens_per_s")]
        if speeds:
            st.tokens_per_s = statistics.fmean(speeds)
    if paths.result(grid.name, run.run_id).exists():
        st.state, st.step, st.val_nll = "done", st.steps, read_val_nll(paths.result(grid.name, run.run_id))
        return st
    summary = run_dir / layout.SUMMARY_FILE
    if summary.exists():
        st.state, st.step = "trained", st.steps
        job = slurm_job_state(paths.slurm_job(grid.name, run.run_id, f"eval-{run.config.eval_hash}"), slurm_query)
        st.note = (f"eval: Slurm {job[0]} (job {job[1]})" if job and job[0] else "eval pending") + (
            "; imported, nothing trained" if imported else "")
        return st
    record = paths.slurm_job(grid.name, run.run_id, "train")
    job = slurm_job_state(record, slurm_query)
    error = last_error_line(paths.rule_log(grid.name, run.run_id, "train"))
    if job and job[0]:
        state, job_id = job
        info = (slurm_info or slurm_job_info)(job_id)
        if state in RUNNING_STATES:
            st.state, st.note = "running", slurm_note(job_id, state, info, None)
        elif state in QUEUED_STATES:
            st.state, st.note = "queued", slurm_note(job_id, state, info, None)
        else:
            st.state = "failed" if state != "COMPLETED" else "stopped"
            st.note = slurm_note(job_id, state, info, slurm_log_error(record, job_id) or error)
        return st
    log = run_dir / layout.TRAIN_LOG_FILE
    if tail:
        step_s = cfg.train.tokens_per_step / st.tokens_per_s if st.tokens_per_s else 0.0
        fresh = now - log.stat().st_mtime < max(STALE_MIN_S, 20 * step_s)
        ckpt = checkpoint_step(run_dir)
        resume = f"resumes at step {ckpt} (checkpoint)" if ckpt else "restarts from step 0 (no checkpoint yet)"
        if fresh:
            st.state = "running"
        elif error:
            st.state, st.note = "failed", f"{error}; {resume}"
        else:
            st.state, st.note = "stopped", resume
        return st
    if error:
        st.state, st.note = "failed", error
    return st


def collect(grids: list[Grid], paths: Paths = Paths(), presets_file: Path | None = None, tags: list[str] | None = None,
            slurm_query=None, now: float | None = None, slurm_info=None) -> list[GridStatus]:
    """The status of every run of ``grids`` (the ``tags`` blocks only, like the workflow)."""
    now = time.time() if now is None else now
    try:
        hours, device, failed = plan_hours(grids, presets_file)
    except Exception as e:  # a site's broken presets must not hide the runs
        hours, device, failed = {}, "GPU", {g.name: str(e) for g in grids}
    out = []
    seen: dict[str, RunStatus] = {}  # a run several grids list is one run (one home): shown once, under the first
    for g in grids:
        gs = GridStatus(g, device=device, no_plan=failed.get(g.name, ""))
        for run in g.select(tags):
            if run.run_id in seen:
                seen[run.run_id].grids.append(g.name)
                gs.shared[run.run_id] = seen[run.run_id].grid
                continue
            st = run_status(g, run, paths, now, slurm_query, slurm_info)
            st.grids = [g.name]
            seen[run.run_id] = st
            h = hours.get((g.name, run.run_id), {})
            if st.state == "running" and st.tokens_per_s:
                st.eta_s = (st.steps - st.step) * run.config.train.tokens_per_step / st.tokens_per_s
            st.hours_total = sum(device_h for _, device_h in h.values())
            train_wall, train_dev = h.get("train", (0.0, 0.0))
            st.train_plan_s = train_dev * 3600
            if st.state in ("done", "trained"):
                st.train_s = measured_train_s(paths.run_dir(g.name, run.run_id) / layout.SUMMARY_FILE, st.steps)
            if st.state == "done":
                st.hours_spent = st.hours_total
            elif st.state != "not started":  # trained: the eval job's hours are still left
                st.hours_spent = train_dev * min(1.0, st.step / max(1, st.steps))
            if st.state in ("not started", "queued") and train_wall:
                st.eta_s, st.estimated = train_wall * 3600, True
            gs.runs.append(st)
        out.append(gs)
    for st in seen.values():
        if len(st.grids) > 1:
            also = f"shared with {', '.join(st.grids[1:])}"
            st.note = f"{also}; {st.note}" if st.note else also
    return out
