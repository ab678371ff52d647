"""``executor: mor-slurm`` (slurm/config.yaml): the workflow's one watcher of its Slurm jobs.

Snakemake finds this package by its name (``snakemake_executor_plugin_<name>``, installed with
the project). It runs the rules whose shell command is a Slurm launcher (``python -m mor.launch
<kind> ... --launcher slurm``: train, eval, lmeval, analysis, throughput, data); every other
rule stays on the login node as before (they are made local rules here).

No process waits per job. A launcher job goes through three steps (``mor.launch.slurm``,
"Hand-off"): the rule's own command runs with ``$MOR_LAUNCH_HANDOFF`` set, submits through the
project's submitit ``Job`` wrapper (or re-attaches to the job an earlier workflow left running)
and exits; the watcher asks Slurm about every job in flight with ONE ``sacct`` and ONE
``squeue`` call per interval (``MOR_LAUNCH_STATE_POLL_S``, 30 s), and looks for the jobs'
result files every ``MOR_LAUNCH_POLL_S`` (2 s); once a job has ended the same command runs
again and collects it: result.json and the rule's log, or the failure message with the job id
and the Slurm log path. At most ``MOR_LAUNCH_STEPS`` (default 4) such launcher steps run at
once, so the login node holds Snakemake plus a few short-lived launchers, whatever the number
of jobs in flight (the profile's ``jobs``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import AsyncGenerator, List

from snakemake_interface_executor_plugins.executors.base import SubmittedJobInfo
from snakemake_interface_executor_plugins.executors.remote import RemoteExecutor
from snakemake_interface_executor_plugins.jobs import JobExecutorInterface
from snakemake_interface_executor_plugins.settings import CommonSettings

from mor.atomic import write_json_atomic
from mor.launch.slurm import (
    HANDOFF_ENV, env_poll_s, env_state_poll_s, env_unknown_s, mark_reported, read_handoff, results_ready,
    slurm_states,
)

common_settings = CommonSettings(
    non_local_exec=True,
    implies_no_shared_fs=False,
    job_deploy_sources=False,
    pass_default_storage_provider_args=False,
    pass_default_resources_args=False,
    pass_envvar_declarations_to_cmd=False,
    auto_deploy_default_storage_provider=False,
    init_seconds_before_status_checks=0,
)

STEPS_ENV = "MOR_LAUNCH_STEPS"  # launcher steps (submit / collect) running at once


def is_launcher_command(cmd: str | None) -> bool:
    return bool(cmd) and "--launcher slurm" in cmd


@dataclass
class Flight:
    """One launcher job: which step it is at, and what the watcher knows of its Slurm job."""

    cmd: str
    handoff: Path
    log: str
    step: str = "submit"  # submit -> submitting -> in flight -> collect -> collecting
    proc: subprocess.Popen | None = None
    job_id: str = ""
    folder: str = ""
    tasks: int = 1
    unknown_since: float | None = None
    last: dict = field(default_factory=dict)


class Executor(RemoteExecutor):
    # RemoteExecutor starts its watching thread before __post_init__ runs: these must exist by then
    ready = False
    steps, state_poll_s, poll_s, unknown_s, next_ask, queries = 4, 30.0, 2.0, 300.0, 0.0, 0

    def __post_init__(self):
        launch_args = str(self.workflow.globals.get("LAUNCH_ARGS", ""))
        for rule in self.workflow.rules:  # what is not a Slurm launcher runs here, as with the local executor
            if not (rule.shellcmd and "{LAUNCH_ARGS}" in rule.shellcmd and "--launcher slurm" in launch_args):
                self.workflow._localrules.add(rule.name)
        self.steps = max(1, int(os.environ.get(STEPS_ENV, "4")))
        self.state_poll_s = env_state_poll_s()
        self.poll_s = min(env_poll_s(), self.state_poll_s)
        self.unknown_s = env_unknown_s()
        self.next_ask = 0.0
        self.handoffs = Path(self.tmpdir)
        self.queries = 0  # batched Slurm queries made (each: one sacct + one squeue)
        self.next_seconds_between_status_checks = 0.5
        self.ready = True

    # ------------------------------------------------------------------ submit
    def run_job(self, job: JobExecutorInterface):
        cmd = job.shellcmd
        if not is_launcher_command(cmd):  # a rule made local in __post_init__ never comes here
            raise RuntimeError(f"mor-slurm runs Slurm launcher rules only, not rule {job.rule.name}")
        for f in [*job.output, *job.log]:  # the directories, not a deletion of outputs: a job that
            Path(f).parent.mkdir(parents=True, exist_ok=True)  # ended unwatched is collected, not redone
        flight = Flight(cmd=cmd, handoff=self.handoffs / f"{job.jobid}.json", log=str(job.log[0]) if job.log else "")
        self.report_job_submission(SubmittedJobInfo(job, aux={"flight": flight}))

    def _start(self, f: Flight) -> None:
        out = open(f.handoff.with_suffix(".out"), "ab")
        try:
            f.proc = subprocess.Popen(["bash", "-c", "set -euo pipefail; " + f.cmd], stdout=out,
                                      stderr=subprocess.STDOUT, start_new_session=True,
                                      env={**os.environ, HANDOFF_ENV: str(f.handoff)})
        finally:
            out.close()
        f.step = "submitting" if f.step == "submit" else "collecting"

    def _failure(self, f: Flight, rc: int) -> str:
        lines = []
        for path in (f.log, str(f.handoff.with_suffix(".out"))):
            try:
                lines += Path(path).read_text(errors="replace").splitlines()
            except OSError:
                pass
        said = [ln.strip() for ln in lines if ln.strip() and any(
            k in ln for k in ("Slurm job", "Slurm log", "stdout:", "folder:", "error", "Error"))][:8]
        what = "collecting" if f.step == "collecting" else "submitting"
        head = f"Slurm job {f.job_id}: " if f.job_id else ""
        return (f"{head}the launcher failed {what} it (exit {rc}); rule log: {f.log or 'none'}\n"
                + "\n".join(said) + "\n")

    # ------------------------------------------------------------------ watch
    async def check_active_jobs(self, active_jobs: List[SubmittedJobInfo]
                                ) -> AsyncGenerator[SubmittedJobInfo, None]:
        if not self.ready:
            for info in active_jobs:
                yield info
            return
        now = time.monotonic()
        done: set[int] = set()
        for i, info in enumerate(active_jobs):  # launcher steps that ended
            f: Flight = info.aux["flight"]
            if f.proc is None or f.proc.poll() is None:
                continue
            rc, f.proc = f.proc.returncode, None
            if f.step == "collecting":  # Snakemake is told now: a later run of this rule submits anew
                if rc == 0:
                    self.report_job_success(info)
                else:
                    self.report_job_error(info, msg=self._failure(f, rc))
                mark_reported(Path(f.folder), f.job_id)
                done.add(i)
                continue
            if f.step == "submitting":
                h = read_handoff(f.handoff)
                if rc == 0 and h.get("job_id"):
                    f.step, f.job_id, f.folder, f.tasks = "in flight", str(h["job_id"]), h["folder"], int(h["tasks"])
                    info.external_jobid = f.job_id
                    continue
            self.report_job_error(info, msg=self._failure(f, rc))
            done.add(i)

        flying = [info.aux["flight"] for i, info in enumerate(active_jobs)
                  if i not in done and info.aux["flight"].step == "in flight"]
        states = {}
        if flying and now >= self.next_ask:
            states = slurm_states([f.job_id for f in flying])
            self.queries += 1
            self.next_ask = now + self.state_poll_s
        for f in flying:
            verdict = None
            st = states.get(f.job_id)
            if st is not None:
                f.last = {"state": st.state, "detail": st.detail, "queue_answered": st.queue_answered}
                if st.finished:
                    verdict = dict(f.last)
                elif st.known:
                    f.unknown_since = None
                else:
                    f.unknown_since = now if f.unknown_since is None else f.unknown_since
                    if now - f.unknown_since >= self.unknown_s:
                        verdict = {**f.last, "vanished_s": now - f.unknown_since}
            if verdict is None and results_ready(Path(f.folder), f.job_id, f.tasks):
                verdict = dict(f.last)
            if verdict is not None:
                h = read_handoff(f.handoff)
                write_json_atomic(f.handoff, {**h, "verdict": verdict})
                f.step = "collect"

        running = sum(1 for info in active_jobs if info.aux["flight"].proc is not None)
        for i, info in enumerate(active_jobs):  # start waiting steps, a bounded number at once
            f = info.aux["flight"]
            if running >= self.steps:
                break
            if i not in done and f.step in ("submit", "collect") and f.proc is None:
                self._start(f)
                running += 1
        busy = any(info.aux["flight"].step != "in flight" for i, info in enumerate(active_jobs) if i not in done)
        self.next_seconds_between_status_checks = 0.2 if busy else self.poll_s
        for i, info in enumerate(active_jobs):
            if i not in done:
                yield info

    def cancel_jobs(self, active_jobs: List[SubmittedJobInfo]):
        """The workflow was stopped: stop its launcher steps and cancel its Slurm jobs (one scancel)."""
        ids = []
        for info in active_jobs:
            f: Flight = info.aux["flight"]
            if f.proc is not None and f.proc.poll() is None:
                try:
                    os.killpg(f.proc.pid, signal.SIGTERM)
                except OSError:
                    pass
            job_id = f.job_id or str(read_handoff(f.handoff).get("job_id", ""))
            if job_id:
                ids.append(job_id)
        if ids:
            try:
                subprocess.run(["scancel", *ids], capture_output=True, timeout=60, check=False)
            except (OSError, subprocess.SubprocessError):
                pass
