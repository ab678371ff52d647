"""The crash-safety harness: a tiny run's trainer, its undisturbed reference (the module-scoped
``reference`` fixture), a run killed after some steps, and the bit-for-bit comparison of two
run folders (weights, logged losses and grad norms, each step logged once)."""

from __future__ import annotations

import json

import pytest
import torch

from helpers.tiny import VOCAB, tiny_run
from mor.train.trainer import Trainer


def _tokens(data_root):
    return data_root / "tokens" / f"train-bpe-{VOCAB}.npy"


def _trainer(run, run_dir, data_root):
    return Trainer(run, run_dir, _tokens(data_root), VOCAB, progress=False)


def _log(run_dir):
    return [json.loads(line) for line in (run_dir / "train_log.jsonl").read_text().splitlines()]


def _weights(run_dir):
    from safetensors.torch import load_file

    return load_file(str(run_dir / "final" / "model.safetensors"))


def _assert_same_run(ref_dir, got_dir):
    """Same final weights, same per-step losses and grad norms, steps logged once each."""
    ref_w, got_w = _weights(ref_dir), _weights(got_dir)
    assert ref_w.keys() == got_w.keys()
    for n in ref_w:
        assert torch.equal(ref_w[n], got_w[n]), n
    keep = ("step", "loss", "aux_loss", "lr", "grad_norm", "tokens_seen")
    assert [{k: r[k] for k in keep} for r in _log(got_dir)] == [{k: r[k] for k in keep} for r in _log(ref_dir)]


@pytest.fixture(scope="module")
def reference(data_root, tmp_path_factory):
    """An undisturbed 8-step run (checkpoints at 4 and 8)."""
    run = tiny_run(variant="mor", nr=2, steps=8, batch=4)
    ref = tmp_path_factory.mktemp("ref") / "run"
    _trainer(run, ref, data_root).fit()
    return run, ref


def _partial(run, run_dir, data_root, steps):
    """A run killed right after ``steps`` steps, having checkpointed every 4 (and logged)."""
    tr = _trainer(run, run_dir, data_root)
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / "train_log.jsonl", "a") as log:
        for _ in range(steps):
            row = tr.train_step()
            row["tokens_seen"] = tr.tokens_seen
            tr.last_metrics = row
            log.write(json.dumps(row) + "\n")
            if tr.step % run.train.checkpoint_every == 0:
                tr.save()
    return tr
