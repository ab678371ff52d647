"""The Slurm launcher against the real loopback cluster (slurm/testcluster): a grid through
``--profile slurm``, a 2-rank DDP job, a preempted job that requeues and resumes, and a
failing job whose Slurm log path reaches the Snakemake error.

CPU scales on partition ``debug``: ``mode=local`` (tiny models, the embedded corpus) with
``launcher=slurm``, and a preset file written here in place of slurm/presets.yaml.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch

from helpers.deadlines import deadline
from helpers.procs import run_group
from mor.grids import load_grid
from mor.layout import job_folder, run_dir as run_home
from helpers.launch import single_process_reference
from helpers.paths import REPO
from helpers.slurm_jobs import (
    JOB_S, env, job_ids, job_report, launch, preempt, restarts, sacct_states, squeue_state, start_now, wait_for,
    write_grid, write_presets,
)
from helpers.workflow import reference_nll

pytestmark = pytest.mark.slurm


def snakemake(workdir: Path, *config: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"), "--profile", str(REPO / "slurm"),
           "tables/table10", "--directory", str(workdir), "--config", "mode=local", *config]
    return run_group(cmd, cwd=REPO, env=env(), timeout=deadline(2 * JOB_S))


PREEMPT_STEPS = 300  # the signal lands within a few steps of the first checkpoint (step 10)


def test_grid_through_the_slurm_profile(slurm_cluster, tmp_path, data_root):
    """(a) 2 runs -> 4 Slurm jobs (train, eval) -> parquet -> table; rerun submits nothing."""
    grids = tmp_path / "grids"
    write_grid(grids, "e2e", steps=8)
    cfg = [f"grids_dir={grids}", f"data_root={data_root}", f"presets={write_presets(tmp_path / 'presets.yaml')}"]
    proc = snakemake(tmp_path, *cfg)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]

    rows = pq.read_table(tmp_path / "results" / "e2e.parquet").to_pylist()
    assert len(rows) == 2 and {r["variant"] for r in rows} == {"vanilla", "recursive"}
    assert all(r["train_steps"] == 8 for r in rows)
    for r in rows:  # the Slurm eval scored the Slurm-trained final weights
        assert r["val_nll"] == pytest.approx(reference_nll(tmp_path, r, data_root), abs=1e-4)
    md = (tmp_path / "tables" / "table10" / "table10.md").read_text()
    assert all(r["run_id"] in md for r in rows)

    ids = job_ids(tmp_path)
    # a run's eval job folder is keyed by its eval settings (one eval per run and eval settings, issue 58)
    from mor.identity import eval_hash_of

    assert sorted(ids) == sorted(f"{r['run_id']}/{k}" for r in rows
                                 for k in ("train", f"eval-{eval_hash_of(json.loads(r['config_json']))}"))
    for key, jid in ids.items():  # every job went through Slurm and is accounted for
        states = wait_for(lambda: (s := sacct_states(jid)) and s[-1] == "COMPLETED" and s, f"sacct COMPLETED {key}", 60)
        assert states == ["COMPLETED"], (key, states)
        run_id, kind = key.split("/")
        assert (job_folder(tmp_path / "logs" / "slurm", "e2e", run_id, kind) / f"{jid}_0_log.out").exists()

    again = snakemake(tmp_path, *cfg)
    assert again.returncode == 0 and "Nothing to be done" in again.stdout + again.stderr
    assert job_ids(tmp_path) == ids  # no job submitted twice


def test_two_rank_ddp_job_equals_one_process_on_the_same_batches(slurm_cluster, tmp_path, data_root):
    """(b) nodes=1, 2 tasks: both ranks end with identical parameters, and the result equals
    one process that trains on the two ranks' micro-batches (up to float summation order)."""
    grid = write_grid(tmp_path / "grids", "ddp", steps=12, tying=False)
    run = load_grid(grid, "local").runs[0].config
    proc = launch("train", grid, run.run_id, tmp_path, data_root, "--launcher", "slurm",
                  "--presets", str(write_presets(tmp_path / "presets.yaml", tasks=2)))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    folder = job_folder(tmp_path / "logs" / "slurm", "ddp", run.run_id, "train")
    ranks = json.loads((folder / "result.json").read_text())
    assert [r["rank"] for r in ranks] == [0, 1] and all(r["world_size"] == 2 for r in ranks)
    assert ranks[0]["param_fingerprint"] == ranks[1]["param_fingerprint"]
    assert ranks[0]["final_loss"] == ranks[1]["final_loss"]  # the logged loss is the global-batch mean

    run_dir = run_home(tmp_path / "runs", run.run_id)
    losses = [json.loads(x)["loss"] for x in (run_dir / "train_log.jsonl").read_text().splitlines()]
    assert len(losses) == 12 and all(map(torch.isfinite, torch.tensor(losses)))
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3 - 0.2, losses

    from safetensors.torch import load_file

    ref, ref_summary = single_process_reference(run, tmp_path / "ref", data_root / "tokens" / "train-bpe-4096.npy", 2)
    assert ranks[0]["final_loss"] == pytest.approx(ref_summary["final_loss"], rel=1e-6)
    final = load_file(str(run_dir / "final" / "model.safetensors"))
    # Float summation order (DDP's all-reduce vs one process accumulating) moves a weight by up
    # to ~6e-6 after 12 AdamW steps (measured; Adam's normalised update amplifies it near zero
    # gradients). A wrong batch or a missing gradient moves weights by ~lr = 3e-3 a step.
    for n, p in ref.model.named_parameters():
        torch.testing.assert_close(final[n], p.detach(), rtol=1e-5, atol=2e-5, msg=n)


def test_preempted_job_requeues_and_resumes_to_the_uninterrupted_result(slurm_cluster, tmp_path, data_root):
    """(c) SIGUSR2 (what Slurm sends before a time limit or on preemption) mid-training:
    submitit checkpoints the callable and requeues the job; the requeued job resumes from the
    run's last checkpoint and ends with the loss and weights of an uninterrupted run.

    Mid-training by construction, not by timing: the job is frozen (SUSPENDED) once its first
    checkpoint shows, then resumed and signalled as soon as it trains again, with nearly all
    of its steps ahead."""
    grid = write_grid(tmp_path / "grids", "rq", steps=PREEMPT_STEPS, tying=False, checkpoint_every=10)
    run = load_grid(grid, "local").runs[0].config
    launcher = launch("train", grid, run.run_id, tmp_path, data_root, "--launcher", "slurm",
                      "--presets", str(write_presets(tmp_path / "presets.yaml")), popen=True)
    try:
        run_dir = run_home(tmp_path / "runs", run.run_id)
        wait_for(lambda: (run_dir / "checkpoints" / "latest.json").exists() or launcher.poll() is not None,
                 "the first checkpoint", every_s=0.05)
        assert launcher.poll() is None, launcher.communicate()[0]
        jid = job_ids(tmp_path)[f"{run.run_id}/train"]
        slurm_log = job_folder(tmp_path / "logs" / "slurm", "rq", run.run_id, "train") / f"{jid}_0_log.out"
        subprocess.run(["scontrol", "suspend", jid], check=True, timeout=deadline(30))
        wait_for(lambda: squeue_state(jid) == "SUSPENDED", "the job to be suspended", 60)
        assert not (run_dir / "train_summary.json").exists()  # frozen before the end
        steps_done = len((run_dir / "train_log.jsonl").read_text().splitlines())
        subprocess.run(["scontrol", "resume", jid], check=True, timeout=deadline(30))
        # slurmd resumes the step a moment after squeue says RUNNING, and a suspended step drops
        # signals: wait until the job trains again (its log grows)
        wait_for(lambda: len((run_dir / "train_log.jsonl").read_text().splitlines()) > steps_done,
                 "the job to train again", 60, every_s=0.02)
        # The requeue is an event that stays: Slurm's restart count (PENDING is a state the job
        # may pass through between two polls); a signal lost on its way is sent again.
        logged = lambda: len((run_dir / "train_log.jsonl").read_text().splitlines())  # noqa: E731
        signals = preempt(jid, logged, launcher)
        assert launcher.poll() is None, f"{launcher.communicate()[0]}\n{job_report(jid, slurm_log)}"
        start_now(jid)
        out, _ = launcher.communicate(timeout=deadline(JOB_S))
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    assert launcher.returncode == 0, f"{out}\n{job_report(jid, slurm_log)}"
    assert restarts(jid) == 1, job_report(jid, slurm_log)  # requeued once, not twice
    print(f"SIGUSR2 sent {signals} time(s)")
    summary = json.loads((run_dir / "train_summary.json").read_text())
    assert summary["steps"] == PREEMPT_STEPS and 10 <= summary["resumed_from"] < PREEMPT_STEPS, summary
    wait_for(lambda: sacct_states(jid)[-1:] == ["COMPLETED"], "sacct COMPLETED", 60)  # the result lands first
    assert sacct_states(jid) == ["REQUEUED", "COMPLETED"]
    log = slurm_log.read_text()
    assert "Calling checkpoint method" in log and f"Requeued job {jid}" in log  # submitit's own record
    assert log.count("Starting with JobEnvironment") == 2  # the job ran twice under one id
    steps = [json.loads(x)["step"] for x in (run_dir / "train_log.jsonl").read_text().splitlines()]
    assert steps == list(range(1, PREEMPT_STEPS + 1))  # the resumed log has no duplicated or missing rows

    from mor.train.job import train_job  # the same run, uninterrupted, in this process

    threads = torch.get_num_threads()
    try:  # one thread, as in the Slurm job (cpus_per_task: 1): the same float reduction order
        straight = train_job(str(grid), run.run_id, "local", str(tmp_path / "straight"), str(data_root), "cpu",
                             threads=1)
    finally:
        torch.set_num_threads(threads)
    assert straight["resumed_from"] is None
    assert summary["final_loss"] == straight["final_loss"]
    from safetensors.torch import load_file

    a, b = load_file(str(run_dir / "final" / "model.safetensors")), load_file(str(tmp_path / "straight" / "final" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_failing_job_fails_the_rule_with_the_slurm_log_path(slurm_cluster, tmp_path, data_root):
    """(d) a corrupt token file: the job raises, the launcher exits 1 naming the Slurm log,
    and Snakemake reports the train rule failed, showing that message."""
    bad = tmp_path / "bad-data"
    (bad / "tokens").mkdir(parents=True)
    for d in ("corpus", "tokenizer"):
        (bad / d).symlink_to(data_root / d)
    (bad / "tokens" / "val-bpe-4096.npy").symlink_to(data_root / "tokens" / "val-bpe-4096.npy")
    (bad / "tokens" / "train-bpe-4096.npy").write_bytes(b"not a numpy file")
    grids = tmp_path / "grids"
    write_grid(grids, "bad", steps=4, tying=False)
    proc = snakemake(tmp_path, f"grids_dir={grids}", f"data_root={bad}",
                     f"presets={write_presets(tmp_path / 'presets.yaml')}")
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "Error in rule train" in text
    run_id = load_grid(grids / "bad.yaml", "local").runs[0].run_id
    jid = job_ids(tmp_path)[f"{run_id}/train"]
    log = job_folder(tmp_path / "logs" / "slurm", "bad", run_id, "train") / f"{jid}_0_log.err"
    assert f"Slurm job {jid} (train of bad/{run_id}) failed: ValueError: token file" in text
    assert f"Slurm log: {log}" in text and "corrupt" in log.read_text()
    assert wait_for(lambda: sacct_states(jid)[-1:] == ["FAILED"], "sacct FAILED", 60)
    assert not (tmp_path / "results").exists()
