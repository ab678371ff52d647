"""Preemption that saves, on the loopback Slurm cluster, with 2 tasks (gloo DDP) and
gradient accumulation.

A train job submitted through the real launcher (``python -m mor.launch train --launcher
slurm``) runs 2 ranks, each accumulating 2 micro-batches per optimizer step. It is sent
SIGUSR2 the way Slurm announces a preemption or a time limit (``scancel --signal=USR2``: to
every task of the job's step, which is where submitit's handler lives; ``--signal=USR2@<s>``
of the presets reaches the same tasks). Both ranks stop at the same step boundary
(``mor.train.stop``: the flag is all-reduced once per step), rank 0 writes the checkpoint of
that step, and submitit's own handler requeues the job (``mor.launch.checkpointable``). The
requeued job resumes from that checkpoint and ends with the weights, bit for bit, of the same
2-rank run trained without interruption (2 gloo ranks in this process's children: the same
reduction order as the job, so bit-identity is meaningful).

Waits on the train log and on Slurm's job state (events), never on a clock; the deadlines
only bound a hang.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch

from helpers.deadlines import deadline
from helpers.slurm_jobs import JOB_S, job_ids, job_report, launch, preempt, sacct_states, start_now, wait_for

from mor.grids import load_grid
from mor.layout import job_folder, run_dir as run_home

pytestmark = pytest.mark.slurm

STEPS = 300  # the signal is sent after the 3rd logged step: nearly all of them are ahead
GLOBAL_BATCH, DRAW, TASKS = 8, 2, 2  # 4 sequences per rank, drawn and run 2 at a time: 2 micro-batches per step


def _grid(path: Path) -> Path:
    """One tiny MoR run; no periodic checkpoint, so the only one before the end is the preemption's."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        f"name: {path.stem}\nruns:\n  - set: {{model.scale: 135M, model.variant: mor, model.num_recursions: 2}}\n"
        "modes:\n  local:\n    scale_map: {135M: tiny}\n    set:\n"
        f"      train: {{tokens: {STEPS * GLOBAL_BATCH * 16}, seq_len: 16, global_batch: {GLOBAL_BATCH}, "
        f"micro_batch: {DRAW}, checkpoint_every: 100000}}\n      eval: {{nll_tokens: 64, batch: 2}}\n")
    return path


def _presets(path: Path) -> Path:
    """2 CPU tasks of 1 core each (the node has 2). time_min 30: submitit's handler counts the
    signal as a preemption, not a time-out (it calls a job timed out after min(80%, limit - 10 min))."""
    path.write_text(
        "defaults: {partition: debug, cpus_per_task: 1, mem_gb: 1, time_min: 30, signal_delay_s: 30}\n"
        f"scales:\n  tiny:\n    train: {{gpus_per_node: 0, tasks_per_node: {TASKS}}}\n")
    return path


def _logged_steps(run_dir: Path) -> list[int]:
    log = run_dir / "train_log.jsonl"
    if not log.exists():
        return []
    return [json.loads(ln)["step"] for ln in log.read_text().splitlines() if ln.endswith("}")]


def _step_dirs(run_dir: Path) -> list[str]:
    ckpt = run_dir / "checkpoints"
    return sorted(p.name for p in ckpt.glob("step-*")) if ckpt.exists() else []


# ---------------------------------------------------------------- the uninterrupted reference
class _FakeEnv:
    """The fields of submitit.JobEnvironment that mor.launch.distributed reads."""

    def __init__(self, rank: int, world: int):
        self.global_rank, self.num_tasks, self.local_rank = rank, world, rank
        self.num_nodes, self.raw_job_id, self.hostnames = 1, "0", ["localhost"]


def _reference_rank(rank: int, world: int, port: int, kwargs: dict) -> None:
    """One rank of the same train job, inline: what each task of the Slurm job runs, minus Slurm."""
    from mor.launch import distributed
    from mor.train.job import train_job

    os.environ["MASTER_PORT"] = str(port)
    info = distributed.init_distributed("cpu", env=_FakeEnv(rank, world))
    try:
        train_job(**kwargs, dist=info)
    finally:
        distributed.shutdown()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_usr2_checkpoints_the_step_boundary_requeues_and_resumes_two_ranks_bit_identically(
        slurm_cluster, tmp_path, data_root):
    grid = _grid(tmp_path / "grids" / "pre2.yaml")
    run_id = load_grid(grid, "local").runs[0].run_id
    run_dir = run_home(tmp_path / "runs", run_id)  # a run's one home (mor.layout)
    folder = job_folder(tmp_path / "logs" / "slurm", "pre2", run_id, "train")
    launcher = launch("train", grid, run_id, tmp_path, data_root, "--launcher", "slurm",
                      "--presets", str(_presets(tmp_path / "presets.yaml")), popen=True)
    try:
        wait_for(lambda: len(_logged_steps(run_dir)) >= 3 or launcher.poll() is not None, "3 logged steps",
                 every_s=0.02)
        assert launcher.poll() is None, launcher.communicate()[0]
        jid = job_ids(tmp_path)[f"{run_id}/train"]
        seen = len(_logged_steps(run_dir))  # steps done when the signal leaves (at least)
        # rank 0 checkpoints, then submitit's handler runs `scontrol requeue`: the restart count
        # (an event that stays, not the PENDING a job may pass through between two polls); a
        # signal lost on its way is sent again
        preempt(jid, lambda: len(_logged_steps(run_dir)), launcher)
        assert launcher.poll() is None, f"{launcher.communicate()[0]}\n{job_report(jid)}"

        # Between the two sessions: one checkpoint, of the step the first session ended with.
        stopped = _logged_steps(run_dir)
        assert stopped == list(range(1, len(stopped) + 1)), stopped
        assert seen <= stopped[-1] < STEPS, (seen, stopped[-1])  # the boundary after the signal, mid-run
        assert _step_dirs(run_dir) == [f"step-{stopped[-1]:06d}"]  # no periodic checkpoint: the preemption's
        latest = json.loads((run_dir / "checkpoints" / "latest.json").read_text())
        assert latest["path"] == f"step-{stopped[-1]:06d}", latest
        assert not (run_dir / "train_summary.json").exists()

        start_now(jid)  # not Slurm's ~121 s requeue delay
        out, _ = launcher.communicate(timeout=deadline(JOB_S))
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    assert launcher.returncode == 0, out

    summary = json.loads((run_dir / "train_summary.json").read_text())
    assert summary["steps"] == STEPS and summary["world_size"] == TASKS
    assert summary["resumed_from"] == stopped[-1], summary  # resumed from it, not from 0
    # the first session logged no step past its checkpoint, so no step is redone (at most one may be)
    assert stopped[-1] - summary["resumed_from"] <= 1
    assert _logged_steps(run_dir) == list(range(1, STEPS + 1))  # no duplicated or missing rows
    config = json.loads((run_dir / "config.json").read_text())
    assert config["execution"]["world_size"] == TASKS and config["execution"]["accumulation"] == 2, config["execution"]
    assert f"resumed from {stopped[-1]}" in out

    ranks = json.loads((folder / "result.json").read_text())
    assert [r["rank"] for r in ranks] == [0, 1] and all(r["world_size"] == TASKS for r in ranks)
    assert ranks[0]["param_fingerprint"] == ranks[1]["param_fingerprint"]
    wait_for(lambda: sacct_states(jid)[-1:] == ["COMPLETED"], "sacct COMPLETED", 60)
    assert sacct_states(jid) == ["REQUEUED", "COMPLETED"]  # one job id, run twice
    log0 = (folder / f"{jid}_0_log.out").read_text()
    assert "Caught signal SIGUSR2" in log0 and "this job is preempted" in log0, log0[-3000:]
    assert "Calling checkpoint method" in log0 and f"Requeued job {jid}" in log0  # submitit's own record
    assert log0.count("Starting with JobEnvironment") == 2
    log1 = (folder / f"{jid}_1_log.out").read_text()
    assert log1.count("Starting with JobEnvironment") == 2 and "Requeued job" not in log1  # rank 0 requeues

    # The same run on 2 gloo ranks, uninterrupted, with the job's keyword arguments.
    kwargs = dict(grid=str(grid), run_id=run_id, mode="local", run_dir=str(tmp_path / "straight"),
                  data_root=str(Path(data_root).absolute()), device="auto", threads=1, parallel="ddp",
                  peak_tflops=0.0, execution={})
    torch.multiprocessing.spawn(_reference_rank, args=(TASKS, _free_port(), kwargs), nprocs=TASKS, join=True)
    straight = json.loads((tmp_path / "straight" / "train_summary.json").read_text())
    assert straight["resumed_from"] is None and straight["final_loss"] == summary["final_loss"]
    from safetensors.torch import load_file

    a = load_file(str(run_dir / "final" / "model.safetensors"))
    b = load_file(str(tmp_path / "straight" / "final" / "model.safetensors"))
    assert a.keys() == b.keys()
    assert [k for k in a if not torch.equal(a[k], b[k])] == []  # bit-identical
