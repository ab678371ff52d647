"""A trained run, opened: the one way every reader of a finished run gets its model.

    run = open_run("runs/<run_id>")                 # the config from run_dir/config.json
    run = open_run(run_dir, config=grid.run(run_id).config) # or the grid's (a workflow job)
    run.config, run.model, run.device, run.files, run.summary, run.meta

Before a weight is read the run is checked as the eval job always did: its training summary
is there and readable (``FileNotFoundError`` / ``CheckpointError``), was written by this
config (the summary's ``config_hash``), and the final weights' sha256 is the one it records.
Every ``CheckpointError`` says how to redo the run's end. The model is built by the model
layer (``mor.model.build``) and its weights read in our own format (``mor.checkpoints.native``);
nothing of training is imported.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from mor.atomic import sha256_file
from mor.config import RunConfig, run_config_from_dict
from mor.layout import RunPaths
from mor.checkpoints.native import CheckpointError, load_model_weights
from mor.model.build import make_model, pick_device
from mor.model.transformer import MoRTransformer


@dataclass
class TrainedRun:
    config: RunConfig
    model: MoRTransformer  # final weights, in eval mode
    device: torch.device
    files: RunPaths
    summary: dict  # train_summary.json
    meta: dict  # config.json (resolved config, git commit, vocab size); {} when the run has none


def redo(files: RunPaths) -> str:
    return (f"delete {files.summary} and re-run the workflow: training resumes from its last checkpoint "
            "and writes the final weights again")


def read_summary(files: RunPaths, config: RunConfig) -> dict:
    """The run's training summary, checked against ``config`` and the final weights it records."""
    name, f = config.run_id, files.summary
    if not f.exists():
        raise FileNotFoundError(f"{f} missing: run {name} has not finished training ({files.dir} is not a finished run)")
    try:
        summary = json.loads(f.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise CheckpointError(f"run {name}: {f} is unreadable ({e}); {redo(files)}") from None
    if summary.get("config_hash") not in (None, config.config_hash):
        raise CheckpointError(f"run {name}: {f} was written by training config {summary['config_hash']}, "
                              f"not {config.config_hash}; {redo(files)}")
    final = files.weights
    if "final_sha256" in summary and (not final.exists() or sha256_file(final) != summary["final_sha256"]):
        raise CheckpointError(f"run {name}: {final} is missing or corrupt (its sha256 differs from the one in "
                              f"{f}); {redo(files)}")
    return summary


def open_run(run_dir: str | Path, config: RunConfig | None = None, device: str | torch.device = "auto",
             data_root: str | Path = "data", vocab_size: int | None = None,
             read_weights: Callable[[Path, torch.nn.Module], None] | None = None) -> TrainedRun:
    """Open the finished run in ``run_dir``: checked, its model built on ``device`` with its final weights.

    ``config``: the run's config when the caller holds it (a grid's), else ``run_dir/config.json``'s.
    The vocabulary is ``vocab_size``, else config.json's, else the run's tokenizer under ``data_root``.
    ``read_weights(file, model)`` fills the built model from the final weights file: None, our
    own format's reader (``mor.checkpoints.native.load_model_weights``); a dry run
    (``mor.rehearsal``), which has no weights, passes one that reads none.
    """
    files = RunPaths.of(run_dir)
    meta = json.loads(files.config.read_text()) if files.config.is_file() else {}
    if config is None:
        if not meta:
            raise FileNotFoundError(f"{files.config} missing: {files.dir} is not a finished run")
        config = run_config_from_dict(meta["config"])
    summary = read_summary(files, config)
    if vocab_size is None:
        vocab_size = meta.get("vocab_size")
    if vocab_size is None:
        from mor.data.paths import data_paths
        from mor.data.tokenizer import vocab_size as tokenizer_vocab

        vocab_size = tokenizer_vocab(data_paths(config.data, Path(data_root)))
    dev = pick_device(device)
    model = make_model(config, vocab_size, dev)  # every weight is then the run's final one
    try:
        (read_weights or load_model_weights)(files.weights, model)
    except CheckpointError as e:
        raise CheckpointError(f"run {config.run_id}: {e}; {redo(files)}") from None
    return TrainedRun(config, model.eval(), dev, files, summary, meta)
