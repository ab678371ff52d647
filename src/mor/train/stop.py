"""Preemption that saves: a stop request the training loop honours at its next step boundary.

Why: a cluster announces a preemption or a time limit with a signal (SIGUSR2 through
``--signal=USR2@<s>`` in the presets; many sites send SIGTERM, then SIGKILL after
``KillWait``). A handler runs between two Python bytecodes, possibly mid-step, so it must not
write a checkpoint itself. It only records the request; the trainer, at the end of the step
in progress, writes a checkpoint and raises ``Preempted``. The work redone after a restart is
then at most the step that was running, not everything since the last periodic checkpoint.

With several ranks every rank must stop at the same step (a checkpoint is a collective
under FSDP), so ``requested`` takes the maximum of the flag over the ranks once per step.
What happens after ``Preempted`` is the launcher's business: requeue the Slurm job
(``mor.launch.checkpointable``), or exit with a message saying how to resume (inline).
"""

from __future__ import annotations

import signal
from contextlib import contextmanager

SIGNALS = (signal.SIGTERM, signal.SIGUSR2)


class Preempted(Exception):
    """Training stopped at a step boundary on request; its checkpoint is on disk."""

    def __init__(self, step: int, signum: int, checkpoint_dir):
        self.step, self.signum, self.checkpoint_dir = step, signum, checkpoint_dir
        super().__init__(f"stopped by {signal.Signals(signum).name} after step {step}; checkpoint saved in "
                         f"{checkpoint_dir}: the same job resumes from it")


class StopRequest:
    """The flag a signal handler sets; read at step boundaries."""

    def __init__(self):
        self.signum: int | None = None

    def set(self, signum: int, frame=None) -> None:
        if self.signum is None:
            self.signum = signum

    def requested(self, world_size: int = 1) -> bool:
        """Whether to stop now; with several ranks, whether any rank was asked (one all-reduce)."""
        if world_size == 1:
            return self.signum is not None
        import torch
        import torch.distributed as dist

        backend = dist.get_backend()
        flag = torch.tensor([0 if self.signum is None else self.signum], dtype=torch.int64,
                            device="cuda" if backend == "nccl" else "cpu")
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if flag.item() and self.signum is None:
            self.signum = int(flag.item())
        return bool(flag.item())


@contextmanager
def stop_on_signals(stop: StopRequest, signals=SIGNALS):
    """Route ``signals`` to ``stop`` while the block runs; the previous handlers (submitit's
    requeue handler in a Slurm job) come back afterwards, for the launcher to call."""
    previous = {s: signal.getsignal(s) for s in signals}
    for s in signals:
        signal.signal(s, stop.set)
    try:
        yield stop
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
