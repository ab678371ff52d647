"""The training data order (mor.data.sampler, train.data_order): which sequences a step trains on.

Under the default "sequence" order sequence j of step s depends on (seed, s, j) alone and a
rank takes a contiguous slice of the j's, so every split of the global batch into ranks x
micro-batches trains on the same sequences; a run stopped on 2 ranks resumes in 1 process
to the uninterrupted result. The legacy "rank" order gives back the old (seed, step, draw,
rank) draws and the old run ids, bit for bit.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections import Counter

import numpy as np
import pytest
import torch

from helpers.tiny import VOCAB, tiny_run
from mor.config import ConfigError, ExecConfig, run_config_from_dict
from mor.data.sampler import TokenSampler, load_tokens
from mor.train.trainer import DistInfo, Trainer

# Float summation order differs between one process and the ranks' all-reduce; see
# tests/unit/test_exec_settings.py (a wrong batch moves a weight by ~lr = 3e-3 per step).
ATOL = 5e-5


def _tokens(data_root):
    return data_root / "tokens" / f"train-bpe-{VOCAB}.npy"


def _with(run, **train):
    return dataclasses.replace(run, train=dataclasses.replace(run.train, **train))


def _scaled_init(run):
    """``run`` with the model settings of before issue 56 (its defaults are the authors')."""
    router = dataclasses.replace(run.model.router, combine="layer_update", capacity_rounding="ceil", aux_accum_steps=1)
    return dataclasses.replace(run, model=dataclasses.replace(run.model, residual_init="scaled", router=router))


def _split(data_root, tmp_path, run, ranks, micros):
    """{step: the (x, y) micro-batches of every rank of a ``ranks`` x ``micros`` split, rank-major},
    read through Trainer.micro_batches (what train_step consumes)."""
    per_rank = run.train.global_batch // ranks
    out = {}
    for r in range(ranks):
        tr = Trainer(run, tmp_path / f"{ranks}x{micros}-{r}", _tokens(data_root), VOCAB, progress=False,
                     dist=DistInfo(rank=r, world_size=ranks), execution=ExecConfig(micro_batch=per_rank // micros))
        assert (tr.accum, tr.micro) == (micros, per_rank // micros)
        for step in (0, 1, 7):
            tr.step = step
            passes = list(tr.micro_batches())
            assert len(passes) == micros and all(x.shape == y.shape == (tr.micro, run.train.seq_len) for x, y in passes)
            out.setdefault(step, []).extend(passes)
    return out


def _multiset(passes) -> Counter:
    """The step's sequences as a multiset of token tuples (x and its last target: the window)."""
    return Counter(tuple(x.tolist()) + (int(y[-1]),) for xs, ys in passes for x, y in zip(xs, ys))


# ------------------------------------------------------------------ (1) every split, the same sequences
def test_every_split_of_the_global_batch_trains_the_same_sequences(data_root, tmp_path):
    """8 sequences a step as 1 rank x 4 micro-batches, 2 x 2 and 4 x 1 (and 1 x 1): the same
    multiset of windows per step, in the same order (rank-major, then micro-batch). Steps and
    seeds differ. Under the legacy "rank" order the splits disagree: the check can fail."""
    run = tiny_run(steps=8, batch=8, seq_len=32)
    splits = {(r, m): _split(data_root, tmp_path, run, r, m) for r, m in ((1, 4), (2, 2), (4, 1), (1, 1))}
    tokens = np.load(_tokens(data_root), mmap_mode="r")
    for step in (0, 1, 7):
        ref = splits[(1, 1)][step]
        want = _multiset(ref)
        assert sum(want.values()) == 8 and len(want) == 8  # 8 distinct windows of a ~1 M-token corpus
        for (r, m), got in splits.items():
            assert _multiset(got[step]) == want, (r, m, step)
            assert torch.equal(torch.cat([x for x, _ in got[step]]), ref[0][0]), (r, m, step)  # same order too
        for x, y in zip(*ref[0]):  # each row is a window of the corpus: y is x shifted by one token
            assert torch.equal(x[1:], y[:-1])
    assert _multiset(splits[(1, 1)][0]) != _multiset(splits[(1, 1)][1])
    other_seed = _split(data_root, tmp_path / "s1", _with(run, seed=1), 1, 1)
    assert _multiset(other_seed[0]) != _multiset(splits[(1, 1)][0])

    # sequence j of a step is a pure function of (seed, step, j): asked for alone, it is the same window
    sampler = TokenSampler(tokens, 32, seed=0, global_batch=8)
    for j in (0, 5, 7):
        x, y = sampler.sequences(7, np.array([j]))
        assert torch.equal(x[0], splits[(1, 1)][7][0][0][j]) and torch.equal(y[0], splits[(1, 1)][7][0][1][j])
        s = int(sampler.starts(7, np.array([j]))[0])
        assert np.array_equal(x[0].numpy(), tokens[s:s + 32]) and np.array_equal(y[0].numpy(), tokens[s + 1:s + 33])

    legacy = _with(run, data_order="rank", micro_batch=2)  # draws of 2, keyed by rank
    one, two = (_split(data_root, tmp_path / f"legacy{r}", legacy, r, 1) for r in (1, 2))
    assert _multiset(one[0]) != _multiset(two[0])


# ------------------------------------------------------------------ (2) the legacy order, bit for bit
def _old_draw(tokens, seq_len, seed, step, micro, rank, size):
    """mor.data.sampler.TokenSampler.batch before issue 22, copied: (x, y) of (size, seq_len)."""
    rng = np.random.default_rng([seed, step, micro, rank])
    starts = rng.integers(0, len(tokens) - seq_len - 1, size=size)
    windows = np.stack([tokens[s: s + seq_len + 1] for s in starts]).astype(np.int64)
    return windows[:, :-1], windows[:, 1:]


def test_legacy_rank_order_reproduces_the_old_draws_and_run_ids(data_root, tmp_path):
    """data_order: rank trains each rank on its old draws (seed, step, draw, rank) of
    train.micro_batch sequences, whatever execution.micro_batch cuts them into, and gives
    back the run id the config had before the data order existed."""
    tokens = np.load(_tokens(data_root), mmap_mode="r")
    run = _with(tiny_run(steps=8, batch=8, seq_len=32), data_order="rank", micro_batch=2, seed=5)
    for world, passes in ((1, 2), (2, 4)):
        per_rank = 8 // world
        for r in range(world):
            tr = Trainer(run, tmp_path / f"w{world}r{r}", _tokens(data_root), VOCAB, progress=False,
                         dist=DistInfo(rank=r, world_size=world), execution=ExecConfig(micro_batch=per_rank // passes))
            for step in (0, 3, 6):
                tr.step = step
                got = list(tr.micro_batches())
                assert len(got) == passes
                old = [_old_draw(tokens, 32, 5, step, d, r, 2) for d in range(per_rank // 2)]
                assert np.array_equal(torch.cat([x for x, _ in got]).numpy(), np.concatenate([x for x, _ in old]))
                assert np.array_equal(torch.cat([y for _, y in got]).numpy(), np.concatenate([y for _, y in old]))
    sampler = TokenSampler(tokens, 32, seed=5)  # the legacy address alone (tests/workflow/test_fineweb.py uses it)
    x, y = sampler.batch(9, 1, 3, 4)
    want_x, want_y = _old_draw(tokens, 32, 5, 9, 1, 3, 4)
    assert np.array_equal(x.numpy(), want_x) and np.array_equal(y.numpy(), want_y)

    # tiny_run()'s id before issue 22 (computed with the config module of commit 5fa1a0d), with
    # the residual init of then (issue 56 made the authors' N(0, 0.02) the default)
    legacy = _with(_scaled_init(tiny_run()), data_order="rank")
    assert legacy.run_id == "tiny-vanilla-a00a7760"
    assert "data_order" not in legacy.training_dict()["train"]
    assert tiny_run().training_dict()["train"]["data_order"] == "sequence"  # the new default is hashed
    assert tiny_run().run_id != "tiny-vanilla-a00a7760"


def test_data_order_is_validated_at_the_config_boundary():
    stored = tiny_run().to_dict()
    stored["train"]["data_order"] = "shuffled"
    with pytest.raises(ConfigError, match=r"run\.train: train\.data_order='shuffled' is not allowed; "
                                          r"choose one of \['sequence', 'rank', 'pass'\]"):
        run_config_from_dict(stored)
    stored["train"]["data_order"] = "rank"
    stored["model"]["residual_init"] = "scaled"  # the settings of then (issue 56's defaults are the authors')
    stored["model"]["router"].update(combine="layer_update", capacity_rounding="ceil", aux_accum_steps=1)
    assert run_config_from_dict(stored).run_id == "tiny-vanilla-a00a7760"


# ------------------------------------------------------------------ (3) 2 DDP ranks, then 1 process
def _ddp_worker(rank, world, run, tokens, out, port):
    """2 gloo ranks under DDP, each 2 micro-batches of 1 sequence: 2 steps, checkpoint (copied
    aside for the one-process resume), 2 more steps; rank 0 writes the losses and weights."""
    import os

    from safetensors.torch import save_file

    from mor.launch import distributed
    from mor.train.parallel import trainer_class
    from helpers.launch import _FakeEnv

    os.environ["MASTER_PORT"] = str(port)
    info = distributed.init_distributed("cpu", env=_FakeEnv(rank, world))
    try:
        tr = trainer_class("ddp")(run, out / "ddp", tokens, VOCAB, device="cpu", dist=info, progress=False,
                                  execution=ExecConfig(micro_batch=1))
        assert (tr.micro, tr.accum) == (1, 2)
        losses = [tr.train_step()["loss"] for _ in range(2)]
        tr.save()  # rank 0 writes the step-2 checkpoint
        torch.distributed.barrier()
        if rank == 0:
            shutil.copytree(out / "ddp" / "checkpoints", out / "resumed" / "checkpoints")
        losses += [tr.train_step()["loss"] for _ in range(2)]
        params = tr.full_params()
        if rank == 0:
            save_file(params, str(out / "ddp.safetensors"))
            (out / "ddp.json").write_text(json.dumps(losses))
    finally:
        distributed.shutdown()


@pytest.fixture(scope="module")
def two_ranks_then_one(data_root, tmp_path_factory):
    """A recursive model (a tied layer called twice), 4 steps of 4 sequences: on 2 DDP ranks;
    resumed from their step-2 checkpoint in one process (4 passes of 1); uninterrupted in one
    process (1 pass of 4)."""
    from safetensors.torch import load_file

    from helpers.launch import _free_port

    out = tmp_path_factory.mktemp("ranks")
    run = tiny_run(steps=4, batch=4, seq_len=32, variant="recursive", tying="cycle", nr=2)
    tokens = _tokens(data_root)
    torch.multiprocessing.spawn(_ddp_worker, args=(2, run, tokens, out, _free_port()), nprocs=2, join=True)
    resumed = Trainer(run, out / "resumed", tokens, VOCAB, progress=False, execution=ExecConfig(micro_batch=1))
    assert (resumed.micro, resumed.accum) == (1, 4)
    ref = Trainer(run, out / "ref", tokens, VOCAB, progress=False)
    assert (ref.micro, ref.accum) == (4, 1)
    log = lambda d: [json.loads(x) for x in (d / "train_log.jsonl").read_text().splitlines()]  # noqa: E731
    return dict(resumed=resumed.fit(), resumed_log=log(out / "resumed"), ref=ref.fit(), ref_log=log(out / "ref"),
                ref_params={n: p.detach() for n, p in ref.model.named_parameters()},
                resumed_params=load_file(str(out / "resumed" / "final" / "model.safetensors")),
                ddp_params=load_file(str(out / "ddp.safetensors")),
                ddp_losses=json.loads((out / "ddp.json").read_text()))


def test_two_ranks_stopped_at_step_2_resume_in_one_process_to_the_uninterrupted_result(two_ranks_then_one):
    got = two_ranks_then_one
    assert got["resumed"]["resumed_from"] == 2 and got["resumed"]["steps"] == 4 and got["resumed"]["world_size"] == 1
    assert [r["step"] for r in got["resumed_log"]] == [3, 4]
    assert [r["loss"] for r in got["resumed_log"]] == pytest.approx([r["loss"] for r in got["ref_log"][2:]], rel=1e-5)
    assert got["resumed"]["final_loss"] == pytest.approx(got["ref"]["final_loss"], rel=1e-5)
    assert got["resumed_params"].keys() == got["ref_params"].keys()
    for n, p in got["ref_params"].items():
        torch.testing.assert_close(got["resumed_params"][n], p, rtol=1e-4, atol=ATOL, msg=n)


def test_two_ddp_ranks_of_two_micro_batches_equal_one_process_in_losses_and_weights(two_ranks_then_one):
    """2 ranks x 2 micro-batches under DDP (no_sync on the first, one all-reduce) take the
    steps of one process with the 4 sequences in one pass: the same global-batch loss at every
    step and the same weights after 4 steps."""
    got = two_ranks_then_one
    assert got["ddp_losses"] == pytest.approx([r["loss"] for r in got["ref_log"]], rel=1e-5)
    assert len(set(got["ddp_losses"])) == 4  # the steps trained: the loss moved every step
    for n, p in got["ref_params"].items():
        torch.testing.assert_close(got["ddp_params"][n], p, rtol=1e-4, atol=ATOL, msg=n)
