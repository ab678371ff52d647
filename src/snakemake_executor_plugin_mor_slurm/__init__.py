"""``executor: mor-slurm`` (slurm/config.yaml): the workflow's one watcher of its Slurm jobs.

Snakemake finds this package by its name (``snakemake_executor_plugin_<name>``, installed with
the project). It runs the rules whose shell command is a Slurm launcher (``python -m mor.launch
<kind> ... --launcher slurm``: train, eval, lmeval, analysis, throughput, data); every other
rule says ``localrule: True`` (and the launcher rules say so too when the launcher is local), so
it runs on the node Snakemake runs on, as with the local executor.

A thin adapter: the decisions live in ``mor.launch``. A launcher job goes through three steps
(``mor.launch.slurm_handoff``): the rule's own command runs with ``$MOR_LAUNCH_HANDOFF`` set,
submits through the project's submitit ``Job`` wrapper (or re-attaches to the job an earlier
workflow left running) and exits; ``slurm_handoff.verdicts`` asks Slurm about every job in
flight with ONE ``sacct`` and ONE ``squeue`` call (``mor.launch.slurm_state``, paced by its
``Pacer``: every ``--mor-slurm-state-poll-s``, 30 s) and looks for the jobs' result files every
``--mor-slurm-poll-s`` (2 s); once a job has ended the same command runs again and collects
it: result.json and the rule's log, or the failure message with the job id and the Slurm log
path. At most ``--mor-slurm-steps`` (4) such launcher steps run at once, so the login node
holds Snakemake plus a few short-lived launchers, whatever the number of jobs in flight (the
profile's ``jobs``). The settings (``settings.ExecutorSettings``) are profile keys and flags;
the launcher steps get them as ``MOR_LAUNCH_*`` in their environment.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import AsyncGenerator, List

from snakemake_interface_common.exceptions import WorkflowError
from snakemake_interface_executor_plugins.executors.base import SubmittedJobInfo
from snakemake_interface_executor_plugins.executors.remote import RemoteExecutor
from snakemake_interface_executor_plugins.jobs import JobExecutorInterface
from snakemake_interface_executor_plugins.settings import CommonSettings

from mor.launch.job_record import mark_reported
from mor.launch.slurm_handoff import HANDOFF_ENV, InFlight, read_handoff, verdicts, write_verdict
from mor.launch.slurm_state import Pacer, Sighting
from snakemake_executor_plugin_mor_slurm.settings import ExecutorSettings

__all__ = ["Executor", "ExecutorSettings", "common_settings"]

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


def is_launcher_command(cmd: str | None) -> bool:
    return bool(cmd) and "--launcher slurm" in cmd


@dataclass
class Flight:
    """One launcher job: which step it is at, and (in flight) the Slurm job the watcher follows."""

    cmd: str
    handoff: Path
    log: str
    step: str = "submit"  # submit -> submitting -> in flight -> collect -> collecting
    proc: subprocess.Popen | None = None
    job: InFlight | None = None

    @property
    def job_id(self) -> str:
        return self.job.job_id if self.job else ""


class Executor(RemoteExecutor):
    # RemoteExecutor starts its watching thread before __post_init__ runs: this must exist by then
    ready = False

    def __post_init__(self):
        try:
            self.settings = self.workflow.executor_settings.watch()
        except ValueError as e:
            raise WorkflowError(f"mor-slurm executor settings: {e}") from None
        self.pacer = Pacer(self.settings.state_poll_s, max_per_s=self.max_status_checks_per_second)
        self.poll_s = min(self.settings.poll_s, self.settings.state_poll_s)
        self.step_env = {**os.environ, **self.settings.environment()}
        self.handoffs = Path(self.tmpdir)
        self.next_seconds_between_status_checks = 0.5
        # outcomes told to Snakemake in the previous check, marked reported in the next one: the
        # scheduler persists a finished job (clears its outputs' incomplete marks) on its own thread
        # after report_job_success, so a workflow killed in between reruns the job as incomplete;
        # its record must still let the launcher adopt the ended job rather than submit it again
        self.unmarked: list[tuple[Path, str]] = []
        self.ready = True

    # ------------------------------------------------------------------ submit
    def run_job(self, job: JobExecutorInterface):
        cmd = job.shellcmd
        if not is_launcher_command(cmd):  # a rule without `localrule: True` that is no Slurm launcher
            raise WorkflowError(f"mor-slurm runs Slurm launcher rules only (`--launcher slurm`); rule "
                                f"{job.rule.name} needs `localrule: True`")
        for f in [*job.output, *job.log]:  # the directories, not a deletion of outputs: a job that
            Path(f).parent.mkdir(parents=True, exist_ok=True)  # ended unwatched is collected, not redone
        flight = Flight(cmd=cmd, handoff=self.handoffs / f"{job.jobid}.json", log=str(job.log[0]) if job.log else "")
        self.report_job_submission(SubmittedJobInfo(job, aux={"flight": flight}))

    def _start(self, f: Flight) -> None:
        out = open(f.handoff.with_suffix(".out"), "ab")
        try:
            f.proc = subprocess.Popen(["bash", "-c", "set -euo pipefail; " + f.cmd], stdout=out,
                                      stderr=subprocess.STDOUT, start_new_session=True,
                                      env={**self.step_env, HANDOFF_ENV: str(f.handoff)})
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
    def _step_ended(self, info: SubmittedJobInfo, f: Flight) -> bool:
        """Handle a launcher step that exited; True when Snakemake has been told the job's outcome."""
        rc, f.proc = f.proc.returncode, None
        if f.step == "collecting":  # Snakemake is told now; once it has persisted that (the next
            if rc == 0:  # check, or shutdown), a later run of this rule submits anew
                self.report_job_success(info)
            else:
                self.report_job_error(info, msg=self._failure(f, rc))
            self.unmarked.append((Path(f.job.folder), f.job_id))
            return True
        h = read_handoff(f.handoff)
        if rc == 0 and h.get("job_id"):
            f.step = "in flight"
            f.job = InFlight(str(h["job_id"]), h["folder"], int(h["tasks"]), Sighting(self.settings.unknown_s))
            info.external_jobid = f.job_id
            return False
        self.report_job_error(info, msg=self._failure(f, rc))
        return True

    async def check_active_jobs(self, active_jobs: List[SubmittedJobInfo]
                                ) -> AsyncGenerator[SubmittedJobInfo, None]:
        if not self.ready:
            for info in active_jobs:
                yield info
            return
        self._mark_reported()  # the outcomes told one check ago: Snakemake has persisted them by now
        done: set[int] = set()
        for i, info in enumerate(active_jobs):  # launcher steps that ended
            f: Flight = info.aux["flight"]
            if f.proc is not None and f.proc.poll() is not None and self._step_ended(info, f):
                done.add(i)

        flying = [info.aux["flight"] for i, info in enumerate(active_jobs)
                  if i not in done and info.aux["flight"].step == "in flight"]
        ended = verdicts([f.job for f in flying], time.monotonic(), self.pacer)
        for f in flying:
            if f.job_id in ended:
                write_verdict(f.handoff, ended[f.job_id])
                f.step = "collect"

        running = sum(1 for info in active_jobs if info.aux["flight"].proc is not None)
        for i, info in enumerate(active_jobs):  # start waiting steps, a bounded number at once
            f = info.aux["flight"]
            if running >= self.settings.steps:
                break
            if i not in done and f.step in ("submit", "collect") and f.proc is None:
                self._start(f)
                running += 1
        busy = any(info.aux["flight"].step != "in flight" for i, info in enumerate(active_jobs) if i not in done)
        self.next_seconds_between_status_checks = 0.2 if busy else self.poll_s
        for i, info in enumerate(active_jobs):
            if i not in done:
                yield info

    def _mark_reported(self) -> None:
        marks, self.unmarked = self.unmarked, []
        for folder, job_id in marks:
            mark_reported(folder, job_id)

    def shutdown(self):
        """Every job's outcome is persisted once the scheduler shuts its executors down."""
        super().shutdown()
        self._mark_reported()

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
