"""Submit-and-wait for one Slurm job, and the job's state as Slurm tells it.

What a job asks for (its ``Preset``: loading, validation, lookups) is ``mor.launch.presets``.
Only this module and the launcher talk to Slurm: submitit submits and cancels, and the job's
state comes from ``sacct`` and ``squeue`` (see "Submit and wait" below for why not submitit's
watcher). The Snakemake process never imports torch or Slurm tooling.
"""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from mor.atomic import write_json_atomic
from mor.layout import JOB_RECORD_FILE
from mor.launch.presets import Preset

# sacct / squeue states by what they say of a job, the one list (``mor status`` reads it too)
QUEUED_STATES = frozenset({"PENDING", "REQUEUED", "CONFIGURING", "SUSPENDED", "PREEMPTED", "READY", "RESIZING"})
RUNNING_STATES = frozenset({"RUNNING", "COMPLETING", "STAGE_OUT"})
# states after which a job may still run or requeue; any other state is final
_INCOMPLETE = QUEUED_STATES | RUNNING_STATES | {"UNKNOWN", "REQUEUE_HOLD", "REQUEUE_FED", "STOPPED", "SIGNALING",
                                                "RESV_DEL_HOLD"}


class LaunchError(RuntimeError):
    """A Slurm job failed; the message names the job, its state and its log files."""


# --------------------------------------------------------------------------------------
# Submit and wait
# --------------------------------------------------------------------------------------
# The launcher asks Slurm itself (not submitit's watcher, which backs off to one sacct call
# every 10 min and calls a job it cannot find UNKNOWN, i.e. "not done", forever): sacct
# first, squeue when sacct fails (slurmdbd down) or does not know the job (not recorded
# yet, or lost), and a bounded grace period for a job that neither knows.
UNKNOWN_S = 300.0  # MOR_LAUNCH_UNKNOWN_S: a job neither sacct nor squeue knows this long has vanished
STATE_POLL_S = 30.0  # MOR_LAUNCH_STATE_POLL_S: seconds between two questions to Slurm
RESULT_WAIT_S = 15.0  # MOR_LAUNCH_RESULT_WAIT_S: a result file may show up late on a shared file system
_CLI_TIMEOUT_S = 30  # one sacct / squeue call; a hung client counts as a failed one


@dataclass(frozen=True)
class Answer:
    """What one Slurm client said about a job: a state, ``""`` (no such job) or ``None`` (it failed)."""

    state: str | None
    note: str


@dataclass(frozen=True)
class SlurmState:
    """The launcher's view of a job: its Slurm state (``""`` if unknown) and where that came from.

    ``queue_answered`` is true when slurmctld itself answered (squeue ran): only then does
    "unknown" mean the job cannot still be pending or running.
    """

    state: str
    detail: str
    queue_answered: bool = False

    @property
    def known(self) -> bool:
        return bool(self.state) and self.state != "UNKNOWN"

    @property
    def finished(self) -> bool:
        """Slurm says the job will not run again (COMPLETED, FAILED, CANCELLED, NODE_FAIL, ...)."""
        return self.known and self.state not in _INCOMPLETE


def _client(cmd: list[str]) -> tuple[int, str, str] | None:
    """(returncode, stdout, stderr) of a Slurm client, or None if it is missing or hangs."""
    import subprocess

    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=_CLI_TIMEOUT_S, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return p.returncode, p.stdout, p.stderr


def _first_state(stdout: str) -> str:
    """``CANCELLED by 0`` / ``RUNNING+`` -> ``CANCELLED`` / ``RUNNING``: the last listed record's state."""
    lines = [ln for ln in stdout.splitlines() if ln.strip()]
    return lines[-1].split()[0].rstrip("+").upper() if lines else ""


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else "no output"


def sacct_answer(job_id: str) -> Answer:
    """The job's state in the accounting database (slurmdbd); fails while slurmdbd is down."""
    out = _client(["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State"])
    if out is None:
        return Answer(None, "sacct did not run or timed out")
    rc, stdout, stderr = out
    if rc != 0:
        return Answer(None, f"sacct failed: {_last_line(stderr)}")
    state = _first_state(stdout)
    return Answer(state, f"sacct: {state}" if state else "sacct has no record of it")


def squeue_answer(job_id: str) -> Answer:
    """The job's state in slurmctld (``-t all``: ended jobs too, until MinJobAge forgets them)."""
    out = _client(["squeue", "-h", "-t", "all", "-j", job_id, "-o", "%T"])
    if out is None:
        return Answer(None, "squeue did not run or timed out")
    rc, stdout, stderr = out
    if rc != 0 and "invalid job id" not in stderr.lower():
        return Answer(None, f"squeue failed: {_last_line(stderr)}")
    state = _first_state(stdout) if rc == 0 else ""
    return Answer(state, f"squeue: {state}" if state else "squeue does not know it")


def slurm_state(job_id: str) -> SlurmState:
    """Ask sacct and squeue; the controller's live answer (squeue) wins whenever it has one.

    sacct alone is not enough: it may be down, may not have the job yet, may still say
    RUNNING for a job the controller no longer holds, and while a preempted job is being
    requeued its record can read FAILED although the job is PENDING again (seen on the test
    cluster). squeue alone is not enough either: it forgets an ended job after MinJobAge.
    So squeue's state is taken when slurmctld holds the job, else sacct's.
    """
    return merge_answers(sacct_answer(job_id), squeue_answer(job_id))


def merge_answers(acct: Answer, queue: Answer) -> SlurmState:
    """One job's state from what sacct and squeue said of it (``slurm_state``'s rule)."""
    detail = f"{acct.note}; {queue.note}"
    if queue.state:
        return SlurmState(queue.state, detail, queue_answered=True)
    if queue.state == "" and acct.state in _INCOMPLETE:  # stale database: the controller has no such job
        return SlurmState("", detail, queue_answered=True)
    if acct.state:  # the controller forgot an ended job, or is unreachable: trust the database
        return SlurmState(acct.state, detail, queue_answered=queue.state == "")
    return SlurmState("", detail, queue_answered=queue.state == "")


def _state_of(field: str) -> str:
    return field.split()[0].rstrip("+").upper() if field.split() else ""


def _batch(cmd: list[str], job_ids: list[str], tool: str, gone: str) -> dict[str, Answer]:
    """Run one client for every job at once; ``{job id: Answer}``, "" for the jobs it does not list."""
    out = _client(cmd)
    if out is None:
        return {j: Answer(None, f"{tool} did not run or timed out") for j in job_ids}
    rc, stdout, stderr = out
    if rc != 0 and not (tool == "squeue" and "invalid job id" in stderr.lower()):
        return {j: Answer(None, f"{tool} failed: {_last_line(stderr)}") for j in job_ids}
    seen: dict[str, str] = {}
    for line in stdout.splitlines() if rc == 0 else []:
        jid, _, state = line.strip().replace("|", " ", 1).partition(" ")
        if jid and _state_of(state):
            seen[jid] = _state_of(state)  # the last listed record wins, as in _first_state
    return {j: Answer(seen.get(j, ""), f"{tool}: {seen[j]}" if j in seen else gone) for j in job_ids}


def slurm_states(job_ids: list[str]) -> dict[str, SlurmState]:
    """``slurm_state`` for many jobs from ONE sacct and ONE squeue call, whatever their number:
    what the workflow's watcher (``mor.launch.watch``) asks Slurm once per interval."""
    ids = sorted(set(map(str, job_ids)), key=lambda j: (len(j), j))
    if not ids:
        return {}
    acct = _batch(["sacct", "-n", "-X", "-P", "-j", ",".join(ids), "-o", "JobID,State"], ids, "sacct",
                  "sacct has no record of it")
    queue = _batch(["squeue", "-h", "-t", "all", "-j", ",".join(ids), "-o", "%i %T"], ids, "squeue",
                   "squeue does not know it")
    return {j: merge_answers(acct[j], queue[j]) for j in ids}


def env_unknown_s(default: float = UNKNOWN_S) -> float:
    return float(os.environ.get("MOR_LAUNCH_UNKNOWN_S", default))


def env_state_poll_s(default: float = STATE_POLL_S) -> float:
    return float(os.environ.get("MOR_LAUNCH_STATE_POLL_S", default))


def env_result_wait_s(default: float = RESULT_WAIT_S) -> float:
    return float(os.environ.get("MOR_LAUNCH_RESULT_WAIT_S", default))


def _job_record(folder: Path) -> Path:
    return folder / JOB_RECORD_FILE


def _recorded_job_id(folder: Path) -> str | None:
    """The job id a previous launcher wrote to ``folder/job.json`` (None if none or unreadable)."""
    try:
        return str(json.loads(_job_record(folder).read_text())["job_id"])
    except (FileNotFoundError, json.JSONDecodeError, KeyError, TypeError, OSError):
        return None


def _reported(folder: Path, job_id: str) -> bool:
    """The outcome of job ``job_id`` reached whoever asked for it (``job.json``'s ``reported``: the
    waiting launcher that collected it, or the workflow's watcher once Snakemake has it). A
    record from before these fields: ``result.json`` written after ``job.json``."""
    try:
        rec = json.loads(_job_record(folder).read_text())
        if "collected" in rec or "reported" in rec:
            return str(rec.get("reported")) == str(job_id)
        return (folder / "result.json").stat().st_mtime >= _job_record(folder).stat().st_mtime
    except (OSError, ValueError, TypeError):
        return False


def _mark(folder: Path, job_id: str, **fields: bool) -> None:
    """Add ``collected`` / ``reported``: ``job_id`` to ``job.json`` if it still records that job."""
    try:
        rec = json.loads(_job_record(folder).read_text())
    except (OSError, ValueError):
        return
    if str(rec.get("job_id")) == str(job_id):
        write_json_atomic(_job_record(folder), {**rec, **{k: str(job_id) for k, v in fields.items() if v}})


def _mark_collected(folder: Path, job_id: str, reported: bool = True) -> None:
    """Job ``job_id``'s outcome was read (and, by a waiting launcher, reported): a re-run submits anew."""
    _mark(folder, job_id, collected=True, reported=reported)


def mark_reported(folder: Path, job_id: str) -> None:
    """The watcher told Snakemake job ``job_id``'s outcome: a later run submits anew instead of re-collecting."""
    _mark(folder, job_id, reported=True)


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
    import submitit

    job_id = _recorded_job_id(folder)
    if job_id is None:
        return None
    job = submitit.SlurmJob(folder=folder, job_id=job_id, tasks=tuple(range(tasks)))
    if not _reported(folder, job_id) and _results_ready(job):  # it ended while no workflow watched it
        return job
    st = slurm_state(job_id)
    if st.known and not st.finished:
        return job
    if st.finished or st.queue_answered:  # ended, or slurmctld does not hold it: safe to submit anew
        return None
    record = _job_record(folder)
    raise LaunchError(
        f"cannot tell whether Slurm job {job_id} ({what}) from an earlier launch is still running "
        f"({st.detail}); not submitting a second job for the same run.\n"
        f"  Check `squeue -j {job_id}` and `sacct -j {job_id}` once Slurm answers: if the job is running, run "
        f"this again to wait for it (or `scancel {job_id}`); if it is gone, delete {record} and run this again.\n"
        f"  folder: {folder}")


def _tasks(job) -> list:
    """One submitit job per task (rank): the job itself when it has a single task."""
    return list(getattr(job, "_sub_jobs", None) or [job])


def _results_ready(job) -> bool:
    """Every task has written its result file (a value or a traceback)."""
    return all(t.paths.result_pickle.exists() for t in _tasks(job))


def _wait(job, what: str, poll_s: float, state_poll_s: float, unknown_s: float) -> SlurmState | None:
    """Block until every task left a result (returns None) or Slurm says the job ended (its state).

    Raises ``LaunchError`` once neither sacct nor squeue has known the job for ``unknown_s``
    seconds and no result came: a job cancelled and forgotten while slurmdbd was down, or
    lost with its node, would otherwise be waited for forever.
    """
    unknown_since: float | None = None
    next_ask = time.monotonic()
    while True:
        if _results_ready(job):
            return None
        now = time.monotonic()
        if now >= next_ask:
            st = slurm_state(job.job_id)
            next_ask = now + state_poll_s
            if st.finished:
                return st
            if st.known:
                unknown_since = None
            else:
                unknown_since = now if unknown_since is None else unknown_since
                if now - unknown_since >= unknown_s and not _results_ready(job):
                    raise LaunchError(_vanished_message(job, what, st, now - unknown_since))
        time.sleep(min(poll_s, state_poll_s))


def _log_paths(task) -> str:
    p = task.paths
    return f"  Slurm log: {p.stderr}\n  stdout:    {p.stdout}\n  folder:    {p.folder}\n"


def _vanished_message(job, what: str, st: SlurmState, unknown_for: float) -> str:
    return (f"Slurm job {job.job_id} ({what}) vanished: neither sacct nor squeue has known it for "
            f"{unknown_for:.0f}s ({st.detail}) and it left no result "
            f"(the limit is MOR_LAUNCH_UNKNOWN_S={env_unknown_s():g}s).\n{_log_paths(_tasks(job)[0])}"
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


def _submit_or_reattach(fn: Callable[[], Any], preset: Preset, folder: Path, name: str, what: str,
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
    write_json_atomic(_job_record(folder), {"job_id": job.job_id, "name": name, "submitted": time.time()})
    print(f"submitted Slurm job {job.job_id} ({what}); logs in {folder}", flush=True)
    return job


def _collect_once(job, folder: Path, what: str, st: SlurmState | None, result_wait_s: float,
                  reported: bool = True) -> list:
    try:
        return _collect(job, what, st, result_wait_s)
    finally:
        _mark_collected(folder, job.job_id, reported)


def submit_and_wait(fn: Callable[[], Any], preset: Preset, folder: Path, name: str, what: str,
                    python: str | None = None, setup: list[str] | None = None, poll_s: float = 2.0,
                    on_submit: Callable[[str], None] | None = None, state_poll_s: float | None = None,
                    unknown_s: float | None = None, result_wait_s: float | None = None) -> list:
    """Run ``fn()`` as one Slurm job through submitit and block until it ends.

    Returns every task's return value (one per rank). Raises ``LaunchError`` naming the job,
    its final state and its log files if it fails, is cancelled, runs out of requeues, or
    vanishes (unknown to sacct and squeue for ``unknown_s``). Slurm is asked every
    ``state_poll_s``; a job Slurm says has ended gets ``result_wait_s`` for its result file
    to appear. Unset, these come from MOR_LAUNCH_UNKNOWN_S / _STATE_POLL_S / _RESULT_WAIT_S.
    SIGINT / SIGTERM to this process cancel the job (a user stopping the workflow), so no
    job outlives the workflow that asked for it, except after a hard kill; then the next
    launcher for the same folder re-attaches to it (``folder/job.json``).

    This is the launcher run by hand (and by the profile's local executor); under the
    ``mor-slurm`` executor the launcher hands the job to the workflow's one watcher
    instead (``run_or_hand_off``).
    """
    state_poll_s = env_state_poll_s() if state_poll_s is None else state_poll_s
    unknown_s = env_unknown_s() if unknown_s is None else unknown_s
    result_wait_s = env_result_wait_s() if result_wait_s is None else result_wait_s
    folder = Path(folder).absolute()
    job = _submit_or_reattach(fn, preset, folder, name, what, python, setup)
    if on_submit:
        on_submit(job.job_id)

    def cancel(signum, _frame):
        print(f"launcher got signal {signum}: cancelling Slurm job {job.job_id}", flush=True)
        job.cancel(check=False)
        raise SystemExit(128 + signum)

    previous = {s: signal.signal(s, cancel) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        st = _wait(job, what, poll_s, state_poll_s, unknown_s)
        return _collect_once(job, folder, what, st, result_wait_s)
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


# --------------------------------------------------------------------------------------
# Hand-off to the workflow's watcher (the mor-slurm Snakemake executor)
# --------------------------------------------------------------------------------------
# Under `executor: mor-slurm` no launcher waits. The executor runs the rule's own shell
# command twice with $MOR_LAUNCH_HANDOFF naming a small JSON file: first the launcher
# submits (or re-attaches), writes the job into that file and exits; the executor's one
# watcher asks Slurm about every job in flight in one batch per interval; when a job has
# ended it writes its verdict into the file and runs the command again, and the launcher
# collects the results (or fails with the same message as a waiting launcher).
HANDOFF_ENV = "MOR_LAUNCH_HANDOFF"


def handoff_path() -> Path | None:
    value = os.environ.get(HANDOFF_ENV, "")
    return Path(value) if value else None


def read_handoff(path: Path) -> dict:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}


def results_ready(folder: Path, job_id: str, tasks: int) -> bool:
    """Every task of job ``job_id`` in ``folder`` has written its result file."""
    import submitit

    return _results_ready(submitit.SlurmJob(folder=Path(folder), job_id=str(job_id), tasks=tuple(range(tasks))))


def run_or_hand_off(fn: Callable[[], Any], preset: Preset, folder: Path, name: str, what: str,
                    setup: list[str] | None = None, poll_s: float = 2.0) -> list | None:
    """``submit_and_wait``, or under the watcher (``$MOR_LAUNCH_HANDOFF`` set) one of its two
    steps: submit and return None, or collect the ended job the hand-off file names."""
    handoff = handoff_path()
    if handoff is None:
        return submit_and_wait(fn, preset, folder, name=name, what=what, setup=setup, poll_s=poll_s)
    import submitit

    folder = Path(folder).absolute()
    done = read_handoff(handoff)
    verdict = done.get("verdict")
    if verdict is None:  # step 1: submit or re-attach, tell the watcher, do not wait
        job = _submit_or_reattach(fn, preset, folder, name, what, None, setup)
        write_json_atomic(handoff, {"job_id": job.job_id, "folder": str(folder), "what": what,
                                    "tasks": preset.world_size})
        return None
    job_id = str(done["job_id"])  # step 2: the watcher saw the job end
    job = submitit.SlurmJob(folder=folder, job_id=job_id, tasks=tuple(range(int(done["tasks"]))))
    st = SlurmState(verdict.get("state", ""), verdict.get("detail", ""), bool(verdict.get("queue_answered")))
    how = f"ended ({st.state})" if st.finished else "left its results"
    print(f"Slurm job {job_id} ({what}) {how}; logs in {folder}", flush=True)
    if verdict.get("vanished_s") is not None and not _results_ready(job):
        _mark_collected(folder, job_id, reported=False)
        raise LaunchError(_vanished_message(job, what, st, float(verdict["vanished_s"])))
    # the watcher marks it reported once Snakemake has the outcome (mark_reported)
    return _collect_once(job, folder, what, st if st.known else None, env_result_wait_s(), reported=False)


def pythonpath_setup() -> list[str]:
    """sbatch lines that make ``mor`` importable in the job exactly as it is here."""
    src = Path(__file__).resolve().parents[2]
    return [f'export PYTHONPATH="{src}${{PYTHONPATH:+:$PYTHONPATH}}"']


def env_poll_s(default: float = 2.0) -> float:
    return float(os.environ.get("MOR_LAUNCH_POLL_S", default))
