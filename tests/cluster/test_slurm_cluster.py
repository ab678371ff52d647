"""Real-Slurm smoke tests: submitit jobs on the loopback test cluster.

The cluster comes from slurm/testcluster/up.sh via the ``slurm_cluster``
fixture (tests/conftest.py, tests/helpers/slurm_cluster.py): asked for through MOR_TESTS,
these tests fail (never skip) where it cannot be started.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.deadlines import deadline

submitit = pytest.importorskip("submitit")

pytestmark = pytest.mark.slurm

JOB_DONE_WITHIN_S = 120


def _executor(folder: Path) -> "submitit.AutoExecutor":
    ex = submitit.AutoExecutor(folder=folder, cluster="slurm")
    ex.update_parameters(slurm_partition="debug", timeout_min=2, cpus_per_task=1)
    return ex


def _wait_done(job, within_s: float) -> float:
    """Poll job.done() (result file or sacct state); return seconds waited."""
    t0, limit = time.monotonic(), deadline(within_s)  # a hang bound, scaled by the machine factor
    while not job.done():
        if time.monotonic() - t0 > limit:
            info = job.get_info(mode="force")
            pytest.fail(f"job {job.job_id} not done after {limit:.0f}s (sacct: {info})")
        time.sleep(0.5)
    return time.monotonic() - t0


def _sacct_state(job_id: str) -> str:
    out = subprocess.run(["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State"],
                         capture_output=True, text=True, timeout=deadline(30), check=True).stdout
    return out.strip().splitlines()[-1].split()[0] if out.strip() else ""


def test_submitit_job_returns_result(slurm_cluster, tmp_path):
    job = _executor(tmp_path / "submitit").submit(sum, list(range(101)))
    assert job.job_id.isdigit(), job.job_id
    _wait_done(job, JOB_DONE_WITHIN_S)
    assert job.result() == 5050
    # accounting works: the job reaches COMPLETED in slurmdbd
    end = time.monotonic() + deadline(60)
    while (state := _sacct_state(job.job_id)) != "COMPLETED":
        assert time.monotonic() < end, f"sacct state of {job.job_id}: {state!r}"
        time.sleep(0.5)


def test_scancelled_job_raises_from_result(slurm_cluster, tmp_path):
    job = _executor(tmp_path / "submitit").submit(time.sleep, 600)
    try:
        end = time.monotonic() + deadline(JOB_DONE_WITHIN_S)
        while job.get_info(mode="force").get("State") != "RUNNING":
            assert time.monotonic() < end, f"job {job.job_id} never started"
            time.sleep(0.5)

        subprocess.run(["scancel", job.job_id], check=True, timeout=deadline(30))
        _wait_done(job, JOB_DONE_WITHIN_S)  # a deadline against a hang, not a timing
        with pytest.raises(submitit.core.utils.UncompletedJobError) as err:
            job.result()
        assert "CANCELLED" in str(err.value), str(err.value)
        assert _sacct_state(job.job_id) == "CANCELLED"
    finally:  # a failed assertion must not leave a 10-minute job behind
        subprocess.run(["scancel", job.job_id], capture_output=True, timeout=deadline(30), check=False)
