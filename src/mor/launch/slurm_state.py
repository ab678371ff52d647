"""What Slurm says of jobs: the one module that asks ``sacct`` and ``squeue`` and reads their answers.

Everything that watches a Slurm job asks here (issue 59): the launcher waiting for its one job
(``mor.launch.slurm_submit``), the workflow's one watcher (the ``mor-slurm`` executor plugin,
one batched ``sacct`` and one ``squeue`` call for every job in flight), and ``mor status``
(a recorded job's state, node and times). So the states' meanings, the sacct-then-squeue rule,
the vanished-job rule and how often Slurm may be asked are each decided once, here.

Why our own queries rather than submitit's watcher: submitit backs off to one sacct call every
10 min and calls a job it cannot find UNKNOWN, i.e. "not done", forever. We ask sacct first,
squeue too (slurmdbd may be down, may not have the job yet, may be stale), and give a job that
neither knows a bounded grace (``Sighting``). Nothing here imports torch or submitit.
"""

from __future__ import annotations

import math
import os
import sys
import subprocess
from dataclasses import dataclass, fields
from typing import NamedTuple

# sacct / squeue states by what they say of a job, the one list (``mor status`` reads it too)
QUEUED_STATES = frozenset({"PENDING", "REQUEUED", "CONFIGURING", "SUSPENDED", "PREEMPTED", "READY", "RESIZING"})
RUNNING_STATES = frozenset({"RUNNING", "COMPLETING", "STAGE_OUT"})
# states after which a job may still run or requeue; any other state is final
INCOMPLETE_STATES = QUEUED_STATES | RUNNING_STATES | {"UNKNOWN", "REQUEUE_HOLD", "REQUEUE_FED", "STOPPED",
                                                      "SIGNALING", "RESV_DEL_HOLD"}
CLIENT_TIMEOUT_S = 30.0  # one sacct / squeue call; a hung client counts as a failed one
SLURM_CLIENT_S = 10.0  # status's calls: only bounds a hung client (status then says less)


# --------------------------------------------------------------------------------------
# How the watchers are paced: one set of settings, from the executor's profile keys / flags
# (--mor-slurm-<name>), else the launcher's environment (MOR_LAUNCH_<NAME>), else the default
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class WatchSettings:
    """How often Slurm is asked, and how long a job may go unseen or resultless.

    The executor plugin's ``ExecutorSettings`` (profile keys, ``--mor-slurm-*`` flags) and a
    launcher run by hand (``MOR_LAUNCH_*`` in its environment) resolve to this one object
    (``resolve``); the plugin passes it on to its launcher steps as ``environment()``.
    """

    state_poll_s: float = 30.0  # seconds between two questions to Slurm (one sacct + one squeue)
    poll_s: float = 2.0  # seconds between two looks for the jobs' result files
    unknown_s: float = 300.0  # a job neither sacct nor squeue knows this long has vanished
    result_wait_s: float = 15.0  # a result file may show up late on a shared file system
    steps: int = 4  # launcher steps (submit / collect) the executor runs at once

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            low = 1 if f.name == "steps" else 0
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= low):
                raise ValueError(f"Slurm watch setting {f.name}: expected a number >= {low}, got {value!r}")
        if self.state_poll_s <= 0 or self.poll_s <= 0:
            raise ValueError(f"Slurm watch settings state_poll_s and poll_s must be > 0, "
                             f"got {self.state_poll_s!r} and {self.poll_s!r}")

    @staticmethod
    def env_name(name: str) -> str:
        return f"MOR_LAUNCH_{name.upper()}"

    @classmethod
    def resolve(cls, environ=None, **given) -> "WatchSettings":
        """Each setting: ``given`` (not None) wins, else ``MOR_LAUNCH_<NAME>``, else the default.
        An environment value that a given one overrides is named on stderr, never dropped silently
        (the Slurm profile sets every setting: slurm/config.yaml)."""
        environ = os.environ if environ is None else environ
        values = {}
        for f in fields(cls):
            raw = given.get(f.name)
            env = environ.get(cls.env_name(f.name)) or None
            if raw is not None and env is not None and not _same_number(env, raw):
                print(f"warning: {cls.env_name(f.name)}={env} is overridden by the executor setting "
                      f"mor-slurm-{f.name.replace('_', '-')}={raw} (a flag or the profile's key)", file=sys.stderr)
            if raw is None:
                raw = env
            if raw is not None:
                try:
                    values[f.name] = int(raw) if f.name == "steps" else float(raw)
                except (TypeError, ValueError):
                    raise ValueError(f"Slurm watch setting {f.name}: expected a number, got {raw!r}") from None
        return cls(**values)

    def environment(self) -> dict[str, str]:
        """The settings as the launcher reads them (``MOR_LAUNCH_<NAME>``), for its subprocesses."""
        return {self.env_name(f.name): f"{getattr(self, f.name):g}" for f in fields(self)}


# --------------------------------------------------------------------------------------
# Asking: sacct, then squeue, one call each for any number of jobs
# --------------------------------------------------------------------------------------
def _same_number(a, b) -> bool:
    """Whether two settings' values are the same number (text that is no number: only if equal)."""
    try:
        return float(a) == float(b)
    except (TypeError, ValueError):
        return str(a) == str(b)


@dataclass(frozen=True)
class Answer:
    """What one Slurm client said about a job: a state, ``""`` (no such job) or ``None`` (it failed)."""

    state: str | None
    note: str


@dataclass(frozen=True)
class SlurmState:
    """A watcher's view of a job: its Slurm state (``""`` if unknown) and where that came from.

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
        return self.known and self.state not in INCOMPLETE_STATES


def _client(cmd: list[str], timeout_s: float = CLIENT_TIMEOUT_S) -> tuple[int, str, str] | None:
    """(returncode, stdout, stderr) of a Slurm client, or None if it is missing or hangs."""
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return p.returncode, p.stdout, p.stderr


def _state_of(field: str) -> str:
    """``CANCELLED by 0`` / ``RUNNING+`` -> ``CANCELLED`` / ``RUNNING``."""
    return field.split()[0].rstrip("+").upper() if field.split() else ""


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else "no output"


# sacct and squeue as asked about one job (state only) or many (job id, then state)
_ONE = {"sacct": ["sacct", "-n", "-X", "-P", "-j", "{ids}", "-o", "State"],
        "squeue": ["squeue", "-h", "-t", "all", "-j", "{ids}", "-o", "%T"]}
_MANY = {"sacct": ["sacct", "-n", "-X", "-P", "-j", "{ids}", "-o", "JobID,State"],
         "squeue": ["squeue", "-h", "-t", "all", "-j", "{ids}", "-o", "%i %T"]}
_GONE = {"sacct": "sacct has no record of it", "squeue": "squeue does not know it"}


def parse_states(stdout: str, job_ids: list[str], keyed: bool = True) -> dict[str, str]:
    """``{job id: state}`` from a client's lines: ``<id> <state>`` (or ``<id>|<state>``), or
    the state alone when one job was asked in the state-only format (``keyed`` false).

    The last listed record of a job wins (a requeued job's newest record comes last).
    """
    seen: dict[str, str] = {}
    for line in stdout.splitlines():
        if not line.strip():
            continue
        if not keyed:
            jid, state = job_ids[0], line
        else:
            jid, _, state = line.strip().replace("|", " ", 1).partition(" ")
        if jid and _state_of(state):
            seen[jid] = _state_of(state)
    return seen


def ask(tool: str, job_ids: list[str], keyed: bool = True) -> dict[str, Answer]:
    """Run ``tool`` (sacct or squeue) ONCE for every job; ``{job id: Answer}``, ``""`` for a job it
    does not list, ``None`` for every job when the client failed (squeue's "invalid job id" is
    an answer: slurmctld holds none of them). ``keyed`` false: one job, state-only format."""
    if not keyed and len(job_ids) != 1:
        raise ValueError(f"the state-only format names one job, not {len(job_ids)}")
    template = _MANY[tool] if keyed else _ONE[tool]
    out = _client([a.replace("{ids}", ",".join(job_ids)) for a in template])
    if out is None:
        return {j: Answer(None, f"{tool} did not run or timed out") for j in job_ids}
    rc, stdout, stderr = out
    if rc != 0 and not (tool == "squeue" and "invalid job id" in stderr.lower()):
        return {j: Answer(None, f"{tool} failed: {_last_line(stderr)}") for j in job_ids}
    seen = parse_states(stdout, job_ids, keyed) if rc == 0 else {}
    return {j: Answer(seen.get(j, ""), f"{tool}: {seen[j]}" if j in seen else _GONE[tool]) for j in job_ids}


def merge_answers(acct: Answer, queue: Answer) -> SlurmState:
    """One job's state from what sacct and squeue said of it: squeue's whenever slurmctld holds the job.

    sacct alone is not enough: it may be down, may not have the job yet, may still say
    RUNNING for a job the controller no longer holds, and while a preempted job is being
    requeued its record can read FAILED although the job is PENDING again (seen on the test
    cluster). squeue alone is not enough either: it forgets an ended job after MinJobAge.
    """
    detail = f"{acct.note}; {queue.note}"
    if queue.state:
        return SlurmState(queue.state, detail, queue_answered=True)
    if queue.state == "" and acct.state in INCOMPLETE_STATES:  # stale database: the controller has no such job
        return SlurmState("", detail, queue_answered=True)
    if acct.state:  # the controller forgot an ended job, or is unreachable: trust the database
        return SlurmState(acct.state, detail, queue_answered=queue.state == "")
    return SlurmState("", detail, queue_answered=queue.state == "")


def slurm_states(job_ids: list[str]) -> dict[str, SlurmState]:
    """Every job's state from ONE sacct and ONE squeue call, whatever their number: what the
    workflow's watcher asks once per interval."""
    ids = sorted(set(map(str, job_ids)), key=lambda j: (len(j), j))
    if not ids:
        return {}
    acct, queue = ask("sacct", ids), ask("squeue", ids)
    return {j: merge_answers(acct[j], queue[j]) for j in ids}


def slurm_state(job_id: str) -> SlurmState:
    """One job's state (sacct, then squeue, state-only format): what a launcher waiting for its
    one job, or re-attaching to it, asks."""
    jid = str(job_id)
    return merge_answers(ask("sacct", [jid], keyed=False)[jid], ask("squeue", [jid], keyed=False)[jid])


class JobInfo(NamedTuple):
    """Where and how long a Slurm job ran, as Slurm prints them ("" when it does not say)."""

    node: str = ""
    elapsed: str = ""  # [D-]HH:MM:SS
    limit: str = ""


def slurm_job_info(job_id: str) -> JobInfo | None:
    """Node, elapsed time and time limit of a Slurm job: sacct first (it remembers ended jobs),
    else squeue; None when neither answers (no Slurm clients here, slurmdbd down)."""
    for cmd in (["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "NodeList,Elapsed,Timelimit"],
                ["squeue", "-h", "-j", job_id, "-o", "%N|%M|%l"]):
        out = _client(cmd, SLURM_CLIENT_S)
        lines = [ln for ln in out[1].splitlines() if ln.strip()] if out else []
        if out and out[0] == 0 and lines:
            node, elapsed, limit = (part.strip() for part in (lines[-1].split("|") + ["", ""])[:3])
            return JobInfo("" if node in ("None assigned", "(null)") else node, elapsed, limit)
    return None


# --------------------------------------------------------------------------------------
# Deciding: when a job has ended or vanished, and when Slurm may be asked again
# --------------------------------------------------------------------------------------
@dataclass
class Sighting:
    """The vanished-job rule for one job, the same for the waiting launcher and the watcher.

    A job that neither sacct nor squeue has known for ``unknown_s`` seconds in a row (cancelled
    and forgotten while slurmdbd was down, lost with its node) has vanished; seen again, its
    grace starts over. A caller still looks for the job's results before calling it gone.
    """

    unknown_s: float
    unknown_since: float | None = None

    def unknown_for(self, st: SlurmState, now: float) -> float | None:
        """Seconds the job has gone unknown after this answer (None while Slurm knows it)."""
        if st.known:
            self.unknown_since = None
            return None
        if self.unknown_since is None:
            self.unknown_since = now
        return now - self.unknown_since

    def vanished(self, st: SlurmState, now: float) -> float | None:
        """How long it has gone unknown once that reaches ``unknown_s``, else None."""
        gone = self.unknown_for(st, now)
        return gone if gone is not None and gone >= self.unknown_s else None


@dataclass
class Pacer:
    """The status rate limiter: when the watcher may ask Slurm (one sacct + one squeue) again.

    No sooner than ``interval_s`` after the last ask, nor than Snakemake's
    ``--max-status-checks-per-second`` allows (``max_per_s``), nor than ``slow_factor`` times
    the last ask's own duration: a slurmdbd that takes 10 s to answer is asked every 100 s, so a
    struggling controller is never spending more than a tenth of its time on this workflow.
    The executor calls the result-file and launcher-step checks far more often; only this
    decides when Slurm itself is asked.
    """

    interval_s: float
    max_per_s: float = math.inf
    slow_factor: float = 10.0
    next_at: float = 0.0
    asks: int = 0

    def due(self, now: float) -> bool:
        return now >= self.next_at

    def asked(self, started: float, ended: float) -> None:
        self.asks += 1
        floor = 1.0 / self.max_per_s if self.max_per_s > 0 else 0.0
        self.next_at = started + max(self.interval_s, floor, self.slow_factor * max(0.0, ended - started))
