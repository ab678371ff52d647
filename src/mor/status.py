"""``python -m mor status [targets or grids]``: where every run the targets need stands.

One table per grid, one row per run, then a summary line per grid and the device-hours:

    state       done          the eval job wrote results/runs/<grid>/<id>.parquet (val NLL shown)
                trained       train_summary.json exists, the eval job has not written its row
                running       Slurm says RUNNING, or (local) train_log.jsonl grew recently
                queued        Slurm says PENDING (or requeued, configuring, suspended)
                failed        Slurm says it ended without the run finishing, or the rule's log
                              (logs/<grid>/<id>/train.log) ends in an error: its last error line
                stopped       part-trained, nothing writing: the next workflow run resumes it
                              (at the newest checkpoints/step-N, shown)
                not started   nothing on disk yet
    progress    step / total steps (train_log.jsonl, whose last line is the last logged step)
    tok/s, ETA  mean tokens/s of the last logged steps; ETA = steps left at that speed. Runs
                that have not started show the plan's estimate instead (``~``)
    loss        last training loss; val NLL of finished runs

Hours come in three labelled kinds, never mixed in one number:

    plan        the launcher's price (``mor.launch.plan.plan_grid`` over the Slurm presets):
                a finished job counts whole, a training job in progress by its fraction of
                steps, the rest is left. Assumed speeds, not a measurement.
    measured    the device-hours the finished runs' ``train_summary.json`` say training took
                (``train_time_s`` x ``world_size``), next to what the plan priced them at
    forecast    the plan's hours left at the measured speed (``forecast``: a ratio of sums over
                those runs) as a point and a range (the fastest and slowest run's speed), naming
                the grids it rests on; a grid without a finished run is priced between the
                speeds measured and the plan's own (its error depends on the model size).
                In the local mode also divided over the machine's cores.

The table fits the terminal: below ``--wide`` the run ids are shortened (their hash dropped,
or cut to the shortest prefix that stays unique in the grid) and folded, notes move under the
table, and the numbers' columns are never narrower than their widest number.

Slurm's state comes from the launcher's own queries (``mor.launch.slurm.slurm_state``) for the
job id it recorded in
``logs/slurm/<grid>/<id>/<kind>/job.json``; without Slurm clients those answer "unknown" and
the files decide. For a Slurm job the note also gives its node and elapsed time against its
limit (``sacct``, else ``squeue``) and, for a failed one, the last error line of its Slurm log.
Status only reads: it never writes a file, so it runs beside a workflow.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, NamedTuple

from mor.grids import Grid, GridError, all_grids, load_grid

TAIL_BYTES = 64 * 1024  # enough for the last few hundred log lines
SPEED_WINDOW = 20  # logged steps averaged for tokens/s
STALE_MIN_S = 300.0  # a local log older than max(this, 20 steps) is not being written
QUEUED = {"PENDING", "REQUEUED", "CONFIGURING", "SUSPENDED", "PREEMPTED", "READY", "RESIZING"}
RUNNING = {"RUNNING", "COMPLETING", "STAGE_OUT"}
STATES = ("done", "trained", "running", "queued", "failed", "stopped", "not started")
STYLE = {"done": "green", "trained": "cyan", "running": "bold yellow", "queued": "blue", "failed": "bold red",
         "stopped": "magenta", "not started": "dim"}
_ERROR = re.compile(r"(\w*(Error|Exception|Interrupt)\b|^error:|Traceback|Killed|CANCELLED|TIMEOUT)")


@dataclass(frozen=True)
class Paths:
    """Where the workflow keeps what status reads (all relative to the repository root)."""

    runs: Path = Path("runs")
    results: Path = Path("results")
    logs: Path = Path("logs")
    slurm_logs: Path = Path("logs/slurm")

    def run_dir(self, grid: str, run_id: str) -> Path:
        return self.runs / grid / run_id

    def result(self, grid: str, run_id: str) -> Path:
        return self.results / "runs" / grid / f"{run_id}.parquet"

    def rule_log(self, grid: str, run_id: str, kind: str) -> Path:
        return self.logs / grid / run_id / f"{kind}.log"

    def slurm_job(self, grid: str, run_id: str, kind: str) -> Path:
        return self.slurm_logs / grid / run_id / kind / "job.json"


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


@dataclass
class GridStatus:
    grid: Grid
    runs: list[RunStatus] = field(default_factory=list)
    device: str = "GPU"  # "CPU" when the presets run this grid's jobs on CPUs (hours per task)
    no_plan: str = ""  # why the presets give no hours for this grid (then none are shown)

    def counts(self) -> dict[str, int]:
        return {s: n for s in STATES if (n := sum(r.state == s for r in self.runs))}


# --------------------------------------------------------------------------------------
# Which grids the targets need
# --------------------------------------------------------------------------------------
def resolve_targets(targets: list[str], grids_dir: Path, mode: str) -> list[Grid]:
    """Grids for Snakemake targets (tables/x, figures/y, paper), grid names or grid files;
    none = every grid that lists an artifact."""
    grids = {p.stem: load_grid(p, mode) for p in all_grids(grids_dir)}
    by_artifact = {a: g.name for g in grids.values() for a in g.artifacts}
    picked: list[str] = []
    for t in targets or ["paper"]:
        t = t.rstrip("/")
        if t in ("paper", "all"):
            names = [g.name for g in grids.values() if g.artifacts]
        elif t in by_artifact:
            names = [by_artifact[t]]
        elif t in grids:
            names = [t]
        elif t.endswith(".yaml") and Path(t).exists():
            g = load_grid(t, mode)
            grids.setdefault(g.name, g)
            names = [g.name]
        else:
            raise GridError(f"unknown target {t!r}: not an artifact of a grid in {grids_dir} ({sorted(by_artifact)}), "
                            f"a grid name ({sorted(grids)}), a grid file or 'paper'")
        picked += [n for n in names if n not in picked]
    return [grids[n] for n in picked]


def with_design_seeds(grids: list[Grid], results: Path) -> list[Grid]:
    """The grids with the seeds the claims' adaptive design has added so far: the latest
    ``results/claims/round<r>/plan.json`` (workflows/claims.smk) names, per grid and block,
    the seeds its next round trains, so those runs are listed too (as not started until
    they run)."""
    import json

    plans = [p for p in (results / "claims").glob("round*/plan.json") if p.parent.name[5:].isdigit()]
    plans.sort(key=lambda p: int(p.parent.name[5:]))
    if not plans:
        return grids
    try:
        seeds = json.loads(plans[-1].read_text())["seeds"]
    except (OSError, ValueError, KeyError) as e:
        raise GridError(f"{plans[-1]}: not a round plan of the claims' design ({e})") from None
    return [load_grid(g.path, g.mode, seeds=seeds[g.name]) if seeds.get(g.name) else g for g in grids]


# --------------------------------------------------------------------------------------
# Reading a run's files
# --------------------------------------------------------------------------------------
def log_tail(path: Path, max_bytes: int = TAIL_BYTES) -> list[dict]:
    """The complete JSON lines at the end of a train log (a torn last line is skipped)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            blob = f.read()
    except OSError:
        return []
    lines = blob.decode("utf-8", "replace").splitlines()
    if size > max_bytes:
        lines = lines[1:]  # the first line read is probably cut
    out = []
    for line in lines:
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(rec, dict) and "step" in rec:
            out.append(rec)
    return out


def last_error_line(path: Path) -> str | None:
    """The last line of a log that reads like an error (None without one, or without the log)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - TAIL_BYTES))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return None
    lines = [ln.strip() for ln in text.replace("\r", "\n").splitlines() if ln.strip()]
    hits = [ln for ln in lines if _ERROR.search(ln)]
    return hits[-1][:200] if hits else None


def slurm_job_state(record: Path, query=None) -> tuple[str, str] | None:
    """(Slurm state, job id) of the job the launcher recorded, None without a record. The
    state is "" when neither sacct nor squeue can say."""
    try:
        job_id = str(json.loads(record.read_text())["job_id"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if query is None:
        from mor.launch.slurm import slurm_state as query
    return query(job_id).state, job_id


class JobInfo(NamedTuple):
    """Where and how long a Slurm job ran, as Slurm prints them ("" when it does not say)."""

    node: str = ""
    elapsed: str = ""  # [D-]HH:MM:SS
    limit: str = ""


SLURM_CLIENT_S = 10.0  # one sacct / squeue call: only bounds a hung client (status then says less)


def slurm_job_info(job_id: str) -> JobInfo | None:
    """Node, elapsed time and time limit of a Slurm job: sacct first (it remembers ended jobs),
    else squeue; None when neither answers (no Slurm clients here, slurmdbd down)."""
    import subprocess

    for cmd in (["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "NodeList,Elapsed,Timelimit"],
                ["squeue", "-h", "-j", job_id, "-o", "%N|%M|%l"]):
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=SLURM_CLIENT_S, check=False)
        except (OSError, subprocess.SubprocessError):
            continue
        lines = [ln for ln in p.stdout.splitlines() if ln.strip()]
        if p.returncode == 0 and lines:
            node, elapsed, limit = (part.strip() for part in (lines[-1].split("|") + ["", ""])[:3])
            return JobInfo("" if node in ("None assigned", "(null)") else node, elapsed, limit)
    return None


def slurm_log_error(record: Path, job_id: str) -> str | None:
    """The last error line of the job's own Slurm logs (submitit's ``<job id>_<task>_log.err``
    beside ``job.json``): where a job that died on its node says why."""
    logs = sorted(record.parent.glob(f"{job_id}_*log.err"), key=lambda p: p.name)
    errors = [e for p in logs if (e := last_error_line(p))]
    return errors[-1] if errors else None


def slurm_note(job_id: str, state: str, info: JobInfo | None, error: str | None) -> str:
    """"Slurm job 7 RUNNING on node3, 0:12:03 of 1-00:00:00" (+ ": <last error line>")."""
    text = f"Slurm job {job_id} {state}"
    if info and info.node:
        text += f" on {info.node}"
    if info and info.elapsed and state not in QUEUED:
        text += f", {info.elapsed} of {info.limit or '?'}"
    elif info and info.limit:
        text += f", limit {info.limit}"
    return text + (f": {error}" if error else "")


def checkpoint_step(run_dir: Path) -> int | None:
    """The step of the run's newest checkpoint (``checkpoints/step-NNNNNN``), where a restarted
    job resumes; None without one."""
    steps = []
    for d in (run_dir / "checkpoints").glob("step-*"):
        try:
            steps.append(int(d.name.removeprefix("step-")))
        except ValueError:
            continue
    return max(steps, default=None)


def measured_train_s(path: Path, steps: int) -> float | None:
    """Device-seconds the run's training took by its ``train_summary.json``: ``train_time_s`` x
    ``world_size``, comparable with the plan's device-hours (its wall hours x devices) even when
    the run had other ranks than the plan assumes. ``train_time_s`` is the wall time of the
    training steps summed over every session up to the last checkpoint (the trainer restores it
    when it resumes), so a resumed run counts whole; start-up and steps lost to a crash are not
    in it, nor in the plan's FLOPs. None, so the run is not counted, when the file is missing,
    malformed, or covers other than the run's ``steps`` (then the plan prices another run)."""
    try:
        s = json.loads(path.read_text())
        seconds, ranks, done = float(s["train_time_s"]), int(s["world_size"]), int(s["steps"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not (math.isfinite(seconds) and seconds > 0 and ranks >= 1 and done == steps):
        return None
    return seconds * ranks


def read_val_nll(path: Path) -> float | None:
    from mor.results import ResultsError, read_rows

    try:
        rows = read_rows(path).to_pylist()
    except ResultsError:
        return None
    return rows[0].get("val_nll") if rows else None


def run_status(grid: Grid, run, paths: Paths, now: float, slurm_query=None, slurm_info=None) -> RunStatus:
    """The state of one run from its files and (when a job was recorded) Slurm. ``slurm_query``
    / ``slurm_info`` replace the Slurm clients (tests)."""
    cfg = run.config
    st = RunStatus(grid.name, run.run_id, cfg.label, "not started", cfg.train.steps)
    run_dir = paths.run_dir(grid.name, run.run_id)
    tail = log_tail(run_dir / "train_log.jsonl")
    if tail:
        last = tail[-1]
        st.step, st.loss = int(last["step"]), last.get("loss")
        speeds = [r["tokens_per_s"] for r in tail[-SPEED_WINDOW:] if r.get("tokens_per_s")]
        if speeds:
            st.tokens_per_s = statistics.fmean(speeds)
    if paths.result(grid.name, run.run_id).exists():
        st.state, st.step, st.val_nll = "done", st.steps, read_val_nll(paths.result(grid.name, run.run_id))
        return st
    summary = run_dir / "train_summary.json"
    if summary.exists():
        st.state, st.step = "trained", st.steps
        job = slurm_job_state(paths.slurm_job(grid.name, run.run_id, "eval"), slurm_query)
        st.note = f"eval: Slurm {job[0]} (job {job[1]})" if job and job[0] else "eval pending"
        return st
    record = paths.slurm_job(grid.name, run.run_id, "train")
    job = slurm_job_state(record, slurm_query)
    error = last_error_line(paths.rule_log(grid.name, run.run_id, "train"))
    if job and job[0]:
        state, job_id = job
        info = (slurm_info or slurm_job_info)(job_id)
        if state in RUNNING:
            st.state, st.note = "running", slurm_note(job_id, state, info, None)
        elif state in QUEUED:
            st.state, st.note = "queued", slurm_note(job_id, state, info, None)
        else:
            st.state = "failed" if state != "COMPLETED" else "stopped"
            st.note = slurm_note(job_id, state, info, slurm_log_error(record, job_id) or error)
        return st
    log = run_dir / "train_log.jsonl"
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


def plan_hours(grids: list[Grid], presets_file: Path | None) -> tuple[dict, str, dict[str, str]]:
    """(grid, run id) -> {job kind: (wall hours, device-hours)} from the launcher's plan, the
    device word ("GPU", or "CPU" when no planned job has a GPU), and grid -> why the presets
    give it no plan. A grid the presets cannot price (a scale without an entry) loses its own
    hours, not every other grid's."""
    from mor.launch.cost import plan_grid
    from mor.launch.presets import load_presets

    presets = load_presets(presets_file) if presets_file else load_presets()
    out: dict[tuple[str, str], dict[str, float]] = {}
    failed: dict[str, str] = {}
    gpus = False
    for g in grids:
        try:
            jobs = plan_grid(g, presets)
        except Exception as e:  # noqa: BLE001 - named in the grid's summary line instead
            failed[g.name] = str(e)
            continue
        for j in jobs:
            devices = j.gpus or j.world_size
            gpus |= j.gpus > 0
            out.setdefault((g.name, j.run_id), {})[j.kind] = (j.hours, j.hours * devices)
    return out, "GPU" if gpus else "CPU", failed


def collect(grids: list[Grid], paths: Paths = Paths(), presets_file: Path | None = None, tags: list[str] | None = None,
            slurm_query=None, now: float | None = None, slurm_info=None) -> list[GridStatus]:
    """The status of every run of ``grids`` (the ``tags`` blocks only, like the workflow)."""
    now = time.time() if now is None else now
    try:
        hours, device, failed = plan_hours(grids, presets_file)
    except Exception as e:  # a site's broken presets must not hide the runs
        hours, device, failed = {}, "GPU", {g.name: str(e) for g in grids}
    out = []
    for g in grids:
        gs = GridStatus(g, device=device, no_plan=failed.get(g.name, ""))
        for run in g.select(tags):
            st = run_status(g, run, paths, now, slurm_query, slurm_info)
            h = hours.get((g.name, run.run_id), {})
            if st.state == "running" and st.tokens_per_s:
                st.eta_s = (st.steps - st.step) * run.config.train.tokens_per_step / st.tokens_per_s
            st.hours_total = sum(device_h for _, device_h in h.values())
            train_wall, train_dev = h.get("train", (0.0, 0.0))
            st.train_plan_s = train_dev * 3600
            if st.state in ("done", "trained"):
                st.train_s = measured_train_s(paths.run_dir(g.name, run.run_id) / "train_summary.json", st.steps)
            if st.state == "done":
                st.hours_spent = st.hours_total
            elif st.state != "not started":  # trained: the eval job's hours are still left
                st.hours_spent = train_dev * min(1.0, st.step / max(1, st.steps))
            if st.state in ("not started", "queued") and train_wall:
                st.eta_s, st.estimated = train_wall * 3600, True
            gs.runs.append(st)
        out.append(gs)
    return out


# --------------------------------------------------------------------------------------
# Forecast from the measured speed (pure)
# --------------------------------------------------------------------------------------
class Forecast(NamedTuple):
    factor: float  # measured / planned training time of the finished runs
    runs: int  # the runs it is measured on
    hours_left: float  # the plan's hours left x factor
    wall_hours: float | None  # hours_left / cores (one job per core), None without cores
    low: float = 0.0  # hours left at the fastest speed the range allows
    high: float = 0.0  # ... and at the slowest
    measured: tuple[tuple[str, float, int], ...] = ()  # (grid, its factor, its runs) it rests on
    unmeasured: tuple[str, ...] = ()  # grids without a finished run (priced by the range below)
    guess: tuple[float, float] = (1.0, 1.0)  # the factors those grids are priced between


def forecast(pairs: Iterable[tuple[float, float]], hours_left: float, cores: int | None = None) -> Forecast | None:
    """The plan's ``hours_left`` at the speed the finished runs measured: ``pairs`` are
    (measured, planned) training seconds of those runs, and the factor is sum(measured) /
    sum(planned). The plan prices every job at an assumed FLOP rate while a shared machine's
    real speed drifts by more than 2x between days; the finished runs say by how much. A ratio
    of sums, not a mean of ratios, so that each run weighs by its length: applied to the runs
    measured, it gives back the time they took, which a mean would skew towards the short
    runs' ratios (start-up and noise weigh most there). The range (``low``, ``high``) is the
    hours left at the fastest and the slowest single run's ratio. The other jobs (eval, ...)
    are assumed off by the same factor. ``cores``: the wall hours with one job per core (the
    local mode; a lower bound when fewer jobs than cores are left). None without a measured
    run (a pair without planned seconds is none)."""
    pairs = [(m, p) for m, p in pairs if p > 0]
    if not pairs:
        return None
    factor = sum(m for m, _ in pairs) / sum(p for _, p in pairs)
    ratios = [m / p for m, p in pairs]
    left = hours_left * factor
    return Forecast(factor, len(pairs), left, left / cores if cores else None,
                    hours_left * min(ratios), hours_left * max(ratios))


def forecast_grids(grids: list[tuple[str, list[tuple[float, float]], float]], cores: int | None = None
                   ) -> Forecast | None:
    """The forecast over several grids, each given as (name, its (measured, planned) pairs, its
    plan hours left): each grid's hours left at its own measured factor, and a grid without a
    finished run at the factor pooled over every grid's runs. Why not one pooled factor: the
    plan's error depends on the model size (table9's overhead-bound tiny models train at ~1.6x
    their FLOP price, the larger CPU scales at ~0.7-0.8x), so whichever grids happen to finish
    first would set the pace of all the rest. For the same reason the range prices a grid
    without a finished run anywhere between the slowest and fastest run measured and the plan
    itself (1.0x): nothing says which of them it resembles. The factor reported is the
    effective one, the forecast's hours left over the plan's. None without a measured run."""
    all_pairs = [(m, p) for _, pairs, _ in grids for m, p in pairs if p > 0]
    pooled = forecast(all_pairs, 1.0)
    if pooled is None:
        return None
    ratios = [m / p for m, p in all_pairs]
    guess = (min(ratios + [1.0]), max(ratios + [1.0]))
    left = low = high = 0.0
    measured, unmeasured = [], []
    for name, pairs, h in grids:
        f = forecast(pairs, h)
        if f is not None:
            left, low, high = left + f.hours_left, low + f.low, high + f.high
            measured.append((name, f.factor, f.runs))
        else:
            left, low, high = left + h * pooled.factor, low + h * guess[0], high + h * guess[1]
            unmeasured.append(name)
    plan_left = sum(h for _, _, h in grids)
    factor = left / plan_left if plan_left > 0 else pooled.factor
    return Forecast(factor, pooled.runs, left, left / cores if cores else None, low, high,
                    tuple(measured), tuple(unmeasured), guess)


def _measured_pairs(runs: list[RunStatus]) -> list[tuple[float, float]]:
    return [(r.train_s, r.train_plan_s) for r in runs if r.train_s is not None]


def _local_cores(grids: list[GridStatus], cores: int) -> int | None:
    """``cores`` when every grid is in the local mode (its jobs share this machine's cores),
    None for the cluster mode, whose Slurm jobs run in parallel elsewhere."""
    return cores if grids and all(gs.grid.mode == "local" for gs in grids) else None


# --------------------------------------------------------------------------------------
# Rendering
# --------------------------------------------------------------------------------------
def _duration(s: float | None, estimated: bool = False) -> str:
    if s is None:
        return ""
    if s < 1:
        return "~<1s" if estimated else "<1s"
    s = int(round(s))
    text = f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"
    return f"~{text}" if estimated else text


def _hours(h: float) -> str:
    return f"{h:.2f}" if h >= 0.1 or h == 0 else f"{h:.2g}"


def _num(v: float | None, fmt: str) -> str:
    return "" if v is None else format(v, fmt)


_HASH = re.compile(r"-[0-9a-f]{8}$")


def short_ids(run_ids: list[str]) -> dict[str, str]:
    """Run id -> a shorter name that stays unique among ``run_ids``: the id without its
    8-hex config hash where that is unique, else with the shortest prefix of the hash (at
    least 4) that is. Every short name is a prefix of its id, so ``runs/<grid>/<short>*``
    still finds the run's folder."""
    out: dict[str, str] = {}
    for n in (0, 4, 5, 6, 7, 8):
        cut = {r: (_HASH.sub("", r) + ("-" + r[-8:][:n] if n else "")) if _HASH.search(r) else r
               for r in run_ids if r not in out}
        seen: dict[str, int] = {}
        for v in cut.values():
            seen[v] = seen.get(v, 0) + 1
        out.update({r: v for r, v in cut.items() if seen[v] == 1 or n == 8})
    return {r: out.get(r, r) for r in run_ids}


def _hours_lines(device: str, spent: float, whole: float, measured_s: float, measured_runs: int, priced_s: float,
                 f: Forecast | None, cores: int | None) -> list[tuple[str, str]]:
    """(label, text) lines of a summary: plan, measured and forecast, each saying what it is."""
    unit = f"{device}-h"
    lines = [("plan", f"{_hours(spent)} of {_hours(whole)} {unit} done, {_hours(whole - spent)} left "
                      "(priced, not measured)")]
    if measured_runs:
        ratio = f", priced at {_hours(priced_s / 3600)} ({measured_s / priced_s:.2f}x)" if priced_s else ""
        lines.append(("measured", f"{_hours(measured_s / 3600)} {unit} of training in {measured_runs} run"
                                  + "s" * (measured_runs != 1) + ratio))
    else:
        lines.append(("measured", "nothing yet (no finished run with a train_summary.json)"))
    if f is not None:
        wall = f"; {_duration(f.wall_hours * 3600, estimated=True)} on {cores} cores" if f.wall_hours is not None else ""
        basis = "" if f.measured else f"; {f.runs} run" + "s" * (f.runs != 1) + ", fastest to slowest"
        lines.append(("forecast", f"~{_hours(f.hours_left)} {unit} left, {_hours(f.low)} to {_hours(f.high)} "
                                  f"({f.factor:.2f}x the plan{basis}){wall}"))
        if f.measured:
            lines.append(("", "rests on " + ", ".join(f"{g} {k:.2f}x ({n} run{'s' * (n != 1)})"
                                                      for g, k, n in f.measured)))
        if f.unmeasured:
            lines.append(("", f"not measured yet, priced at {f.guess[0]:.2f}x to {f.guess[1]:.2f}x: "
                              + ", ".join(f.unmeasured)))
    return lines


def _summary(head: str, lines: list[tuple[str, str]], style: str = ""):
    """The grid's (or the total's) summary: its head line, then the labelled lines aligned,
    each folding within its own column."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    t = Table.grid(padding=(0, 2, 0, 0), pad_edge=False)
    t.add_column(no_wrap=True, min_width=10)
    t.add_column()
    for label, text in lines:
        t.add_row(f"  {label}", text)
    return Group(Text(head, style=style), t)


def _fold_id(name: str, width: int) -> str:
    """A run id cut into lines of at most ``width`` at its dashes (then anywhere)."""
    lines, cur = [], ""
    for part in name.split("-"):
        piece = part if not cur else f"-{part}"
        if cur and len(cur) + len(piece) > width:
            lines.append(cur + "-")
            cur = part
        else:
            cur += piece
    lines.append(cur)
    return "\n".join(ln[i:i + width] for ln in lines for i in range(0, max(1, len(ln)), width))


NARROW_RUN_MIN = 12  # the run column's narrowest (folded) width


def _table(gs: GridStatus, width: int, wide: bool):
    """One grid's table. Wide: full ids, a progress bar and the notes in a column. Narrow:
    short ids folded into what the numbers leave, notes listed under the table."""
    from rich.progress_bar import ProgressBar
    from rich.table import Table
    from rich.text import Text

    names = {r.run_id: r.run_id for r in gs.runs} if wide else short_ids([r.run_id for r in gs.runs])
    cells = [[names[r.run_id], r.state, f"{r.step}/{r.steps}", _num(r.tokens_per_s, ".0f"),
              _duration(r.eta_s, r.estimated), _num(r.loss, ".3f"), _num(r.val_nll, ".4f")] for r in gs.runs]
    heads = ["run", "state", "steps", "tok/s", "ETA", "loss", "val NLL"]
    widths = [max([len(h)] + [len(c[i]) for c in cells]) for i, h in enumerate(heads)]
    # gaps of 2 between columns, 1 where that lets every id fit on one line
    gap = 2 if wide or widths[0] <= width - sum(widths[1:]) - 2 * (len(heads) - 1) else 1
    t = Table(box=None, pad_edge=False, expand=False, padding=(0, 1, 0, gap - 1), header_style="bold underline")
    if wide:
        t.add_column("run", no_wrap=True)
    else:  # what the other columns and the gaps leave, never less than NARROW_RUN_MIN
        run_w = max(NARROW_RUN_MIN, min(widths[0], width - sum(widths[1:]) - gap * (len(heads) - 1)))
        t.add_column("run", no_wrap=True, width=run_w)
        for c in cells:
            c[0] = _fold_id(c[0], run_w)
    t.add_column("state", no_wrap=True, min_width=widths[1])
    if wide:
        t.add_column("progress", no_wrap=True, width=16)
    for i, h in enumerate(heads[2:], start=2):
        t.add_column(h, justify="right", no_wrap=True, min_width=widths[i])
    if wide:
        t.add_column("note")
    for r, c in zip(gs.runs, cells):
        row = [c[0], Text(r.state, style=STYLE[r.state])]
        if wide:
            row.append(ProgressBar(total=max(1, r.steps), completed=r.step, width=16,
                                   complete_style="green" if r.state in ("done", "trained") else "yellow"))
        row += c[2:]
        if wide:
            row.append(r.note)
        t.add_row(*row)
    parts = [t]
    notes = [(names[r.run_id], r.note) for r in gs.runs if r.note]
    if notes and not wide:  # under the table: the id, then the note folding in its own column
        grid = Table.grid(padding=(0, 1, 0, 0), pad_edge=False)
        grid.add_column(no_wrap=True)
        grid.add_column()
        for name, note in notes:
            grid.add_row(f"  {name}", note)
        parts += [Text("notes:"), grid]
    parts.append(Text(""))
    return parts


def render(statuses: list[GridStatus], cores: int | None = None, width: int = 80, wide: bool = False):
    """A rich renderable: one table per grid, its summary lines, and the total. ``cores``: this
    machine's, over which a local-mode forecast is divided (default ``os.cpu_count()``); a
    cluster-mode grid's jobs run in parallel on Slurm, so its forecast stays in device-hours.
    ``width``: the terminal's columns the narrow table is fitted to (``wide``: none)."""
    from rich.console import Group
    from rich.text import Text

    parts = []
    total_spent = total_all = 0.0
    device = statuses[0].device if statuses else "GPU"
    cores = cores or os.cpu_count() or 1
    for gs in statuses:
        parts.append(Text(f"{gs.grid.name} ({gs.grid.mode}) -> {', '.join(gs.grid.artifacts) or 'no artifacts'}",
                          style="bold"))
        parts += _table(gs, width, wide)
        spent = sum(r.hours_spent for r in gs.runs)
        whole = sum(r.hours_total for r in gs.runs)
        total_spent, total_all = total_spent + spent, total_all + whole
        counts = ", ".join(f"{n} {s}" for s, n in gs.counts().items())
        steps = sum(r.step for r in gs.runs), sum(r.steps for r in gs.runs)
        local = _local_cores([gs], cores)
        head = f"{gs.grid.name}: {len(gs.runs)} runs: {counts}; steps {steps[0]}/{steps[1]}"
        if gs.no_plan:
            lines = [("no hours", f"no plan from the presets ({gs.no_plan})")]
        else:
            pairs = _measured_pairs(gs.runs)
            lines = _hours_lines(gs.device, spent, whole, sum(m for m, _ in pairs), len(pairs),
                                 sum(p for _, p in pairs), forecast(pairs, whole - spent, local), local)
        parts += [_summary(head, lines), Text("")]
    if len(statuses) > 1:
        n = sum(len(gs.runs) for gs in statuses)
        done = sum(r.state == "done" for gs in statuses for r in gs.runs)
        unpriced = [gs.grid.name for gs in statuses if gs.no_plan]
        lines = []
        if len(unpriced) == len(statuses):
            lines.append(("no hours", "no plan from the presets"))
        else:
            priced = [gs for gs in statuses if not gs.no_plan]
            local = _local_cores(priced, cores)
            per_grid = [(gs.grid.name, _measured_pairs(gs.runs), sum(r.hours_total - r.hours_spent for r in gs.runs))
                        for gs in priced]
            pairs = [pair for _, ps, _ in per_grid for pair in ps]
            lines += _hours_lines(device, total_spent, total_all, sum(m for m, _ in pairs), len(pairs),
                                  sum(p for _, p in pairs), forecast_grids(per_grid, local), local)
            if unpriced:
                lines.append(("no hours", f"no plan from the presets: {', '.join(unpriced)}"))
        parts.append(_summary(f"all: {done}/{n} runs done", lines, style="bold"))
    return Group(*parts)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("targets", nargs="*", help="Snakemake targets (tables/table10, figures/fig6, paper), grid names or "
                                              "grid files; default: every grid with artifacts")
    p.add_argument("--mode", default="local", help="grid mode: local (CPU scales) or cluster")
    p.add_argument("--tags", default="", help="comma-separated block tags, as --config tags=... (default: all runs)")
    p.add_argument("--grids-dir", default="grids")
    p.add_argument("--presets", default=None, help="Slurm presets for the plan (default slurm/presets.yaml)")
    p.add_argument("--root", default=".", help="the repository root holding runs/, results/ and logs/")
    p.add_argument("--watch", nargs="?", const=10.0, type=float, default=None, metavar="SECONDS",
                   help="refresh every SECONDS (default 10) until interrupted")
    p.add_argument("--wide", action="store_true", help="full run ids, progress bars and notes in the table, "
                                                       "however wide it gets (default: fit the terminal)")


def main(a: argparse.Namespace) -> int:
    from rich.console import Console

    root = Path(a.root)
    paths = Paths(root / "runs", root / "results", root / "logs", root / "logs" / "slurm")
    grids_dir = Path(a.grids_dir) if Path(a.grids_dir).is_absolute() else root / a.grids_dir
    tags = [t for t in a.tags.split(",") if t]
    grids = with_design_seeds(resolve_targets(a.targets, grids_dir, a.mode), paths.results)
    presets = Path(a.presets) if a.presets else None
    # the terminal's width ($COLUMNS, else 80 when piped); --wide: as wide as the rows are
    console = Console(width=100_000) if a.wide else Console()
    show = lambda: render(collect(grids, paths, presets, tags), width=console.width, wide=a.wide)  # noqa: E731
    if a.watch is None:
        console.print(show())
        return 0
    from rich.live import Live

    with Live(show(), console=console, screen=False, refresh_per_second=1) as live:
        try:
            while True:
                time.sleep(a.watch)
                live.update(show())
        except KeyboardInterrupt:
            pass
    return 0
