"""data_order "pass" (issue 55, item 5): one pass without replacement over the pool, in an
order fixed by the seed, resumable mid-pass, disjoint across ranks, refused when too long.

The authors read FineWeb-Edu once, in order (``global_shuffling: false``); the random orders
("sequence", "rank") draw windows with replacement, so a run reads some windows twice and
never sees others. Every check below would fail under a with-replacement sampler (planted in
``test_a_with_replacement_sampler_fails_the_one_pass_check``).
"""

from __future__ import annotations

import dataclasses
import json
import shutil

import numpy as np
import pytest
import torch

from helpers.tiny import VOCAB, tiny_run
from mor.config import ConfigError, run_config_from_dict
from mor.data.sampler import PoolTooSmall, TokenSampler
from mor.train.trainer import DistInfo, Trainer

T, BATCH = 8, 4


def _pool(n=1001):
    """Tokens whose value is their position: a window's first token is its start."""
    return np.arange(n, dtype=np.int64)


def _starts(sampler: TokenSampler, steps: int, world: int = 1) -> list[int]:
    """Window starts read by ``steps`` steps, rank-major within a step (what the trainer consumes)."""
    out = []
    for step in range(steps):
        for r in range(world):
            x, y = sampler.rank_batch(step, r, world, BATCH // world)
            assert torch.equal(x[:, 1:], y[:, :-1])  # each row is a window: y is x shifted by one
            out += x[:, 0].tolist()
    return out


def _assert_one_pass(starts: list[int], windows: int) -> None:
    """No window twice, every start a window boundary: the reads of one pass without replacement."""
    assert len(set(starts)) == len(starts), f"{len(starts) - len(set(starts))} windows read twice"
    assert all(s % T == 0 and 0 <= s // T < windows for s in starts)


def test_one_pass_reads_every_window_once_in_an_order_fixed_by_the_seed():
    s = TokenSampler(_pool(), T, seed=3, global_batch=BATCH, order="pass")
    assert s.windows == 125  # (1001 - 1) // 8: windows of 9 tokens overlapping by one
    steps = s.windows // BATCH  # 31 steps = 124 windows, the whole pass but one
    got = _starts(s, steps)
    _assert_one_pass(got, s.windows)
    assert len(got) == 124 and got != sorted(got)  # shuffled, not the authors' file order
    again = _starts(TokenSampler(_pool(), T, seed=3, global_batch=BATCH, order="pass"), steps)
    assert got == again  # same seed, same order
    other = _starts(TokenSampler(_pool(), T, seed=4, global_batch=BATCH, order="pass"), steps)
    assert other != got and sorted(other[:40]) != sorted(got[:40])
    # the position in the pass is a function of the step (the checkpoint's step)
    assert s.pass_position(10) == {"epoch": 0, "position": 40, "windows": 125}
    assert s.pass_position(32) == {"epoch": 1, "position": 3, "windows": 125}


def test_a_with_replacement_sampler_fails_the_one_pass_check():
    """The check above is not vacuous: today's random order draws with replacement and repeats."""
    planted = TokenSampler(_pool(), T, seed=3, global_batch=BATCH, order="sequence")
    with pytest.raises(AssertionError, match="read twice"):
        _assert_one_pass(_starts(planted, 31), 125)


def test_ranks_are_disjoint_and_together_read_the_one_process_batch():
    s = TokenSampler(_pool(), T, seed=0, global_batch=BATCH, order="pass")
    for step in (0, 5, 30):
        one = s.rank_batch(step, 0, 1, BATCH)[0][:, 0].tolist()
        two = [s.rank_batch(step, r, 2, 2)[0][:, 0].tolist() for r in (0, 1)]
        assert not set(two[0]) & set(two[1])
        assert two[0] + two[1] == one


def test_a_second_epoch_is_a_new_permutation_and_must_be_stated():
    s = TokenSampler(_pool(), T, seed=0, global_batch=BATCH, order="pass")
    first, second = s.permutation(0), s.permutation(1)
    assert sorted(first.tolist()) == sorted(second.tolist()) == list(range(125))
    assert not np.array_equal(first, second)
    assert s.epochs_needed(31) == 1 and s.epochs_needed(32) == 2
    # a step straddling the epoch boundary (step 31: sequences 124..127) reads both epochs
    x, _ = s.rank_batch(31, 0, 1, BATCH)
    assert x[:, 0].tolist() == [int(first[124]) * T] + [int(w) * T for w in second[:3]]


def _token_file(tmp_path, n=1001):
    path = tmp_path / "pool.npy"
    np.save(path, (np.random.default_rng(0).integers(0, VOCAB, n)).astype(np.uint16))
    return path


def _pass_run(steps, seq_len=T, batch=BATCH, **train):
    run = tiny_run(steps=steps, batch=batch, seq_len=seq_len)
    return dataclasses.replace(run, train=dataclasses.replace(run.train, data_order="pass", checkpoint_every=3, **train))


def test_a_run_longer_than_the_pool_stops_before_training_unless_it_states_epochs(tmp_path):
    pool = _token_file(tmp_path)
    with pytest.raises(PoolTooSmall, match=r"32 steps x 4 sequences = 128 windows .* holds 125 windows .*"
                                           r"train\.data_epochs=1.*state train\.data_epochs: 2"):
        Trainer(_pass_run(32), tmp_path / "r", pool, VOCAB, progress=False)
    assert not (tmp_path / "r").exists()
    tr = Trainer(_pass_run(32, data_epochs=2), tmp_path / "r2", pool, VOCAB, progress=False)
    summary = tr.fit()
    assert summary["data_epochs"] == 2
    rows = [json.loads(x) for x in (tmp_path / "r2" / "train_log.jsonl").read_text().splitlines()]
    assert [r["data_epoch"] for r in rows[30:]] == [1, 2]  # step 31 ends in the first pass, step 32 in the second
    # data_epochs permits; it is no part of the run id
    assert _pass_run(32, data_epochs=2).run_id == _pass_run(32).run_id
    with pytest.raises(ConfigError, match=r"train\.data_epochs=0 must be an integer >= 1"):
        run_config_from_dict({**_pass_run(4).to_dict(), "train": {**_pass_run(4).to_dict()["train"], "data_epochs": 0}})


def test_a_run_resumed_mid_pass_reads_and_trains_what_an_uninterrupted_run_does(tmp_path):
    """Stopped at step 6 (its checkpoint records the pass position) and resumed in a fresh
    trainer: the same losses and weights as one uninterrupted run, and every window read once."""
    pool = _token_file(tmp_path)
    run = _pass_run(12)
    ref = Trainer(run, tmp_path / "ref", pool, VOCAB, progress=False)
    ref.fit()
    first = Trainer(run, tmp_path / "cut", pool, VOCAB, progress=False)
    for _ in range(6):
        first.train_step()
    first.save()
    state = json.loads((tmp_path / "cut" / "checkpoints" / "step-000006" / "state.json").read_text())
    assert state["data_position"] == {"epoch": 0, "position": 24, "windows": 125}
    resumed = Trainer(run, tmp_path / "cut", pool, VOCAB, progress=False)
    summary = resumed.fit()
    assert summary["resumed_from"] == 6 and summary["data_epochs"] == 1
    log = lambda d: [json.loads(x)["loss"] for x in (d / "train_log.jsonl").read_text().splitlines()]  # noqa: E731
    assert log(tmp_path / "cut")[-6:] == pytest.approx(log(tmp_path / "ref")[-6:], abs=1e-6)
    for (n, p), (_, q) in zip(ref.model.named_parameters(), resumed.model.named_parameters()):
        assert torch.allclose(p, q, atol=1e-6), n
    _assert_one_pass(_starts(TokenSampler(np.arange(1001), T, 0, BATCH, "pass"), 12), 125)


def test_a_resume_on_another_pool_is_refused(tmp_path):
    pool = _token_file(tmp_path)
    run = _pass_run(6)
    tr = Trainer(run, tmp_path / "r", pool, VOCAB, progress=False)
    for _ in range(3):
        tr.train_step()
    tr.save()
    (tmp_path / "b").mkdir()
    bigger = _token_file(tmp_path / "b", n=2001)
    with pytest.raises(ValueError, match=r"stopped at \{'epoch': 0, 'position': 12, 'windows': 125\} of the pass"
                                         r".*token pool changed"):
        Trainer(run, tmp_path / "r", bigger, VOCAB, progress=False).fit()
