"""Opening a trained run (``mor.trained.open_run``): the checks before a weight is read, and the model after."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from safetensors.torch import save_file

from helpers.tiny import tiny_run
from mor.atomic import sha256_file
from mor.checkpoints.native import CheckpointError
from mor.model.build import make_model
from mor.trained import open_run

VOCAB = 64


def finished(tmp_path, run=None, summary: dict | None = None):
    """A finished run folder as training leaves it (config.json, final weights, summary), without training."""
    run = run or tiny_run(variant="mor", nr=2)
    torch.manual_seed(1)
    model = make_model(dataclasses.replace(run, train=dataclasses.replace(run.train, seed=7)), VOCAB,
                       torch.device("cpu"))  # other weights than open_run's own initialisation
    run_dir = tmp_path / "run"
    (run_dir / "final").mkdir(parents=True)
    final = run_dir / "final" / "model.safetensors"
    save_file({n: p.detach().contiguous() for n, p in model.named_parameters()}, str(final))
    (run_dir / "config.json").write_text(json.dumps({"vocab_size": VOCAB, "config": run.to_dict()}))
    summary = {"config_hash": run.config_hash, "final_sha256": sha256_file(final), "tokens_seen": 0} \
        if summary is None else summary
    (run_dir / "train_summary.json").write_text(json.dumps(summary))
    return run, run_dir, model


def test_opens_the_config_model_and_summary_it_was_written_with(tmp_path):
    run, run_dir, saved = finished(tmp_path)
    for config in (None, run):  # config.json's, or the caller's (a grid's)
        opened = open_run(run_dir, config, device="cpu")
        assert opened.config.config_hash == run.config_hash and opened.summary["tokens_seen"] == 0
        assert opened.device == torch.device("cpu") and not opened.model.training
        assert opened.model.vocab_size == VOCAB and opened.files.weights == run_dir / "final" / "model.safetensors"
        for (n, p), (m, q) in zip(opened.model.named_parameters(), saved.named_parameters()):
            assert n == m and torch.equal(p, q), n


def test_an_unfinished_run_is_refused(tmp_path):
    _, run_dir, _ = finished(tmp_path)
    (run_dir / "train_summary.json").unlink()
    with pytest.raises(FileNotFoundError, match="has not finished training"):
        open_run(run_dir, device="cpu")
    (run_dir / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"config\.json missing: .* is not a finished run"):
        open_run(run_dir, device="cpu")


def test_a_summary_of_another_config_or_unreadable_is_refused(tmp_path):
    run, run_dir, _ = finished(tmp_path)
    other = tiny_run(variant="mor", nr=3)
    with pytest.raises(CheckpointError, match=f"was written by training config {run.config_hash}, not "
                                              f"{other.config_hash}; delete .*train_summary.json"):
        open_run(run_dir, other, device="cpu")
    (run_dir / "train_summary.json").write_text("{torn")
    with pytest.raises(CheckpointError, match=r"train_summary\.json is unreadable"):
        open_run(run_dir, device="cpu")


def test_weights_whose_digest_differs_from_the_summary_are_refused(tmp_path):
    _, run_dir, _ = finished(tmp_path)
    final = run_dir / "final" / "model.safetensors"
    data = bytearray(final.read_bytes())
    data[-1] ^= 1
    final.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"model\.safetensors is missing or corrupt \(its sha256 differs"):
        open_run(run_dir, device="cpu")


def test_weights_of_another_model_are_refused_naming_the_run(tmp_path):
    """No digest recorded (an older summary): the strict load still refuses another model's tensors."""
    run, run_dir, _ = finished(tmp_path, summary={})
    vanilla = make_model(tiny_run(), VOCAB, torch.device("cpu"))
    save_file({n: p.detach().contiguous() for n, p in vanilla.named_parameters()},
              str(run_dir / "final" / "model.safetensors"))
    with pytest.raises(CheckpointError, match=rf"run {run.run_id}: .*does not match the model: missing \['routers"):
        open_run(run_dir, device="cpu")
