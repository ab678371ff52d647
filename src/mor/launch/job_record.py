"""A Slurm job's record beside its logs (``job.json``): which job a folder's launch submitted,
and whether its outcome was collected and reported.

The launcher writes it on submission; a later launcher reads it to re-attach instead of
submitting twice, the watcher marks an outcome ``reported`` once Snakemake has it, and
``mor status`` reads the job id. One reader and writer for all of them.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from mor.atomic import write_json_atomic
from mor.layout import JOB_RECORD_FILE


def record_path(folder: Path) -> Path:
    return Path(folder) / JOB_RECORD_FILE


def write_record(folder: Path, job_id: str, name: str) -> None:
    write_json_atomic(record_path(folder), {"job_id": job_id, "name": name, "submitted": time.time()})


def read_job_id(record: Path) -> str | None:
    """The job id in a ``job.json`` record (None if none or unreadable)."""
    try:
        return str(json.loads(Path(record).read_text())["job_id"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def recorded_job_id(folder: Path) -> str | None:
    """The job id a previous launcher wrote to ``folder/job.json`` (None if none or unreadable)."""
    return read_job_id(record_path(folder))


def reported(folder: Path, job_id: str) -> bool:
    """The outcome of job ``job_id`` reached whoever asked for it (``job.json``'s ``reported``: the
    waiting launcher that collected it, or the workflow's watcher once Snakemake has it). A
    record from before these fields: ``result.json`` written after ``job.json``."""
    try:
        rec = json.loads(record_path(folder).read_text())
        if "collected" in rec or "reported" in rec:
            return str(rec.get("reported")) == str(job_id)
        return (Path(folder) / "result.json").stat().st_mtime >= record_path(folder).stat().st_mtime
    except (OSError, ValueError, TypeError):
        return False


def _mark(folder: Path, job_id: str, **fields: bool) -> None:
    """Add ``collected`` / ``reported``: ``job_id`` to ``job.json`` if it still records that job."""
    try:
        rec = json.loads(record_path(folder).read_text())
    except (OSError, ValueError):
        return
    if str(rec.get("job_id")) == str(job_id):
        write_json_atomic(record_path(folder), {**rec, **{k: str(job_id) for k, v in fields.items() if v}})


def mark_collected(folder: Path, job_id: str, reported: bool = True) -> None:
    """Job ``job_id``'s outcome was read (and, by a waiting launcher, reported): a re-run submits anew."""
    _mark(folder, job_id, collected=True, reported=reported)


def mark_reported(folder: Path, job_id: str) -> None:
    """The watcher told Snakemake job ``job_id``'s outcome: a later run submits anew instead of re-collecting."""
    _mark(folder, job_id, reported=True)
