"""``python -m mor status [targets or grids]``: where every run the targets need stands.

One table per grid, one row per run, then a summary line per grid and the device-hours:

    state       done          the grid's row results/runs/<grid>/<id>.parquet exists (val NLL shown)
                trained       train_summary.json exists, the eval job has not written its row
                running       Slurm says RUNNING, or (local) train_log.jsonl grew recently
                queued        Slurm says PENDING (or requeued, configuring, suspended)
                failed        Slurm says it ended without the run finishing, or the rule's log
                              (logs/runs/<id>/train.log) ends in an error: its last error line
                stopped       part-trained, nothing writing: the next workflow run resumes it
                              (at the newest checkpoints/step-N, shown)
                not started   nothing on disk yet
    progress    step / total steps (train_log.jsonl, whose last line is the last logged step)
    tok/s, ETA  mean tokens/s of the last logged steps; ETA = steps left at that speed. Runs
                that have not started show the plan's estimate instead (``~``)
    loss        last training loss; val NLL of finished runs

Hours come in three labelled kinds, never mixed in one number:

    plan        the launcher's price (``mor.launch.cost.plan_grid`` over the Slurm presets):
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

Slurm's state comes from the launcher's own queries (``mor.launch.slurm_state``) for the
job id it recorded in
``logs/slurm/<grid>/<id>/<kind>/job.json``; without Slurm clients those answer "unknown" and
the files decide. For a Slurm job the note also gives its node and elapsed time against its
limit (``sacct``, else ``squeue``) and, for a failed one, the last error line of its Slurm log.
Status only reads: it never writes a file, so it runs beside a workflow.

One job a module: ``targets`` (which grids the targets need), ``read`` (a run's files and what
Slurm says of its jobs), ``state`` (a run's state from those, every run collected), ``hours``
(the plan's price per run), ``forecast`` (the maths, pure), ``render`` (the table) and ``cli``
(the command's arguments and its ``--watch`` loop). This module names what the others export.
"""

from __future__ import annotations

from mor.status.cli import add_arguments, main
from mor.status.forecast import Forecast, forecast, forecast_grids
from mor.status.hours import plan_hours
from mor.status.read import (SLURM_CLIENT_S, TAIL_BYTES, JobInfo, Paths, checkpoint_step, last_error_line, log_tail,
                             measured_train_s, read_val_nll, slurm_job_info, slurm_job_state, slurm_log_error)
from mor.status.render import NARROW_RUN_MIN, STYLE, render, short_ids
from mor.status.state import (SPEED_WINDOW, STALE_MIN_S, STATES, GridStatus, RunStatus, collect, run_status,
                              slurm_note)
from mor.status.targets import resolve_targets, with_design_seeds

__all__ = ["NARROW_RUN_MIN", "SLURM_CLIENT_S", "SPEED_WINDOW", "STALE_MIN_S", "STATES", "STYLE", "TAIL_BYTES",
           "Forecast", "GridStatus", "JobInfo", "Paths", "RunStatus", "add_arguments", "checkpoint_step", "collect",
           "forecast", "forecast_grids", "last_error_line", "log_tail", "main", "measured_train_s", "plan_hours",
           "read_val_nll", "render", "resolve_targets", "run_status", "short_ids", "slurm_job_info",
           "slurm_job_state", "slurm_log_error", "slurm_note", "with_design_seeds"]
