"""The one callable submitit pickles into a Slurm job: a job kind of ``mor.jobs`` and its
keyword arguments (paths, strings, numbers only).

The pickle is small and a resubmission is exact. On a time-out or preemption Slurm sends
SIGUSR2; submitit then calls ``checkpoint()``, which returns the same call (same kind, same
arguments), and requeues the job. A requeued train job trains on from the run's last
checkpoint in ``runs/<run_id>/checkpoints`` (written atomically), and since batches
are a pure function of (step, micro, rank) the result equals that of an uninterrupted run.
A requeued data job resumes at
its first unfinished shard; the scoring jobs (eval, lmeval, analysis, throughput) are short
and write atomically, so they simply run again.

A train job does better than the periodic checkpoint: while it runs, SIGUSR2 and SIGTERM only
set a stop request (``mor.train.stop``); the trainer writes a checkpoint at the end of the
step in progress and raises ``Preempted``, and then ``requeue_after_preemption`` lets
submitit's handler requeue the job. The work redone is at most that one step.

This module imports no torch: the launcher on the login node only pickles the object.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from submitit.helpers import Checkpointable, DelayedSubmission

from mor.jobs import kind as job_kind
from mor.train.stop import Preempted


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
        except Preempted:
            shutdown()
            requeue_after_preemption()
            raise
        except BaseException:
            shutdown()
            raise
        shutdown(barrier=True)  # every rank returned: meet before the group goes
        return {"rank": dist.rank, "world_size": dist.world_size, **spec.result(r)}

    def checkpoint(self, *args, **kwargs) -> DelayedSubmission:
        """Resubmit the same call; the job resumes from what it wrote (see the module docstring)."""
        return DelayedSubmission(type(self)(self.kind, dict(self.kwargs)))


REQUEUE_WAIT_S = 600.0  # a rank other than 0 waits this long for the requeue to end it


def requeue_after_preemption() -> None:
    """The train job stopped on SIGTERM / SIGUSR2 with its checkpoint written: hand over to
    submitit's own preemption handler (the one bound to SIGUSR2 before the train job routed the
    signals to its stop request), which pickles ``Job.checkpoint()``, requeues the Slurm job and
    exits. Rank 0 does that; the other ranks return from it and wait for the requeue to end them.
    Outside a submitit job (no handler) nothing happens and ``Preempted`` propagates."""
    import signal
    import time

    handler = signal.getsignal(signal.SIGUSR2)
    if not callable(handler):
        return
    handler(signal.SIGUSR2, None)  # rank 0: requeue + sys.exit
    time.sleep(REQUEUE_WAIT_S)
