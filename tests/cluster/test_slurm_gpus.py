"""GPU requests through real Slurm: the loopback cluster's node advertises 4 GPUs as a generic
resource (``GresTypes=gpu``, ``Gres=gpu:4``, gres.conf ``File=<state>/dev/nvidia[0-3]``: empty
files, so Slurm numbers the devices without this machine having any; slurm/testcluster/up.sh).

A job submitted the launcher's way (``mor.launch.slurm.submit_and_wait``: a preset from a
presets file -> ``submitit.AutoExecutor`` parameters -> sbatch ``--gpus-per-node``,
``--ntasks-per-node``, ``--cpus-per-task``) reports, from inside each of its tasks, what Slurm
granted; a request for more GPUs than the node has is refused by sbatch, and the launcher says
so instead of submitting anything.
"""

from __future__ import annotations

import functools
import subprocess

import pytest

from helpers.deadlines import deadline
from helpers.slurm_fakes import fake  # noqa: F401  (fixture: fake sbatch / sacct / squeue on PATH)

from mor.launch.presets import Preset, load_presets
from mor.launch.slurm import LaunchError, pythonpath_setup, submit_and_wait

NODE_GPUS = 4  # what up.sh advertises
REFUSED = "sbatch: error: Batch job submission failed: Requested node configuration is not available"


def _presets(path, gpus: int):
    path.write_text("defaults: {partition: debug, cpus_per_task: 1, mem_gb: 1, time_min: 5}\n"
                    f"scales:\n  tiny:\n    eval: {{gpus_per_node: 0}}\n    train: {{gpus_per_node: {gpus}}}\n")
    return load_presets(path)


def _task_env() -> functools.partial:
    """The callable each task runs: its environment as a child process sees it (``env -0``),
    picklable by reference (nothing of this test module has to be importable in the job)."""
    return functools.partial(subprocess.check_output, ["env", "-0"], text=True)


def _parse(env0: str) -> dict[str, str]:
    return dict(kv.split("=", 1) for kv in env0.split("\0") if "=" in kv)


@pytest.mark.slurm
def test_node_advertises_gpus_as_gres(slurm_cluster):
    out = subprocess.run(["sinfo", "-h", "-N", "-o", "%G"], capture_output=True, text=True, timeout=deadline(30),
                         check=True).stdout.split()
    assert out == [f"gpu:{NODE_GPUS}"], out


@pytest.mark.slurm
def test_gpus_tasks_and_cpus_a_preset_asks_for_are_granted(slurm_cluster, tmp_path):
    preset = _presets(tmp_path / "presets.yaml", gpus=2).get("tiny", "train")
    assert (preset.gpus_per_node, preset.tasks, preset.cpus_per_task) == (2, 2, 1)  # one task per GPU
    folder = tmp_path / "job"
    results = submit_and_wait(_task_env(), preset, folder, name="mor-gpus", what="gpu request",
                              setup=pythonpath_setup(), poll_s=0.5, state_poll_s=1, result_wait_s=5)
    envs = [_parse(r) for r in results]
    assert [e["SLURM_PROCID"] for e in envs] == ["0", "1"]
    for e in envs:
        assert e["SLURM_NTASKS"] == "2" and e["SLURM_NTASKS_PER_NODE"] == "2", e
        assert e["SLURM_CPUS_PER_TASK"] == "1", e
        assert e["SLURM_GPUS_PER_NODE"] == "2", e
        assert e["SLURM_GPUS_ON_NODE"] == "2", e
        assert e["SLURM_JOB_GPUS"] == "0,1", e
        assert e["CUDA_VISIBLE_DEVICES"] == "0,1", e
    sbatch = next(folder.glob("*_submission.sh")).read_text()
    assert "#SBATCH --gpus-per-node=2" in sbatch and "#SBATCH --ntasks-per-node=2" in sbatch, sbatch
    assert "#SBATCH --cpus-per-task=1" in sbatch, sbatch


@pytest.mark.slurm
def test_more_gpus_than_the_node_has_are_refused_by_sbatch(slurm_cluster, tmp_path):
    # one task, so that GPUs are the only thing asked for beyond the node (the presets file
    # ties tasks to GPUs, and 5 tasks would also exceed the node's 2 CPUs)
    preset = Preset(partition="debug", gpus_per_node=NODE_GPUS + 1, tasks_per_node=1, mem_gb=1, time_min=5)
    folder = tmp_path / "job"
    with pytest.raises(LaunchError) as err:
        submit_and_wait(_task_env(), preset, folder, name="mor-too-many-gpus", what="gpu request",
                        setup=pythonpath_setup(), poll_s=0.5, state_poll_s=1)
    msg = str(err.value)
    assert msg.startswith("Slurm refused the submission of gpu request"), msg
    assert REFUSED in msg, msg
    assert not (folder / "job.json").exists()  # nothing was submitted, nothing to re-attach to


def test_a_refused_submission_is_a_launch_error_naming_the_request(fake, tmp_path):
    """Without a cluster: sbatch exiting non-zero (here with the message Slurm gives above) fails
    the launcher with LaunchError, which it prints as one "error: ..." line, not a traceback."""
    fake.answer("sbatch", err=REFUSED + "\n", rc=1)
    preset = Preset(partition="debug", gpus_per_node=8, mem_gb=1)
    with pytest.raises(LaunchError) as err:
        submit_and_wait(_task_env(), preset, tmp_path / "job", name="mor-x", what="train of g/r1", poll_s=0.01)
    msg = str(err.value)
    assert msg.startswith(f"Slurm refused the submission of train of g/r1: {REFUSED}\n"), msg
    assert "gpus_per_node=8, tasks_per_node=8, cpus_per_task=1" in msg and "Nothing was submitted" in msg
    assert len(fake.calls("sbatch")) == 1 and fake.calls("sacct") == []
    assert not (tmp_path / "job" / "job.json").exists()
