"""Slurm faults never hang the launcher and never double-submit a run.

Without a cluster: the launcher's decisions (what a job's state is, whether to re-attach,
resubmit or refuse, when a job has vanished) against fake ``sacct`` / ``squeue`` /
``sbatch`` executables on PATH that answer what each test writes for them.

On the loopback cluster (slurm/testcluster, opt-in with MOR_TESTS): a train job cancelled
hard mid-training fails its launcher within a minute naming the job and its log; with
slurmdbd stopped (sacct fails) a killed launcher's job is re-attached through squeue, not
submitted twice, and its cancellation still fails the launcher; a re-run after either
resumes from the run's last checkpoint.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers.deadlines import deadline
from helpers.paths import REPO
from helpers.slurm_cluster import restart_cluster, slurm_tests_enabled, stop_daemon
from helpers.slurm_fakes import NEW_ID, fake  # noqa: F401  (fixture: fake sbatch / sacct / squeue on PATH)
from helpers.slurm_jobs import job_ids, launch, sacct_states, wait_for, write_grid, write_presets
from submitit.core.utils import JobPaths, cloudpickle_dump

from mor.grids import load_grid
from mor.launch.presets import Preset
from mor.launch.slurm import (
    HANDOFF_ENV, LaunchError, mark_reported, run_or_hand_off, slurm_state, slurm_states, submit_and_wait,
)

DB_DOWN = "sacct: error: Problem talking to the database: Connection refused"
NO_CTLD = "slurm_load_jobs error: Unable to contact slurm controller (connect failure)"
INVALID = "slurm_load_jobs error: Invalid job id specified"


# ------------------------------------------------------------------ fake Slurm clients on PATH


def paths(folder: Path, job_id: str = NEW_ID, task: int = 0) -> JobPaths:
    return JobPaths(folder, job_id=job_id, task_id=task)


def write_result(folder: Path, value, job_id: str = NEW_ID, outcome: str = "success", task: int = 0) -> None:
    """What submitit's job writes when the callable returns (or raises: outcome "error", a traceback)."""
    cloudpickle_dump((outcome, value), paths(folder, job_id, task).result_pickle)


def record(folder: Path, job_id: str) -> Path:
    """The job.json an earlier launcher left behind."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "job.json").write_text(json.dumps({"job_id": job_id, "name": "mor-train-r1", "submitted": 0}))
    return folder / "job.json"


def run(folder: Path, tasks: int = 1, **kw) -> list:
    # binary fractions, so that the virtual clock's sums are exact
    kw = {"poll_s": 1 / 16, "state_poll_s": 1 / 8, "unknown_s": 5.0, "result_wait_s": 0.0, **kw}
    return submit_and_wait(sum, Preset(partition="debug", tasks_per_node=tasks), folder, name="mor-train-r1",
                           what="train of g/r1", **kw)


class VirtualClock:
    """The launcher's ``time`` module, with a clock that moves only when the launcher sleeps.

    ``sleep(s)`` advances the clock by ``s`` at once and first runs what ``at`` scheduled for
    the moments passed, so "unknown for 0.6 s, then seen, then a result at 1.8 s" happens in
    that order on any machine, however loaded, and the test measures the launcher's own
    notion of elapsed time instead of the wall clock. ``time()`` stays real (job records).
    """

    def __init__(self):
        self.now = 0.0
        self.events: list[tuple[float, object]] = []

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return time.time()

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        due = sorted((e for e in self.events if e[0] <= self.now), key=lambda e: e[0])
        self.events = [e for e in self.events if e[0] > self.now]
        for _, fn in due:
            fn()

    def at(self, when: float, fn) -> None:
        self.events.append((when, fn))


@pytest.fixture
def clock(monkeypatch) -> VirtualClock:
    c = VirtualClock()
    monkeypatch.setattr(sys.modules[submit_and_wait.__module__], "time", c)
    return c


# ------------------------------------------------------------------ the state of one job
@pytest.mark.parametrize("sacct, squeue, state, queue_answered, asks_squeue", [
    (("COMPLETED\n", "", 0), ("", INVALID, 1), "COMPLETED", True, True),  # ended, forgotten by the controller
    (("CANCELLED by 0\n", "", 0), ("", "", 0), "CANCELLED", True, True),
    (("COMPLETED\n", "", 0), ("", NO_CTLD, 1), "COMPLETED", False, True),  # controller down: the database
    (("FAILED\n", "", 0), ("PENDING\n", "", 0), "PENDING", True, True),  # a preempted job being requeued
    (("", DB_DOWN, 1), ("RUNNING\n", "", 0), "RUNNING", True, True),  # slurmdbd down: squeue answers
    (("", "", 0), ("PENDING\n", "", 0), "PENDING", True, True),  # not in the database yet
    (("RUNNING\n", "", 0), ("COMPLETED\n", "", 0), "COMPLETED", True, True),  # the controller is ahead
    (("RUNNING\n", "", 0), ("", INVALID, 1), "", True, True),  # stale database, the controller has no such job
    (("RUNNING\n", "", 0), ("", NO_CTLD, 1), "RUNNING", False, True),  # controller down: trust the database
    (("", DB_DOWN, 1), ("", INVALID, 1), "", True, True),
    (("", DB_DOWN, 1), ("", NO_CTLD, 1), "", False, True),  # nobody can say
])
def test_slurm_state_asks_sacct_then_squeue(fake, sacct, squeue, state, queue_answered, asks_squeue):
    fake.answer("sacct", *sacct)
    if squeue:
        fake.answer("squeue", *squeue)
    st = slurm_state("77")
    assert (st.state, st.queue_answered) == (state, queue_answered), st
    assert st.finished == (state in ("COMPLETED", "CANCELLED"))
    assert fake.calls("sacct") == ["sacct -n -X -P -j 77 -o State"]
    assert fake.calls("squeue") == (["squeue -h -t all -j 77 -o %T"] if asks_squeue else [])
    if sacct[2]:
        assert f"sacct failed: {DB_DOWN}" in st.detail  # why sacct could not answer is kept for messages


# ------------------------------------------------------------------ re-attach, resubmit or refuse
def test_reattach_when_sacct_fails_goes_through_squeue_and_submits_nothing(fake, clock, tmp_path, capsys):
    folder = tmp_path / "logs"
    record(folder, "77")
    fake.answer("sacct", err=DB_DOWN, rc=1)
    fake.answer("squeue", out="RUNNING\n")
    clock.at(0.5, lambda: write_result(folder, {"steps": 8}, job_id="77"))
    assert run(folder) == [{"steps": 8}]
    assert fake.calls("sbatch") == []
    assert "re-attached to Slurm job 77 (train of g/r1), still running" in capsys.readouterr().out
    assert json.loads((folder / "job.json").read_text())["job_id"] == "77"


def test_reattach_refuses_to_guess_when_neither_sacct_nor_squeue_answers(fake, clock, tmp_path):
    folder = tmp_path / "logs"
    rec = record(folder, "77")
    fake.answer("sacct", err=DB_DOWN, rc=1)
    fake.answer("squeue", err=NO_CTLD, rc=1)
    with pytest.raises(LaunchError) as err:
        run(folder)
    msg = str(err.value)
    assert clock.now == 0  # at once: it never waited (the unknown grace is for a job it submitted)
    assert len(fake.calls("sacct")) == len(fake.calls("squeue")) == 1
    assert msg.startswith("cannot tell whether Slurm job 77 (train of g/r1) from an earlier launch is still running")
    assert DB_DOWN in msg and NO_CTLD in msg and "not submitting a second job" in msg
    assert "`squeue -j 77`" in msg and f"delete {rec}" in msg
    assert fake.calls("sbatch") == [] and rec.exists()


@pytest.mark.parametrize("sacct, squeue", [
    (("CANCELLED by 0\n", "", 0), ("", "", 0)),  # ended: a new job resumes the run
    (("", DB_DOWN, 1), ("", INVALID, 1)),  # slurmctld holds no such job: it cannot be running
    (("", DB_DOWN, 1), ("NODE_FAIL\n", "", 0)),
])
def test_a_job_that_cannot_run_again_is_replaced_by_one_new_job(fake, tmp_path, capsys, sacct, squeue):
    folder = tmp_path / "logs"
    record(folder, "77")
    fake.answer("sacct", *sacct)
    fake.answer("squeue", *squeue)
    write_result(folder, 5050)  # the new job's result, there at once
    assert run(folder) == [5050]
    assert len(fake.calls("sbatch")) == 1
    assert json.loads((folder / "job.json").read_text())["job_id"] == NEW_ID
    assert f"submitted Slurm job {NEW_ID} (train of g/r1)" in capsys.readouterr().out


# ------------------------------------------------------------------ waiting: bounded, and never for nothing
def test_a_job_neither_sacct_nor_squeue_knows_fails_after_the_unknown_grace(fake, clock, tmp_path, monkeypatch):
    """MOR_LAUNCH_UNKNOWN_S bounds the wait for a job that vanished (cancelled and forgotten
    while slurmdbd was down, lost with its node)."""
    monkeypatch.setenv("MOR_LAUNCH_UNKNOWN_S", "1")
    fake.answer("sacct", out="")
    fake.answer("squeue", err=INVALID, rc=1)
    folder = tmp_path / "logs"
    with pytest.raises(LaunchError) as err:
        run(folder, unknown_s=None)
    assert clock.now == 1.0  # the grace, exactly: Slurm asked every 1/8 s from 0
    msg = str(err.value)
    assert msg.startswith(f"Slurm job {NEW_ID} (train of g/r1) vanished: neither sacct nor squeue has known it for ")
    assert "sacct has no record of it; squeue does not know it" in msg and "MOR_LAUNCH_UNKNOWN_S=1s" in msg
    assert f"Slurm log: {paths(folder).stderr}" in msg and f"`squeue -j {NEW_ID}`" in msg
    assert len(fake.calls("squeue")) == 9  # asked at 0, 1/8, ..., 1 s: again and again, not once


def test_a_job_squeue_knows_is_waited_for_past_the_grace(fake, clock, tmp_path):
    """sacct failing all along is no reason to give up on a job the controller still runs."""
    fake.answer("sacct", err=DB_DOWN, rc=1)
    fake.answer("squeue", out="RUNNING\n")
    folder = tmp_path / "logs"
    clock.at(1.5, lambda: write_result(folder, 7))
    assert run(folder, unknown_s=0.3) == [7]
    assert clock.now == 1.5  # five graces long, and returned with the result


def test_the_grace_restarts_when_the_job_is_seen_again(fake, clock, tmp_path):
    """A controller that forgets the job for less than the grace (restart, slow answer) is tolerated."""
    fake.answer("sacct", err=DB_DOWN, rc=1)
    fake.answer("squeue", err=NO_CTLD, rc=1)
    folder = tmp_path / "logs"
    clock.at(0.65, lambda: fake.answer("squeue", out="RUNNING\n"))
    clock.at(1.25, lambda: fake.answer("squeue", err=NO_CTLD, rc=1))
    clock.at(1.85, lambda: write_result(folder, 1))
    # unknown 0-0.75 s (seen at the ask after 0.65) and 1.25-1.875 s: 1.375 s in all, never 1 s in a row
    assert run(folder, unknown_s=1.0) == [1]
    assert clock.now == 1.875  # the first look for results after 1.85 s


def test_a_job_that_ended_without_a_result_fails_at_once_with_its_state_and_log(fake, clock, tmp_path):
    fake.answer("sacct", err=DB_DOWN, rc=1)
    fake.answer("squeue", out="CANCELLED\n")
    folder = tmp_path / "logs"
    folder.mkdir()
    log = paths(folder).stderr
    log.write_text(f"step 10 loss 5.1\nslurmstepd: error: *** JOB {NEW_ID} ON vm CANCELLED AT 2025-01-01 ***\n")
    with pytest.raises(LaunchError) as err:
        run(folder)
    assert clock.now == 0 and len(fake.calls("squeue")) == 1  # at the first answer, without waiting
    msg = str(err.value)
    assert msg.startswith(f"Slurm job {NEW_ID} (train of g/r1) failed: no result (Slurm state CANCELLED; ")
    assert f"sacct failed: {DB_DOWN}; squeue: CANCELLED" in msg
    assert f"Slurm log: {log}" in msg and f"    slurmstepd: error: *** JOB {NEW_ID} ON vm CANCELLED" in msg


def test_a_rank_that_raised_is_the_reported_cause(fake, tmp_path):
    """Rank 1 raised and rank 0 left nothing (killed waiting for it): the traceback is the cause."""
    fake.answer("sacct", out="FAILED\n")
    folder = tmp_path / "logs"
    folder.mkdir()
    write_result(folder, "Traceback (most recent call last):\n  File \"x.py\", line 1\nValueError: token file corrupt\n",
                 outcome="error", task=1)
    with pytest.raises(LaunchError) as err:
        run(folder, tasks=2)
    msg = str(err.value)
    assert msg.startswith(f"Slurm job {NEW_ID} (train of g/r1) failed: ValueError: token file corrupt\n")
    assert f"Slurm log: {paths(folder, task=1).stderr}" in msg and '    File "x.py", line 1' in msg


def test_all_ranks_results_are_returned_in_rank_order(fake, tmp_path):
    fake.answer("sacct", err=DB_DOWN, rc=1)
    fake.answer("squeue", err=NO_CTLD, rc=1)  # Slurm unreachable throughout: the results decide
    folder = tmp_path / "logs"
    folder.mkdir()
    for task in (1, 0):
        write_result(folder, {"rank": task}, task=task)
    assert run(folder, tasks=2) == [{"rank": 0}, {"rank": 1}]


# ------------------------------------------------------------------ the workflow's one watcher (executor mor-slurm)
def test_the_states_of_many_jobs_come_from_one_sacct_and_one_squeue_call(fake):
    fake.answer("sacct", out="101|COMPLETED\n102|RUNNING\n103|FAILED\n104|CANCELLED by 0\n")
    fake.answer("squeue", out="102 RUNNING\n103 PENDING\n")
    ids = [str(i) for i in range(101, 106)]
    st = slurm_states(ids + ["101"])
    assert fake.calls("sacct") == ["sacct -n -X -P -j 101,102,103,104,105 -o JobID,State"]
    assert fake.calls("squeue") == ["squeue -h -t all -j 101,102,103,104,105 -o %i %T"]
    # per job, the rule of slurm_state: the controller's live answer wins, else the database's
    assert {j: s.state for j, s in st.items()} == {"101": "COMPLETED", "102": "RUNNING", "103": "PENDING",
                                                   "104": "CANCELLED", "105": ""}
    assert [j for j, s in st.items() if s.finished] == ["101", "104"]
    assert st["105"].queue_answered and "sacct has no record of it; squeue does not know it" in st["105"].detail


def test_batched_states_fall_back_to_squeue_when_sacct_fails(fake):
    fake.answer("sacct", err=DB_DOWN, rc=1)
    fake.answer("squeue", out="7 RUNNING\n")
    st = slurm_states(["7", "8"])
    assert (st["7"].state, st["8"].state) == ("RUNNING", "")
    assert st["8"].queue_answered and f"sacct failed: {DB_DOWN}" in st["8"].detail
    fake.answer("squeue", err=NO_CTLD, rc=1)  # neither answers: unknown, and not "gone"
    st = slurm_states(["7"])
    assert st["7"].state == "" and not st["7"].queue_answered


def test_a_job_that_ended_unwatched_with_its_results_is_collected_once_not_resubmitted(fake, tmp_path, capsys):
    """Snakemake killed, the job finished meanwhile: the next launch adopts it without asking
    Slurm; once its outcome has been read, a later launch (changed params) submits anew."""
    folder = tmp_path / "logs"
    record(folder, "77")
    write_result(folder, {"steps": 8}, job_id="77")
    fake.answer("sacct", out="COMPLETED\n")
    assert run(folder) == [{"steps": 8}]
    assert fake.calls("sbatch") == [] and fake.calls("sacct") == []
    rec = json.loads((folder / "job.json").read_text())
    assert rec["collected"] == rec["reported"] == "77"  # this launcher waited: it reports what it collects
    assert "re-attached to Slurm job 77" in capsys.readouterr().out
    write_result(folder, 5050)  # the new job's result
    assert run(folder) == [5050]
    assert len(fake.calls("sbatch")) == 1 and json.loads((folder / "job.json").read_text())["job_id"] == NEW_ID


def test_a_job_whose_failure_was_read_is_not_adopted_again(fake, tmp_path):
    folder = tmp_path / "logs"
    record(folder, "77")
    write_result(folder, "Traceback\nValueError: boom\n", job_id="77", outcome="error")
    with pytest.raises(LaunchError, match="Slurm job 77 .* failed: ValueError: boom"):
        run(folder)
    fake.answer("sacct", out="FAILED\n")
    write_result(folder, 1)
    assert run(folder) == [1] and len(fake.calls("sbatch")) == 1  # the re-run submits a new job


def test_handed_off_launch_submits_and_returns_then_collects_on_the_verdict(fake, tmp_path, monkeypatch, capsys):
    """Under the watcher the launcher never waits: step 1 submits and names the job in the
    hand-off file; step 2 (the watcher's verdict written there) collects it."""
    handoff = tmp_path / "h.json"
    monkeypatch.setenv(HANDOFF_ENV, str(handoff))
    folder = tmp_path / "logs"
    preset = Preset(partition="debug")
    assert run_or_hand_off(sum, preset, folder, name="mor-train-r1", what="train of g/r1") is None
    h = json.loads(handoff.read_text())
    assert h == {"job_id": NEW_ID, "folder": str(folder), "what": "train of g/r1", "tasks": 1}
    assert fake.calls("sacct") == fake.calls("squeue") == [] and len(fake.calls("sbatch")) == 1
    write_result(folder, 42)
    handoff.write_text(json.dumps({**h, "verdict": {"state": "COMPLETED", "detail": "sacct: COMPLETED"}}))
    assert run_or_hand_off(sum, preset, folder, name="mor-train-r1", what="train of g/r1") == [42]
    assert f"Slurm job {NEW_ID} (train of g/r1) ended (COMPLETED)" in capsys.readouterr().out
    assert len(fake.calls("sbatch")) == 1 and fake.calls("sacct") == []


def test_a_collected_outcome_snakemake_never_got_is_collected_again_not_resubmitted(fake, tmp_path, monkeypatch):
    """Snakemake killed between the watcher's collect step and its report: the re-run collects
    the same job again; once the watcher has reported it, a re-run (forced) submits anew."""
    handoff = tmp_path / "h.json"
    monkeypatch.setenv(HANDOFF_ENV, str(handoff))
    folder = tmp_path / "logs"
    record(folder, "77")
    write_result(folder, 8, job_id="77")
    handoff.write_text(json.dumps({"job_id": "77", "folder": str(folder), "what": "w", "tasks": 1,
                                   "verdict": {"state": "COMPLETED"}}))
    assert run_or_hand_off(sum, Preset(partition="debug"), folder, name="n", what="w") == [8]
    rec = json.loads((folder / "job.json").read_text())
    assert rec["collected"] == "77" and "reported" not in rec
    handoff.unlink()  # the restarted workflow's first step
    assert run_or_hand_off(sum, Preset(partition="debug"), folder, name="n", what="w") is None
    assert json.loads(handoff.read_text())["job_id"] == "77" and fake.calls("sbatch") == []
    mark_reported(folder, "77")
    handoff.unlink()
    fake.answer("sacct", out="COMPLETED\n")
    assert run_or_hand_off(sum, Preset(partition="debug"), folder, name="n", what="w") is None
    assert json.loads(handoff.read_text())["job_id"] == NEW_ID and len(fake.calls("sbatch")) == 1


def test_handed_off_job_that_vanished_fails_with_the_waiting_launchers_message(fake, tmp_path, monkeypatch):
    handoff = tmp_path / "h.json"
    monkeypatch.setenv(HANDOFF_ENV, str(handoff))
    folder = tmp_path / "logs"
    record(folder, NEW_ID)
    handoff.write_text(json.dumps({"job_id": NEW_ID, "folder": str(folder), "what": "train of g/r1", "tasks": 1,
                                   "verdict": {"state": "", "detail": "sacct has no record of it; squeue does not "
                                               "know it", "queue_answered": True, "vanished_s": 301}}))
    with pytest.raises(LaunchError) as err:
        run_or_hand_off(sum, Preset(partition="debug"), folder, name="mor-train-r1", what="train of g/r1")
    msg = str(err.value)
    assert msg.startswith(f"Slurm job {NEW_ID} (train of g/r1) vanished: neither sacct nor squeue has known it for 301s")
    assert f"Slurm log: {paths(folder).stderr}" in msg and fake.calls("sbatch") == []


# ------------------------------------------------------------------ the opt-in
@pytest.mark.parametrize("value, enabled", [
    (None, False), ("", False), ("all", True), ("slurm", True), ("slow, slurm", True), ("ALL", True),
    ("slurmish", False), ("slow", False),
])
def test_slurm_tests_are_opt_in_through_mor_tests(monkeypatch, value, enabled):
    if value is None:
        monkeypatch.delenv("MOR_TESTS", raising=False)
    else:
        monkeypatch.setenv("MOR_TESTS", value)
    assert slurm_tests_enabled() is enabled


def test_without_mor_tests_the_slurm_fixture_skips_before_starting_anything(tmp_path):
    """A plain pytest run (even as root) neither installs packages nor starts daemons: up.sh
    would create its state dir first, so that dir must not appear."""
    state = tmp_path / "state"
    env = {k: v for k, v in os.environ.items() if k != "MOR_TESTS"}
    env.update(MOR_SLURM_STATE=str(state), PYTHONPATH=str(REPO / "src"))
    proc = subprocess.run([sys.executable, "-m", "pytest", str(REPO / "tests" / "cluster" / "test_slurm_cluster.py"),
                           "-q", "-rs",
                           "-p", "no:cacheprovider", "-k", "returns_result"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=deadline(120), check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 skipped" in proc.stdout and "MOR_TESTS=all bash scripts/test.sh" in proc.stdout, proc.stdout
    assert not state.exists()


# ------------------------------------------------------------------ on the loopback cluster

FAIL_WITHIN_S = 60  # from the fault to the launcher's exit: a deadline that bounds a hang, not a timing
# The job is frozen (scontrol suspend) as soon as its first checkpoint shows, so it is still
# training when cancelled however fast this machine is; what remains is the re-run's work.
STEPS, EVERY = 600, 20


def _squeue(job_id: str) -> str:
    return subprocess.run(["squeue", "-h", "-t", "all", "-j", job_id, "-o", "%T"], capture_output=True, text=True,
                          timeout=deadline(30), check=False).stdout.strip()


def _sacct_fails() -> bool:
    return subprocess.run(["sacct", "-n", "-X", "-j", "1"], capture_output=True, timeout=deadline(30), check=False).returncode != 0


def suspend(jid: str) -> None:
    """Freeze a running job (SIGSTOP to its processes) and wait until Slurm says SUSPENDED."""
    subprocess.run(["scontrol", "suspend", jid], check=True, timeout=deadline(30), capture_output=True)
    wait_for(lambda: _squeue(jid) == "SUSPENDED", f"job {jid} to be SUSPENDED", 60)


def _start_training(tmp_path: Path, data_root: Path, name: str):
    """A slurm train launcher in the background whose job has written a checkpoint and is
    then frozen (SUSPENDED), so it is certain to be mid-training.

    Returns (grid, run id, launcher, job id, folder of the job's logs).
    """
    grid = write_grid(tmp_path / "grids", name, steps=STEPS, tying=False, checkpoint_every=EVERY)
    run_id = load_grid(grid, "local").runs[0].run_id
    launcher = launch("train", grid, run_id, tmp_path, data_root, "--launcher", "slurm",
                      "--presets", str(write_presets(tmp_path / "presets.yaml")), popen=True)
    try:
        wait_for(lambda: (tmp_path / "runs" / run_id / "checkpoints" / "latest.json").exists()
                 or launcher.poll() is not None, "the first checkpoint", every_s=0.05)
        assert launcher.poll() is None, launcher.communicate()[0]
        jid = job_ids(tmp_path)[f"{run_id}/train"]
        suspend(jid)
    except BaseException:
        launcher.kill()
        launcher.wait()
        raise
    return grid, run_id, launcher, jid, tmp_path / "logs" / "slurm" / "runs" / run_id / "train"


def _cancel(launcher, jid: str) -> str:
    """scancel without a signal option of the suspended job (Slurm ends a suspended job at
    once, without the SIGTERM grace): the launcher's output once it has exited."""
    assert _squeue(jid) == "SUSPENDED", f"job {jid} is not frozen mid-training: {_squeue(jid)}"
    subprocess.run(["scancel", jid], check=True, timeout=deadline(30))
    out, _ = launcher.communicate(timeout=deadline(FAIL_WITHIN_S))  # TimeoutExpired: it did not notice within a minute
    return out


def _assert_rerun_resumes(tmp_path: Path, grid: Path, run_id: str, old_jid: str, data_root: Path) -> str:
    """A second launcher submits one new job, which resumes from the last checkpoint and finishes."""
    proc = launch("train", grid, run_id, tmp_path, data_root, "--launcher", "slurm",
                  "--presets", str(tmp_path / "presets.yaml"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    new = job_ids(tmp_path)[f"{run_id}/train"]
    assert new != old_jid and f"submitted Slurm job {new}" in proc.stdout, proc.stdout
    run_dir = tmp_path / "runs" / run_id
    summary = json.loads((run_dir / "train_summary.json").read_text())
    assert summary["steps"] == STEPS and EVERY <= summary["resumed_from"] < STEPS, summary
    assert f"resumed from {summary['resumed_from']}" in proc.stdout
    steps = [json.loads(x)["step"] for x in (run_dir / "train_log.jsonl").read_text().splitlines()]
    assert steps == list(range(1, STEPS + 1))  # no duplicated or missing rows
    return new


@pytest.mark.slurm
@pytest.mark.slow
def test_hard_cancelled_train_job_fails_its_launcher_within_a_minute_and_a_rerun_resumes(
        slurm_cluster, tmp_path, data_root):
    grid, run_id, launcher, jid, folder = _start_training(tmp_path, data_root, "cancel")
    try:
        out = _cancel(launcher, jid)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    assert launcher.returncode == 1, out
    assert f"error: Slurm job {jid} (train of cancel/{run_id}) failed: no result (Slurm state CANCELLED" in out
    assert f"Slurm log: {folder / f'{jid}_0_log.err'}" in out
    assert wait_for(lambda: sacct_states(jid)[-1:] == ["CANCELLED"], "sacct CANCELLED", 60)

    _assert_rerun_resumes(tmp_path, grid, run_id, jid, data_root)


@pytest.mark.slurm
@pytest.mark.slow
def test_with_slurmdbd_down_jobs_are_reattached_not_duplicated_and_faults_still_fail_fast(
        slurm_cluster, tmp_path, data_root):
    """sacct fails throughout: a SIGKILLed launcher's job is re-attached through squeue (not
    submitted twice), its hard cancellation fails the second launcher within a minute, and a
    third launcher trains the run to the end from its checkpoint. Accounting catches up
    once slurmdbd is back."""
    stop_daemon("slurmdbd")
    launchers = []
    try:
        assert _sacct_fails()
        grid, run_id, first, jid, folder = _start_training(tmp_path, data_root, "nodb")
        launchers.append(first)
        first.send_signal(signal.SIGKILL)  # no chance to cancel: the job runs on
        first.wait(timeout=deadline(30))
        second = launch("train", grid, run_id, tmp_path, data_root, "--launcher", "slurm",
                        "--presets", str(tmp_path / "presets.yaml"), popen=True)
        launchers.append(second)
        line = second.stdout.readline()
        assert line.startswith(f"re-attached to Slurm job {jid} (train of nodb/{run_id}), still running"), line
        assert job_ids(tmp_path)[f"{run_id}/train"] == jid

        out = _cancel(second, jid)
        assert second.returncode == 1, out
        assert f"error: Slurm job {jid} (train of nodb/{run_id}) failed: no result (Slurm state CANCELLED" in out
        assert "sacct failed: " in out and "squeue: CANCELLED" in out  # learned from the controller
        assert f"Slurm log: {folder / f'{jid}_0_log.err'}" in out

        new = _assert_rerun_resumes(tmp_path, grid, run_id, jid, data_root)
        assert _sacct_fails()  # all of the above without accounting
    finally:
        for p in launchers:
            if p.poll() is None:
                p.kill()
                p.wait()
        restart_cluster()
    assert wait_for(lambda: sacct_states(jid)[-1:] == ["CANCELLED"], "sacct to learn the cancellation", 60)
    assert wait_for(lambda: sacct_states(new) == ["COMPLETED"], "sacct to learn the new job", 60)
