"""The callables submitit pickles into Slurm jobs: train, eval (and the other scoring jobs) of
one run, and the data preparation; paths only.

They hold nothing but strings, so the pickle is small and a resubmission is exact. On a
time-out or preemption Slurm sends SIGUSR2; submitit then calls ``checkpoint()``, which
returns the same call (same paths), and requeues the job. The requeued job trains on from
the run's last checkpoint in ``runs/<grid>/<run_id>/checkpoints`` (written every
``train.checkpoint_every`` steps by the Trainer, atomically), and since batches are a pure
function of (step, micro, rank) the result equals that of an uninterrupted run. The steps
since that checkpoint are redone (at most ``checkpoint_every``): the signal handler runs
between two Python bytecodes, possibly mid-step, so it never writes a checkpoint itself.

This module imports no torch: the launcher on the login node only pickles the object.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from submitit.helpers import Checkpointable, DelayedSubmission


@dataclass
class TrainJob(Checkpointable):
    """``mor.jobs.train_job`` on every task of the Slurm job (one rank each)."""

    grid: str
    run_id: str
    mode: str
    run_dir: str
    data_root: str
    threads: int = 0
    parallel: str = "ddp"
    device: str = "auto"
    peak_tflops: float = 0.0  # per GPU, from the preset: the train log's MFU (0 = unknown, left null)

    def __call__(self) -> dict:
        from mor.jobs import train_job
        from mor.launch.distributed import init_distributed, shutdown

        dist = init_distributed(self.device)
        try:
            summary = train_job(self.grid, self.run_id, self.mode, self.run_dir, self.data_root, self.device,
                                dist=dist, threads=self.threads, parallel=self.parallel, peak_tflops=self.peak_tflops)
        finally:
            shutdown()
        return {"rank": dist.rank, "world_size": dist.world_size, **summary}

    def checkpoint(self, *args, **kwargs) -> DelayedSubmission:
        """Resubmit the same paths; the Trainer resumes from the run's last checkpoint."""
        return DelayedSubmission(type(self)(**asdict(self)))


@dataclass
class ScoringJob(Checkpointable):
    """A job that reads a trained run and writes ``out`` (eval, lmeval, analysis): one process;
    a requeued one simply runs again from the start (it is short, and writes atomically)."""

    grid: str
    run_id: str
    mode: str
    run_dir: str
    out: str
    data_root: str
    threads: int = 0
    device: str = "auto"

    def checkpoint(self, *args, **kwargs) -> DelayedSubmission:
        return DelayedSubmission(type(self)(**asdict(self)))


@dataclass
class EvalJob(ScoringJob):
    """``mor.jobs.eval_job``: validation NLL and router statistics into the run's parquet row."""

    def __call__(self) -> dict:
        from mor.jobs import eval_job

        row = eval_job(self.grid, self.run_id, self.mode, self.run_dir, self.out, self.data_root, self.device,
                       threads=self.threads)
        return {"rank": 0, "world_size": 1, "run_id": row["run_id"], "val_nll": row["val_nll"],
                "val_tokens": row["val_tokens"]}


@dataclass
class PrepareJob(Checkpointable):
    """``mor.data.fineweb.prepare``: one process tokenizing on all its CPUs (worker processes).

    A time-out or preemption requeues the same call; the preparation resumes at the first
    unfinished shard (finished shards are checked, never rewritten).
    """

    settings: str
    tokenizer: str
    out: str
    workers: int = 0  # 0 = every CPU Slurm gave the job

    def __call__(self) -> dict:
        from mor.data.fineweb import load_settings, prepare

        return prepare(load_settings(self.settings), self.tokenizer, self.out, self.workers)

    def checkpoint(self, *args, **kwargs) -> DelayedSubmission:
        return DelayedSubmission(type(self)(**asdict(self)))
