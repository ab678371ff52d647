import json

import pytest
import torch

from helpers.tiny import VOCAB, tiny_run
from mor.config import ModelConfig, RunConfig, TrainConfig
from mor.train.checkpoint import CheckpointError
from mor.train.schedule import wsd_lr
from mor.train.trainer import Trainer


def _tokens(data_root):
    return data_root / "tokens" / f"train-bpe-{VOCAB}.npy"


def test_wsd_schedule_shape():
    lrs = [wsd_lr(s, 100, 1.0, 0.1, 0.2) for s in range(100)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert all(lr == 1.0 for lr in lrs[10:80])
    assert lrs[-1] == pytest.approx(0.0) and lrs[80] < 1.0
    assert all(a >= b for a, b in zip(lrs[80:], lrs[81:]))


def test_wsd_fixed_warmup_steps_override_the_fraction():
    """The authors' released runs warm up a fixed 57 (Vanilla / Recursive) or 86 (MoR) steps
    (train.warmup_steps, issue 55), whatever the run's length."""
    lrs = [wsd_lr(s, 9438, 1.0, 0.01, 0.2, warmup_steps=57) for s in (0, 55, 56, 57, 7549, 7550)]
    assert lrs[0] == pytest.approx(1 / 57) and lrs[1] < 1.0 and lrs[2] == lrs[3] == lrs[4] == 1.0
    assert lrs[5] < 1.0  # decay: the last round(0.2 x 9438) = 1888 steps


def test_loss_decreases_on_real_corpus(data_root, tmp_path):
    run = RunConfig(grid="test", model=ModelConfig(scale="tiny"),
                    train=TrainConfig(tokens=40 * 8 * 64, seq_len=64, global_batch=8, micro_batch=8,
                                      checkpoint_every=100, warmup_frac=0.05, decay_frac=0.0))
    tr = Trainer(run, tmp_path / "run", _tokens(data_root), VOCAB, progress=False)
    tr.fit()
    losses = [json.loads(line)["loss"] for line in (tmp_path / "run" / "train_log.jsonl").read_text().splitlines()]
    assert len(losses) == 40
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert last < first - 1.0, (first, last)


@pytest.mark.parametrize("variant, nr", [("vanilla", 1), ("mor", 3)])
def test_resume_gives_the_same_next_step_loss(data_root, tmp_path, variant, nr):
    run = tiny_run(variant=variant, nr=nr, steps=8, batch=4)
    straight = Trainer(run, tmp_path / "a", _tokens(data_root), VOCAB, progress=False)
    for _ in range(4):
        straight.train_step()
    straight.save()
    expected = straight.train_step()

    resumed = Trainer(run, tmp_path / "a", _tokens(data_root), VOCAB, progress=False)
    assert resumed.resume() and resumed.step == 4
    got = resumed.train_step()
    assert got["loss"] == pytest.approx(expected["loss"], rel=1e-6, abs=1e-6)
    for (n, p), q in zip(straight.model.named_parameters(), resumed.model.parameters()):
        torch.testing.assert_close(p, q, msg=n)


def test_interrupted_fit_resumes_to_the_same_final_model(data_root, tmp_path):
    run = tiny_run(steps=8, batch=4)
    full = Trainer(run, tmp_path / "full", _tokens(data_root), VOCAB, progress=False)
    full.fit()
    part = Trainer(run, tmp_path / "part", _tokens(data_root), VOCAB, progress=False)
    for _ in range(4):  # checkpoint_every=4: crash right after the step-4 checkpoint
        part.train_step()
    part.save()
    again = Trainer(run, tmp_path / "part", _tokens(data_root), VOCAB, progress=False)
    summary = again.fit()
    assert summary["resumed_from"] == 4 and summary["steps"] == 8
    for p, q in zip(full.model.parameters(), again.model.parameters()):
        torch.testing.assert_close(p, q)
    steps = [json.loads(line)["step"] for line in (tmp_path / "part" / "train_log.jsonl").read_text().splitlines()]
    assert steps == sorted(set(steps)), "resumed log duplicates steps"


def test_corrupt_checkpoint_is_named(data_root, tmp_path):
    run = tiny_run(steps=4, batch=4)
    tr = Trainer(run, tmp_path / "r", _tokens(data_root), VOCAB, progress=False)
    tr.train_step()
    tr.save()
    ckpt = tmp_path / "r" / "checkpoints" / "step-000001" / "model.safetensors"
    ckpt.write_bytes(b"not a safetensors file")
    again = Trainer(run, tmp_path / "r", _tokens(data_root), VOCAB, progress=False)
    with pytest.raises(CheckpointError, match="step-000001/model.safetensors"):
        again.resume()


def test_resume_refuses_another_configs_checkpoint(data_root, tmp_path):
    a = Trainer(tiny_run(steps=4, batch=4), tmp_path / "r", _tokens(data_root), VOCAB, progress=False)
    a.train_step()
    a.save()
    other = tiny_run(steps=4, batch=4, variant="recursive", nr=2)
    b = Trainer(other, tmp_path / "r", _tokens(data_root), VOCAB, progress=False)
    with pytest.raises(CheckpointError, match=f"written by training config {a.run.config_hash}, not this run's "
                                              f"{other.config_hash}"):
        b.resume()
