"""Crash safety of training: every window a kill can hit, replayed on a real tiny model.

Each test damages the run folder the way a SIGKILL (or a bad disk) would at one moment, then
resumes; the reference is an undisturbed run of the same config, so "resumed correctly"
means: the same final weights, the same logged losses and the same summary, bit for bit.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch

from helpers.checkpoint import _assert_same_run, _log, _partial, _trainer, reference  # noqa: F401  (fixture)
from helpers.tiny import tiny_run
from mor.train.checkpoint import CheckpointError, CheckpointMismatch, load_latest


def test_torn_last_log_line_and_lost_steps_resume_to_the_undisturbed_run(reference, data_root, tmp_path):
    run, ref = reference
    d = tmp_path / "run"
    _partial(run, d, data_root, 6)  # checkpoint at 4; steps 5-6 logged, then killed mid-line
    with open(d / "train_log.jsonl", "a") as log:
        log.write('{"step": 7, "loss": 5.1')
    summary = _trainer(run, d, data_root).fit()
    assert summary["resumed_from"] == 4
    _assert_same_run(ref, d)


def test_a_kill_before_the_first_checkpoint_restarts_without_duplicate_log_rows(reference, data_root, tmp_path):
    run, ref = reference
    d = tmp_path / "run"
    _partial(run, d, data_root, 3)
    shutil.rmtree(d / "checkpoints", ignore_errors=True)
    assert _trainer(run, d, data_root).fit()["resumed_from"] is None
    _assert_same_run(ref, d)


def test_corrupt_newest_checkpoint_falls_back_to_the_previous_one(reference, data_root, tmp_path, capsys):
    run, ref = reference
    d = tmp_path / "run"
    _partial(run, d, data_root, 8)  # checkpoints 4 and 8, no final weights yet
    bad = d / "checkpoints" / "step-000008" / "optimizer.safetensors"
    data = bytearray(bad.read_bytes())
    data[len(data) // 2] ^= 0xFF  # a flipped byte: same size, only the digest can tell
    bad.write_bytes(bytes(data))
    assert _trainer(run, d, data_root).fit()["resumed_from"] == 4
    assert f"{bad} is corrupt" in capsys.readouterr().err
    _assert_same_run(ref, d)


def test_unreadable_latest_pointer_and_a_missing_target_fall_back(reference, data_root, tmp_path):
    run, ref = reference
    d = tmp_path / "run"
    _partial(run, d, data_root, 8)
    ckpt = d / "checkpoints"
    (ckpt / "latest.json").write_text('{"pa')  # torn pointer
    assert load_latest(ckpt, run.config_hash, warn=lambda m: None)[0].name == "step-000008"
    # the window of a re-save: step-8 moved aside, pointer still naming it
    os.replace(ckpt / "step-000008", ckpt / ".step-000008.old-host-1-deadbeef")
    (ckpt / "latest.json").write_text('{"path": "step-000008"}')
    assert load_latest(ckpt, run.config_hash, warn=lambda m: None)[0].name == "step-000004"
    assert _trainer(run, d, data_root).fit()["resumed_from"] == 4
    _assert_same_run(ref, d)


def test_every_checkpoint_corrupt_is_an_error_naming_the_files(reference, data_root, tmp_path):
    run, _ = reference
    d = tmp_path / "run"
    _partial(run, d, data_root, 8)
    for step in ("step-000004", "step-000008"):
        (d / "checkpoints" / step / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(CheckpointError) as err:
        _trainer(run, d, data_root).resume()
    msg = str(err.value)
    assert "step-000004/model.safetensors is truncated" in msg and "step-000008/model.safetensors" in msg
    assert f"Delete {d / 'checkpoints'}" in msg


def test_another_configs_checkpoint_is_refused_by_the_hash_guard(reference, data_root, tmp_path):
    run, _ = reference
    d = tmp_path / "run"
    _partial(run, d, data_root, 4)
    other = tiny_run(variant="recursive", nr=2, steps=8, batch=4)
    with pytest.raises(CheckpointMismatch, match=f"written by training config {run.config_hash}, "
                                                 f"not this run's {other.config_hash}"):
        _trainer(other, d, data_root).resume()


def test_kill_after_the_last_checkpoint_writes_the_undisturbed_summary(reference, data_root, tmp_path):
    run, ref = reference
    d = tmp_path / "run"
    shutil.copytree(ref, d)
    for f in ("train_summary.json", "final"):  # killed after checkpoint 8, before the final files
        p = d / f
        shutil.rmtree(p) if p.is_dir() else p.unlink()
    summary = _trainer(run, d, data_root).fit()
    expected = json.loads((ref / "train_summary.json").read_text())
    assert summary["resumed_from"] == 8
    assert {k: v for k, v in summary.items() if k != "resumed_from"} == \
           {k: v for k, v in expected.items() if k != "resumed_from"}
    _assert_same_run(ref, d)


def test_a_finished_run_re_entered_keeps_its_summary_bit_for_bit(reference, data_root, tmp_path):
    run, ref = reference
    d = tmp_path / "run"
    shutil.copytree(ref, d)
    marker = d / "train_summary.json"
    before, mtime = marker.read_bytes(), marker.stat().st_mtime_ns
    log_before = (d / "train_log.jsonl").read_bytes()
    _trainer(run, d, data_root).fit()
    assert marker.read_bytes() == before and marker.stat().st_mtime_ns == mtime
    assert (d / "train_log.jsonl").read_bytes() == log_before
    marker.unlink()  # Snakemake removes a job's output before re-running it
    again = _trainer(run, d, data_root).fit()
    assert marker.read_bytes() == before and marker.stat().st_mtime_ns == mtime
    assert again == json.loads(before) and again["final_loss"] == _log(ref)[-1]["loss"]


def _first_param(model):
    return next(p for n, p in model.named_parameters() if p.dim() >= 2)


@pytest.mark.parametrize("what", ["loss", "auxiliary loss", "gradient norm"])
def test_non_finite_training_fails_loudly_with_the_step_and_saves_nothing(data_root, tmp_path, what):
    run = tiny_run(variant="mor", nr=2, steps=8, batch=4)
    tr = _trainer(run, tmp_path / "run", data_root)
    if what == "loss":
        with torch.no_grad():
            _first_param(tr.model).fill_(float("nan"))
    elif what == "auxiliary loss":
        def poison(_module, _args, out):
            out.aux_loss = out.aux_loss * float("inf")
            return out
        tr.model.register_forward_hook(poison)
    else:
        _first_param(tr.model).register_hook(lambda g: torch.full_like(g, float("inf")))
    with pytest.raises(FloatingPointError, match=f"{what} is (nan|inf) at step 1;"):
        tr.fit()
    assert not (tmp_path / "run" / "checkpoints").exists()
    assert not (tmp_path / "run" / "train_summary.json").exists()


def test_temporaries_of_a_killed_writer_are_removed_by_the_next_write(tmp_path):
    """A writer killed mid-write leaves its hidden temporary; the next write to that folder
    removes it (its pid is dead), and never one of a live writer (here: this process)."""
    import subprocess
    import sys

    from mor.atomic import temp_sibling, write_json_atomic

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    pid = int(dead.stdout)
    ours = temp_sibling(tmp_path / "config.json")
    ours.write_text("{")  # a live writer's (this process's) temporary
    theirs = ours.with_name(ours.name.replace(f"-{os.getpid()}-", f"-{pid}-"))
    theirs.write_text('{"half": ')
    write_json_atomic(tmp_path / "config.json", {"a": 1})
    assert json.loads((tmp_path / "config.json").read_text()) == {"a": 1}
    assert not theirs.exists() and ours.exists()
