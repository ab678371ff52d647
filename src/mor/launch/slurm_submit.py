"""Submit one Slurm job (or re-attach to the one an earlier launch left), wait for it, collect it.

The launcher run by hand (and by the profile's local executor) waits here for its one job,
asking Slurm through ``mor.launch.slurm_state`` (the one module that asks) every
``state_poll_s``; under the ``mor-slurm`` executor the launcher only submits and collects, and
the workflow's one watcher waits (``mor.launch.slurm_handoff``). Either way a failure raises
``LaunchError`` with the same message: the job, its state and its log files.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any, Callable

from mor.launch import job_record
from mor.launch.presets import Preset
from mor.launch.slurm_state import Sighting, SlurmState, WatchSettings, slurm_state


class LaunchError(RuntimeError):
    """A Slurm job failed; the message names the job, its state and its log files."""


def slurm_job(folder: Path, job_id: str, tasks: int):
    """submitit's handle on job ``job_id`` of ``tasks`` ranks whose files are in ``folder``."""
    import submitit

    return submitit.SlurmJob(folder=Path(folder), job_id=str(job_id), tasks=tuple(range(int(tasks))))


def _tasks(job) -> list:
    """One submitit job per task (rank): the job itself when it has a single task."""
    return list(getattr(job, "_sub_jobs", None) or [job])


def results_ready(job) -> bool:
    """Every task has written its result file (a value or a traceback)."""
    return all(t.paths.result_pickle.exists() for t in _tasks(job))


def _reattach(folder: Path, tasks: int, what: str = "job"):
    """The job a previous launcher submitted for this folder, if it can still run (else None).

    A launcher killed without a chance to cancel (login node reboot, SIGKILL) leaves its job
    running; re-running the workflow waits for that job instead of starting a second one
    that would write the same run directory. A job that ended with its results while nobody
    watched, or whose outcome was collected but never reached Snakemake (killed in between),
    is adopted too (collected, not computed again) until its outcome is reported. When neither
    sacct nor squeue can say whether that job still runs, this raises ``LaunchError`` rather
    than risk a duplicate.
    """
    job_id = job_record.recorded_job_id(folder)
    if job_id is None:
        return None
    job = slurm_job(folder, job_id, tasks)
    if not job_record.reported(folder, job_id) and results_ready(job):  # it ended while no workflow watched it
        return job
    st = slurm_state(job_id)
    if st.known and not st.finished:
        return job
    if st.finished or st.queue_answered:  # ended, or slurmctld does not hold it: safe to submit anew
        return None
    record = job_record.record_path(folder)
    raise LaunchError(
        f"cannot tell whether Slurm job {job_id} ({what}) from an earlier launch is still running "
        f"({st.detail}); not submitting a second job for the same run.\n"
        f"  Check `squeue -j {job_id}` and `sacct -j {job_id}` once Slurm answers: if the job is running, run "
        f"this again to wait for it (or `scancel {job_id}`); if it is gone, delete {record} and run this again.\n"
        f"  folder: {folder}")


def submit_or_reattach(fn: Callable[[], Any], preset: Preset, folder: Path, name: str, what: str,
                       python: str | None = None, setup: list[str] | None = None):
    """The job for ``folder``: the one an earlier launcher left running (or ended, uncollected), or a new one."""
    import submitit

    folder.mkdir(parents=True, exist_ok=True)
    job = _reattach(folder, preset.world_size, what)
    if job is not None:
        print(f"re-attached to Slurm job {job.job_id} ({what}), still running or not yet collected; "
              f"logs in {folder}", flush=True)
        return job
    executor = submitit.AutoExecutor(folder=folder, cluster="slurm", slurm_max_num_timeout=preset.max_timeouts,
                                     slurm_python=python)
    executor.update_parameters(**preset.submitit_parameters(name), slurm_setup=list(setup or []))
    try:
        job = executor.submit(fn)
    except submitit.core.utils.FailedJobError as e:  # sbatch exited non-zero: nothing was queued
        raise LaunchError(f"Slurm refused the submission of {what}: {str(e).strip() or 'sbatch failed'}\n"
                          f"  The preset asks for nodes={preset.nodes}, gpus_per_node={preset.gpus_per_node}, "
                          f"tasks_per_node={preset.tasks}, cpus_per_task={preset.cpus_per_task}, "
                          f"mem_gb={preset.mem_gb:g}, partition={preset.partition}; compare with "
                          f"`sinfo -N -o '%N %P %c %m %G'`. Nothing was submitted.\n  folder: {folder}") from None
    job_record.write_record(folder, job.job_id, name)
    print(f"submitted Slurm job {job.job_id} ({what}); logs in {folder}", flush=True)
    return job


def _wait(job, what: str, poll_s: float, state_poll_s: float, unknown_s: float) -> SlurmState | None:
    """Block until every task left a result (returns None) or Slurm says the job ended (its state).

    Raises ``LaunchError`` once the job has vanished (``Sighting``, the watcher's rule too) and
    no result came: a job cancelled and forgotten while slurmdbd was down, or lost with its
    node, would otherwise be waited for forever.
    """
    sighting = Sighting(unknown_s)
    next_ask = time.monotonic()
    while True:
        if results_ready(job):
            return None
        now = time.monotonic()
        if now >= next_ask:
            st = slurm_state(job.job_id)
            next_ask = now + state_poll_s
            if st.finished:
                return st
            gone = sighting.vanished(st, now)
            if gone is not None and not results_ready(job):
                raise LaunchError(vanished_message(job, what, st, gone, f"MOR_LAUNCH_UNKNOWN_S={unknown_s:g}s"))
        time.sleep(min(poll_s, state_poll_s))


def _log_paths(task) -> str:
    p = task.paths
    return f"  Slurm log: {p.stderr}\n  stdout:    {p.stdout}\n  folder:    {p.folder}\n"


def vanished_message(job, what: str, st: SlurmState, unknown_for: float, limit: str) -> str:
    """Why a job that vanished failed; ``limit`` names the setting that bounded the wait."""
    return (f"Slurm job {job.job_id} ({what}) vanished: neither sacct nor squeue has known it for "
            f"{unknown_for:.0f}s ({st.detail}) and it left no result "
            f"(the limit is {limit}).\n{_log_paths(_tasks(job)[0])}"
            f"  Check `sacct -j {job.job_id}` / `squeue -j {job.job_id}`; running this again submits a new job, "
            f"which resumes from the run's last checkpoint.")


def _tail(path: Path, n: int = 25) -> list[str]:
    try:
        return path.read_text(errors="replace").splitlines()[-n:]
    except OSError:
        return [f"(no {path.name})"]


def _failure_message(task, job_id: str, what: str, cause: str, trace: list[str]) -> str:
    """One line saying what went wrong, then the log paths, then the tail of the traceback."""
    tail = "\n".join("    " + ln for ln in trace[-25:])
    return (f"Slurm job {job_id} ({what}) failed: {cause.strip()}\n{_log_paths(task)}"
            f"  end of the job's error output:\n{tail}")


def _wait_for_file(path: Path, within_s: float) -> bool:
    """True once ``path`` exists; shared file systems may show a job's last file late."""
    deadline = time.monotonic() + within_s
    while not path.exists():
        if time.monotonic() >= deadline:
            return False
        time.sleep(min(1.0, within_s))
    return True


def _raise_if_raised(task, job_id: str, what: str, outcome: tuple[str, Any]) -> None:
    """``LaunchError`` quoting the traceback if the task's callable raised (submitit's ("error", trace))."""
    kind, value = outcome
    if kind == "error":
        trace = str(value).strip().splitlines()
        cause = next((ln for ln in reversed(trace) if ln.strip()), "an exception")
        raise LaunchError(_failure_message(task, job_id, what, cause, trace))


def _collect(job, what: str, st: SlurmState | None, result_wait_s: float) -> list:
    """Every task's return value, or ``LaunchError`` naming the first task that raised or left nothing.

    A rank's traceback is the real cause when another rank was killed waiting for it, so
    tracebacks are looked for before missing results.
    """
    from submitit.core.utils import pickle_load

    tasks = _tasks(job)
    outcomes = {i: pickle_load(t.paths.result_pickle) for i, t in enumerate(tasks) if t.paths.result_pickle.exists()}
    for i, outcome in outcomes.items():
        _raise_if_raised(tasks[i], job.job_id, what, outcome)
    for i, task in enumerate(tasks):
        if i in outcomes:
            continue
        if not _wait_for_file(task.paths.result_pickle, result_wait_s):
            state = f"{st.state}; {st.detail}" if st else "unknown"
            cause = f"no result (Slurm state {state}): killed, cancelled, out of memory or out of requeues"
            raise LaunchError(_failure_message(task, job.job_id, what, cause, _tail(task.paths.stderr)))
        outcomes[i] = pickle_load(task.paths.result_pickle)
        _raise_if_raised(task, job.job_id, what, outcomes[i])
    return [outcomes[i][1] for i in range(len(tasks))]


def collect_once(job, folder: Path, what: str, st: SlurmState | None, result_wait_s: float,
                 reported: bool = True) -> list:
    """``_collect``, and ``job.json`` marked collected whatever came of it: a re-run submits anew."""
    try:
        return _collect(job, what, st, result_wait_s)
    finally:
        job_record.mark_collected(folder, job.job_id, reported)


def submit_and_wait(fn: Callable[[], Any], preset: Preset, folder: Path, name: str, what: str,
                    python: str | None = None, setup: list[str] | None = None, poll_s: float | None = None,
                    on_submit: Callable[[str], None] | None = None, state_poll_s: float | None = None,
                    unknown_s: float | None = None, result_wait_s: float | None = None) -> list:
    """Run ``fn()`` as one Slurm job through submitit and block until it ends.

    Returns every task's return value (one per rank). Raises ``LaunchError`` naming the job,
    its final state and its log files if it fails, is cancelled, runs out of requeues, or
    vanishes (unknown to sacct and squeue for ``unknown_s``). Slurm is asked every
    ``state_poll_s``; a job Slurm says has ended gets ``result_wait_s`` for its result file
    to appear. Unset, these come from ``WatchSettings.resolve`` (MOR_LAUNCH_POLL_S /
    _UNKNOWN_S / _STATE_POLL_S / _RESULT_WAIT_S, else the defaults). SIGINT / SIGTERM to this
    process cancel the job (a user stopping the workflow), so no job outlives the workflow
    that asked for it, except after a hard kill; then the next launcher for the same folder
    re-attaches to it (``folder/job.json``).
    """
    s = WatchSettings.resolve(poll_s=poll_s, state_poll_s=state_poll_s, unknown_s=unknown_s,
                              result_wait_s=result_wait_s)
    folder = Path(folder).absolute()
    job = submit_or_reattach(fn, preset, folder, name, what, python, setup)
    if on_submit:
        on_submit(job.job_id)

    def cancel(signum, _frame):
        print(f"launcher got signal {signum}: cancelling Slurm job {job.job_id}", flush=True)
        job.cancel(check=False)
        raise SystemExit(128 + signum)

    previous = {sig: signal.signal(sig, cancel) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        st = _wait(job, what, s.poll_s, s.state_poll_s, s.unknown_s)
        return collect_once(job, folder, what, st, s.result_wait_s)
    finally:
        for sig, h in previous.items():
            signal.signal(sig, h)


def pythonpath_setup() -> list[str]:
    """sbatch lines that make ``mor`` importable in the job exactly as it is here."""
    src = Path(__file__).resolve().parents[2]
    return [f'export PYTHONPATH="{src}${{PYTHONPATH:+:$PYTHONPATH}}"']
