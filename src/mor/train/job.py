"""The ``train`` job: train (or resume) one run of a grid, paths and strings in, files out.

Both launchers call it (``mor.jobs`` names it for the kind ``train``): inline in one process,
or on every task of a Slurm job, where ``mor.launch`` has already initialised
torch.distributed and passes this rank's ``dist``. It writes ``runs/<run_id>/``
(checkpoints, ``train_log.jsonl``, ``final/``, ``train_summary.json``) and returns the summary.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

from mor.config import exec_config
from mor.cpu_allocator import tune_cpu_allocator
from mor.data.paths import data_paths
from mor.data.tokenizer import vocab_size
from mor.grids import load_grid
from mor.train.live_curves import LIVE_CURVES_ENV, LiveCurves, RunLabels, parse_setting
from mor.train.stop import StopRequest, stop_on_signals
from mor.train.trainer import DistInfo, Trainer, TrainerSeams


def train_job(grid: str, run_id: str, mode: str, run_dir: str, data_root: str = "data",
              device: str = "auto", dist: DistInfo | None = None, threads: int = 0, parallel: str = "ddp",
              peak_tflops: float = 0.0, execution: dict | None = None, live_curves: str = "",
              seams: TrainerSeams | None = None, loop: Callable[[Trainer], dict] | None = None) -> dict:
    """Train (or resume) one run of a grid; returns the training summary.

    ``execution`` (the preset's ExecConfig keys: micro-batch, checkpointing, loss chunk, ...)
    changes how the run computes, never its id or what it trains; so does ``live_curves`` (the
    preset's, or ``$MOR_LIVE_CURVES``: the train log mirrored to TensorBoard / W&B, filed under
    the grid, its block and the variant).

    With ``dist.world_size > 1`` (torch.distributed already initialised by
    ``mor.launch.distributed``) the model is wrapped for ``parallel`` ('ddp' or 'fsdp').
    A preemption signal (SIGTERM, SIGUSR2) stops it at the end of the step in progress with a
    checkpoint written: ``mor.train.stop.Preempted`` is raised for the launcher to requeue.

    ``seams`` and ``loop`` are for a dry run (``mor.rehearsal``), which passes its fakes for the
    trainer's collaborators (``TrainerSeams``) and one measured step in place of the loop
    (``loop(trainer)`` instead of ``trainer.fit()``); a real run leaves both None.
    """
    tune_cpu_allocator()  # before the first step's tensors: freed blocks are reused, not re-faulted
    g = load_grid(grid, mode)
    entry = g.run(run_id)
    run = entry.config
    paths = data_paths(run.data, Path(data_root))
    cls = Trainer
    if dist is not None and dist.world_size > 1:
        from mor.train.parallel import trainer_class

        cls = trainer_class(parallel)
    trainer = cls(run, Path(run_dir), paths.train_tokens, vocab_size(paths), device=device, dist=dist,
                  threads=threads, peak_tflops=peak_tflops, execution=exec_config(execution), parallel=parallel,
                  seams=seams)
    trainer.stop = StopRequest()
    sinks = parse_setting(os.environ.get(LIVE_CURVES_ENV) or live_curves, f"${LIVE_CURVES_ENV} / live_curves")
    if sinks:  # off by default; the preset's live_curves or $MOR_LIVE_CURVES (mor.train.live_curves)
        trainer.curves = LiveCurves(sinks, Path(run_dir), run.run_id, run.to_dict(),
                                    RunLabels(grid=g.name, block=entry.block, variant=run.model.variant))
    with stop_on_signals(trainer.stop):  # SIGTERM / SIGUSR2: checkpoint at the step boundary, raise Preempted
        return loop(trainer) if loop is not None else trainer.fit()


def summary(r: dict) -> str:
    """The one line a finished train job prints."""
    speed = f"{r['tokens_per_s']:.0f} tok/s, " if r.get("tokens_per_s") is not None else ""
    return (f"trained {r['run_id']} on {r.get('world_size', 1)} rank(s): {r['steps']} steps, "
            f"final loss {r['final_loss']:.4f}, resumed from {r['resumed_from']}, {speed}{r['train_time_s']:.1f}s")
