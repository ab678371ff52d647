"""The mor-slurm watcher marks a job's outcome reported only once Snakemake has persisted it.

Snakemake's scheduler persists a finished job (clears its outputs' incomplete marks) on its own
thread after ``report_job_success``. A workflow killed in between reruns the job as incomplete;
if the record already said "reported", the launcher would submit that job a second time instead
of adopting the one that ended (seen in CI: test_slurm_watch's job 2 resubmitted). So the mark
waits for the watcher's next check, or for the executor's shutdown."""

import json
import subprocess
import sys
from pathlib import Path

from mor.launch.job_record import record_path, reported, write_record
from mor.launch.slurm_handoff import InFlight
from mor.launch.slurm_state import Sighting
from snakemake_executor_plugin_mor_slurm import Executor, Flight


class _Told(Executor):
    """The plugin's watcher without Snakemake: what it tells the workflow is recorded."""

    def __init__(self):  # no RemoteExecutor.__init__: no workflow, no watching thread
        self.unmarked, self.told = [], []

    def report_job_success(self, info):
        self.told.append(("success", info))

    def report_job_error(self, info, msg=None, **kw):
        self.told.append(("error", info))


def test_an_outcome_is_marked_reported_one_check_after_snakemake_is_told(tmp_path):
    folder = tmp_path / "slurm" / "run"
    folder.mkdir(parents=True)
    write_record(folder, "331", "mor-probe")
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    f = Flight(cmd="x --launcher slurm", handoff=tmp_path / "h.json", log="", step="collecting", proc=proc,
               job=InFlight("331", str(folder), 1, Sighting(60.0)))
    ex = _Told()
    assert ex._step_ended(object(), f) is True and [k for k, _ in ex.told] == ["success"]
    # told, not yet persisted by Snakemake's scheduler: a restarted launcher still adopts job 331
    assert not reported(folder, "331") and "reported" not in json.loads(record_path(folder).read_text())
    ex._mark_reported()  # the next check (check_active_jobs calls it first) or shutdown
    assert reported(folder, "331") and ex.unmarked == []
    ex._mark_reported()  # nothing left to mark: marking twice changes nothing
    assert json.loads(record_path(folder).read_text())["reported"] == "331"
