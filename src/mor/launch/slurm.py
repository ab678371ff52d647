"""The launcher's Slurm interface, one name for what three modules do, each one job:

- ``mor.launch.slurm_state``: what Slurm says of jobs (the one module that asks ``sacct`` and
  ``squeue``; the vanished-job rule; the watchers' settings and rate limiter);
- ``mor.launch.slurm_submit``: submit one job (or re-attach), wait for it, collect it;
- ``mor.launch.slurm_handoff``: the same launch under the workflow's one watcher (the
  ``mor-slurm`` executor): submit and exit, collect on the watcher's verdict;
- ``mor.launch.job_record``: the ``job.json`` beside a job's logs.

What a job asks for (its ``Preset``) is ``mor.launch.presets``. Only these modules and the
launcher talk to Slurm; the Snakemake process never imports torch.
"""

from __future__ import annotations

from mor.launch.job_record import mark_reported
from mor.launch.slurm_handoff import HANDOFF_ENV, handoff_path, read_handoff, run_or_hand_off
from mor.launch.slurm_state import (
    QUEUED_STATES, RUNNING_STATES, Answer, SlurmState, WatchSettings, merge_answers, slurm_state, slurm_states,
)
from mor.launch.slurm_submit import LaunchError, pythonpath_setup, submit_and_wait

__all__ = ["HANDOFF_ENV", "QUEUED_STATES", "RUNNING_STATES", "Answer", "LaunchError", "SlurmState", "WatchSettings",
           "handoff_path", "mark_reported", "merge_answers", "pythonpath_setup", "read_handoff", "run_or_hand_off",
           "slurm_state", "slurm_states", "submit_and_wait"]
