"""The ``import`` job: a grid's run whose weights are a checkpoint the authors' trainer saved
(``model.import_checkpoint``), written as its run folder instead of training it (issue 62).

The workflow's train rule runs it for such a run (``mor.launch`` picks the kind, ``mor.jobs``
names this function), always in the workflow's own process: it trains nothing, so it needs no
GPU and no Slurm job. It writes ``runs/<run_id>/`` as ``mor.checkpoints.authors`` imports it
(``final/model.safetensors``, ``config.json`` with the grid's config and the provenance: their
commit, every file's sha256) and ``train_summary.json`` last, with the grid's config hash, so
eval, lmeval, analysis and the throughput engine open it through ``mor.trained.open_run`` like
any trained run. Refused, each naming what to fix: a checkpoint whose files changed since the
grid was read, a grid model that is not the checkpoint's, a vocabulary that is not the data's.
"""

from __future__ import annotations

import json
from pathlib import Path

from mor.checkpoint_identity import folder_digest
from mor.checkpoints.authors import import_checkpoint
from mor.checkpoints.native import CheckpointError
from mor.data.paths import data_paths
from mor.data.tokenizer import vocab_size
from mor.grids import load_grid


def import_job(grid: str, run_id: str, mode: str, run_dir: str, data_root: str = "data", **_) -> dict:
    """Import the checkpoint of one run of a grid into ``run_dir``; returns its summary line's values.
    (The train job's other arguments, device and threads, are accepted and unused: nothing is computed.)"""
    run = load_grid(grid, mode).run(run_id).config
    ckpt = Path(run.model.import_checkpoint)
    if folder_digest(ckpt) != run.model.import_sha256:  # changed between the grid's load and this job
        raise CheckpointError(f"{ckpt}: its files changed since the grid was read (run {run_id}); run the workflow again")
    theirs, vocab = json.loads((ckpt / "config.json").read_text()).get("vocab_size"), \
        vocab_size(data_paths(run.data, Path(data_root)))
    if theirs != vocab:  # before anything is written: eval and lmeval read the data's token ids
        raise CheckpointError(f"{ckpt}: vocabulary {theirs}, but run {run_id} reads data.tokenizer "
                              f"{run.data.tokenizer!r} (vocabulary {vocab}); set data.tokenizer to the checkpoint's "
                              "(their runs: the SmolLM tokenizer)")
    meta = import_checkpoint(ckpt, run_dir, run=run)
    prov = meta["provenance"]
    return {"run_id": run_id, "checkpoint": str(ckpt), "authors_commit": prov["authors_commit"],
            "files": len(prov["files_sha256"]), "final_sha256": prov["final_sha256"]}


def summary(r: dict) -> str:
    """The one line a finished import job prints."""
    return (f"imported {r['run_id']} from {r['checkpoint']} (their commit {r['authors_commit'] or 'unknown'}, "
            f"{r['files']} files hashed): no training")
