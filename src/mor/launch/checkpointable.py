"""The one callable submitit pickles into a Slurm job: a job kind of ``mor.jobs`` and its
keyword arguments (paths, strings, numbers only).

The pickle is small and a resubmission is exact. On a time-out or preemption Slurm sends
SIGUSR2; submitit then calls ``checkpoint()``, which returns the same call (same kind, same
arguments), and requeues the job. A requeued train job trains on from the run's last
checkpoint in ``runs/<grid>/<run_id>/checkpoints`` (written every ``train.checkpoint_every``
steps by the Trainer, atomically), and since batches are a pure function of (step, micro,
rank) the result equals that of an uninterrupted run; the steps since that checkpoint are
redone (at most ``checkpoint_every``): the signal handler runs between two Python bytecodes,
possibly mid-step, so it never writes a checkpoint itself. A requeued data job resumes at
its first unfinished shard; the scoring jobs (eval, lmeval, analysis, throughput) are short
and write atomically, so they simply run again.

This module imports no torch: the launcher on the login node only pickles the object.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from submitit.helpers import Checkpointable, DelayedSubmission

from mor.jobs import kind as job_kind


@dataclass
class Job(Checkpointable):
    """Run job kind ``kind`` with ``kwargs`` on every task of the Slurm job.

    A kind whose ``ranks`` is "all" (train) runs once per task as one rank of
    torch.distributed (initialised here from Slurm's task variables, torn down after); any
    other kind is one process. Returns the kind's result with this task's rank and world size.
    """

    kind: str
    kwargs: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        job_kind(self.kind)  # an unknown kind fails here, on the login node, not in the queue

    def __call__(self) -> dict:
        spec = job_kind(self.kind)
        if spec.ranks == "one":
            return {"rank": 0, "world_size": 1, **spec.result(spec.run(**self.kwargs))}
        from mor.launch.distributed import init_distributed, shutdown

        dist = init_distributed(self.kwargs.get("device", "auto"))
        try:
            r = spec.run(**self.kwargs, dist=dist)
        finally:
            shutdown()
        return {"rank": dist.rank, "world_size": dist.world_size, **spec.result(r)}

    def checkpoint(self, *args, **kwargs) -> DelayedSubmission:
        """Resubmit the same call; the job resumes from what it wrote (see the module docstring)."""
        return DelayedSubmission(type(self)(self.kind, dict(self.kwargs)))
