"""What the data-parallel tests compare against and fake: a single process trained on the
sequences ``world`` ranks would draw, a free loopback port, and the fields of submitit's
JobEnvironment that rank discovery reads."""

from __future__ import annotations

from pathlib import Path

from helpers.tiny import VOCAB
from mor.train.trainer import Trainer


def single_process_reference(run, run_dir: Path, tokens: Path, world: int) -> tuple[Trainer, dict]:
    """Train ``run`` in this process on the sequences that ``world`` ranks would draw.

    Under train.data_order "sequence" (the default) rank r trains the step's global sequences
    r * per_rank .. (r + 1) * per_rank - 1 (mor.data.sampler), so one plain process sees the
    same sequences, averages the same per-micro losses and takes the same optimizer steps (up
    to the order of float additions); tests/unit/test_sampler.py checks the tiling itself."""
    assert run.train.data_order == "sequence" and run.train.global_batch % world == 0
    tr = Trainer(run, run_dir, tokens, VOCAB, progress=False)
    return tr, tr.fit()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _FakeEnv:
    """The fields of submitit.JobEnvironment that init_distributed reads."""

    def __init__(self, rank: int, world: int):
        self.global_rank, self.num_tasks, self.local_rank = rank, world, rank
        self.num_nodes, self.raw_job_id, self.hostnames = 1, "0", ["localhost"]
