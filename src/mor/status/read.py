"""Reading what a run leaves on disk, and what Slurm says of its recorded jobs, for ``mor status``.

Slurm is asked through ``mor.launch.slurm_state``, the one module that asks it.

Every function here only reads, and a missing or torn file reads as "nothing yet" (None or
an empty list), never as an error: status runs beside a workflow that is writing these files.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

from mor import layout
from mor.launch.job_record import read_job_id
# status asks Slurm the launcher's way (mor.launch.slurm_state: the one module that asks it)
from mor.launch.slurm_state import SLURM_CLIENT_S, JobInfo, slurm_job_info, slurm_state  # noqa: F401

TAIL_BYTES = 64 * 1024  # enough for the last few hundred log lines
_ERROR = re.compile(r"(\w*(Error|Exception|Interrupt)\b|^error:|Traceback|Killed|CANCELLED|TIMEOUT)")


@dataclass(frozen=True)
class Paths:
    """Where the workflow keeps what status reads (all relative to the repository root)."""

    runs: Path = Path(layout.RUNS)
    results: Path = Path(layout.RESULTS)
    logs: Path = Path(layout.LOGS)
    slurm_logs: Path = Path(layout.SLURM_LOGS)

    def run_dir(self, grid: str, run_id: str) -> Path:
        return layout.run_dir(self.runs, run_id)  # the run's one home, whatever grid lists it

    def result(self, grid: str, run_id: str) -> Path:
        return layout.row_file(self.results, grid, run_id)

    def rule_log(self, grid: str, run_id: str, kind: str) -> Path:
        return layout.run_log(self.logs, grid, run_id, kind)

    def slurm_job(self, grid: str, run_id: str, kind: str) -> Path:
        return layout.job_folder(self.slurm_logs, grid, run_id, kind) / layout.JOB_RECORD_FILE


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
    job_id = read_job_id(record)
    if job_id is None:
        return None
    return (query or slurm_state)(job_id).state, job_id


def slurm_log_error(record: Path, job_id: str) -> str | None:
    """The last error line of the job's own Slurm logs (submitit's ``<job id>_<task>_log.err``
    beside ``job.json``): where a job that died on its node says why."""
    logs = sorted(record.parent.glob(f"{job_id}_*log.err"), key=lambda p: p.name)
    errors = [e for p in logs if (e := last_error_line(p))]
    return errors[-1] if errors else None


def checkpoint_step(run_dir: Path) -> int | None:
    """The step of the run's newest checkpoint (``checkpoints/step-NNNNNN``), where a restarted
    job resumes; None without one."""
    steps = []
    for d in (run_dir / layout.CHECKPOINTS_DIR).glob("step-*"):
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
