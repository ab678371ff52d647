"""The launcher under the workflow's one watcher (the ``mor-slurm`` Snakemake executor): submit and
exit, then collect once the watcher says the job ended.

Under ``executor: mor-slurm`` no launcher waits. The executor runs the rule's own shell
command twice with ``$MOR_LAUNCH_HANDOFF`` naming a small JSON file: first the launcher
submits (or re-attaches), writes the job into that file and exits; the executor's one
watcher asks Slurm about every job in flight in one batch per interval
(``mor.launch.slurm_state``); when a job has ended it writes its verdict into the file and runs
the command again, and the launcher collects the results (or fails with the same message as a
waiting launcher, ``mor.launch.slurm_submit``).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from mor.atomic import write_json_atomic
from mor.launch import job_record
from mor.launch.presets import Preset
from mor.launch.slurm_state import Pacer, Sighting, SlurmState, WatchSettings, slurm_states
from mor.launch.slurm_submit import (
    LaunchError, collect_once, results_ready, slurm_job, submit_and_wait, submit_or_reattach, vanished_message,
)

HANDOFF_ENV = "MOR_LAUNCH_HANDOFF"


def handoff_path() -> Path | None:
    value = os.environ.get(HANDOFF_ENV, "")
    return Path(value) if value else None


def read_handoff(path: Path) -> dict:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}


def write_verdict(path: Path, verdict: dict) -> None:
    """The watcher's word that the job named in the hand-off file ended (or vanished)."""
    write_json_atomic(Path(path), {**read_handoff(path), "verdict": verdict})


def job_results_ready(folder: Path, job_id: str, tasks: int) -> bool:
    """Every task of job ``job_id`` in ``folder`` has written its result file."""
    return results_ready(slurm_job(folder, job_id, tasks))


@dataclass
class InFlight:
    """One handed-off job the workflow's watcher follows: where its results land, and what
    Slurm last said of it (``last``: the verdict's state, detail and source)."""

    job_id: str
    folder: str
    tasks: int
    sighting: Sighting
    last: dict = field(default_factory=dict)


def verdicts(jobs: list[InFlight], now: float, pacer: Pacer, clock: Callable[[], float] = time.monotonic
             ) -> dict[str, dict]:
    """``{job id: verdict}`` for the jobs in flight that ended, vanished or left their results.

    Slurm is asked about all of them in ONE sacct and ONE squeue call (``slurm_states``), and
    only when ``pacer`` (the status rate limiter) allows; the result files are looked at every
    time. A vanished job's verdict carries ``vanished_s`` and the setting that bounded it.
    """
    states = {}
    if jobs and pacer.due(now):
        states = slurm_states([j.job_id for j in jobs])
        pacer.asked(now, clock())
    out = {}
    for j in jobs:
        verdict = None
        st = states.get(j.job_id)
        if st is not None:
            j.last = {"state": st.state, "detail": st.detail, "queue_answered": st.queue_answered}
            gone = None if st.finished else j.sighting.vanished(st, now)
            if st.finished:
                verdict = dict(j.last)
            elif gone is not None:
                verdict = {**j.last, "vanished_s": gone, "limit": f"mor-slurm-unknown-s={j.sighting.unknown_s:g}s"}
        if verdict is None and job_results_ready(Path(j.folder), j.job_id, j.tasks):
            verdict = dict(j.last)
        if verdict is not None:
            out[j.job_id] = verdict
    return out


def run_or_hand_off(fn: Callable[[], Any], preset: Preset, folder: Path, name: str, what: str,
                    setup: list[str] | None = None, poll_s: float | None = None) -> list | None:
    """``submit_and_wait``, or under the watcher (``$MOR_LAUNCH_HANDOFF`` set) one of its two
    steps: submit and return None, or collect the ended job the hand-off file names."""
    handoff = handoff_path()
    if handoff is None:
        return submit_and_wait(fn, preset, folder, name=name, what=what, setup=setup, poll_s=poll_s)
    folder = Path(folder).absolute()
    done = read_handoff(handoff)
    verdict = done.get("verdict")
    if verdict is None:  # step 1: submit or re-attach, tell the watcher, do not wait
        job = submit_or_reattach(fn, preset, folder, name, what, None, setup)
        write_json_atomic(handoff, {"job_id": job.job_id, "folder": str(folder), "what": what,
                                    "tasks": preset.world_size})
        return None
    job_id = str(done["job_id"])  # step 2: the watcher saw the job end
    job = slurm_job(folder, job_id, int(done["tasks"]))
    st = SlurmState(verdict.get("state", ""), verdict.get("detail", ""), bool(verdict.get("queue_answered")))
    how = f"ended ({st.state})" if st.finished else "left its results"
    print(f"Slurm job {job_id} ({what}) {how}; logs in {folder}", flush=True)
    settings = WatchSettings.resolve()
    if verdict.get("vanished_s") is not None and not results_ready(job):
        job_record.mark_collected(folder, job_id, reported=False)
        limit = verdict.get("limit") or f"MOR_LAUNCH_UNKNOWN_S={settings.unknown_s:g}s"
        raise LaunchError(vanished_message(job, what, st, float(verdict["vanished_s"]), limit))
    # the watcher marks it reported once Snakemake has the outcome (job_record.mark_reported)
    return collect_once(job, folder, what, st if st.known else None, settings.result_wait_s, reported=False)
