"""isoFLOP budgets the authors' way (issue 55 item 4, mor.branching): one warmup-stable run per
model, each smaller budget a decay branch from the checkpoint the stable run keeps at the
branch's decay start. A branch must train what a straight run of its budget (with the stable
run's warmup) trains, start from the stable run's checkpoint, resume, and never train the
stable run's steps again."""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np
import pytest
import torch

from helpers.tiny import VOCAB, tiny_run
from mor.branching import branch_budgets, trained_steps
from mor.config import ConfigError
from mor.grids import GridError, load_grid
from mor.train.checkpoint import CheckpointError
from mor.train.trainer import Trainer

SEQ, BATCH = 16, 4


def _run(steps, **train):
    run = tiny_run(steps=steps, batch=BATCH, seq_len=SEQ)
    t = dict(warmup_frac=0.125, decay_frac=0.25, checkpoint_every=4)  # warmup round(2.5) = round(1.5) = 2
    t.update(train)
    return dataclasses.replace(run, train=dataclasses.replace(run.train, **t))


def _pool(tmp_path):
    path = tmp_path / "pool.npy"
    np.save(path, np.random.default_rng(0).integers(0, VOCAB, 20_000).astype(np.uint16))
    return path


def _losses(run_dir):
    return {r["step"]: r["loss"] for r in map(json.loads, (run_dir / "train_log.jsonl").read_text().splitlines())}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A stable run of 20 steps keeping step 9; a 12-step branch from it (decay start 12 - 3 = 9);
    the same 12 steps trained straight."""
    tmp = tmp_path_factory.mktemp("branch")
    pool = _pool(tmp)
    runs = tmp / "runs" / "test"
    stable_cfg, branch_cfg = (r for r in branch_budgets([_run(20), _run(12)], lambda r: r, lambda r, rc: rc))
    stable = Trainer(stable_cfg, runs / stable_cfg.run_id, pool, VOCAB, progress=False)
    stable.fit()
    weights = stable.files.weights
    before = (weights.stat().st_mtime_ns, _losses(stable.run_dir))
    branch = Trainer(branch_cfg, runs / branch_cfg.run_id, pool, VOCAB, progress=False)
    summary = branch.fit()
    straight_cfg = _run(12)
    straight = Trainer(straight_cfg, runs / straight_cfg.run_id, pool, VOCAB, progress=False)
    straight.fit()
    return dict(pool=pool, runs=runs, stable=stable, branch=branch, straight=straight, summary=summary,
                before=before, stable_cfg=stable_cfg, branch_cfg=branch_cfg)


def test_budgets_become_one_stable_run_and_branches_at_their_decay_start(trained):
    stable, branch = trained["stable_cfg"], trained["branch_cfg"]
    assert stable.train.save_steps == (9,) and stable.run_id == _run(20).run_id  # kept points rename nothing
    assert (branch.train.branch_run, branch.train.branch_step) == (stable.run_id, 9)
    assert branch.run_id != _run(12).run_id  # the branch's identity: stable run + branch point
    assert trained_steps(branch) == 3 and trained_steps(stable) == 20
    with pytest.raises(ConfigError, match=r"train\.branch_step=8 must be this run's decay start 9"):
        dataclasses.replace(branch, train=dataclasses.replace(branch.train, branch_step=8))


def test_a_branch_reproduces_the_straight_run_from_the_stable_checkpoint(trained):
    b, s = trained["branch"], trained["straight"]
    assert trained["summary"]["branched_from"] == {"run": trained["stable_cfg"].run_id, "step": 9}
    assert trained["summary"]["steps"] == 12 and trained["summary"]["resumed_from"] is None
    got, want = _losses(b.run_dir), _losses(s.run_dir)
    assert sorted(got) == [10, 11, 12]  # the branch trained its decay, nothing before it
    assert [got[k] for k in (10, 11, 12)] == pytest.approx([want[k] for k in (10, 11, 12)], abs=1e-5)
    for (n, p), (_, q) in zip(b.model.named_parameters(), s.model.named_parameters()):
        assert torch.allclose(p, q, atol=1e-5), n
    # and it is not the stable run's end: the decay changed the weights
    stable = dict(trained["stable"].model.named_parameters())
    assert any(not torch.allclose(p, stable[n], atol=1e-4) for n, p in b.model.named_parameters())


def test_the_stable_run_is_trained_once_and_keeps_its_branch_point(trained):
    stable = trained["stable"]
    mtime, losses = trained["before"]
    assert stable.files.weights.stat().st_mtime_ns == mtime and _losses(stable.run_dir) == losses
    assert sorted(losses) == list(range(1, 21))
    kept = stable.ckpt_dir / "branch" / "step-000009"
    assert kept.is_dir() and json.loads((kept / "state.json").read_text())["step"] == 9
    assert not (stable.ckpt_dir / "step-000008").exists()  # the rotated checkpoints are gone, the branch point stays
    # re-entering the finished stable run trains nothing
    again = Trainer(trained["stable_cfg"], stable.run_dir, trained["pool"], VOCAB, progress=False).fit()
    assert again["steps"] == 20 and stable.files.weights.stat().st_mtime_ns == mtime


def test_a_branch_killed_mid_decay_resumes_from_its_own_checkpoint(trained, tmp_path):
    """Killed after its first decay step (its own checkpoint at step 10): the next session resumes
    from that checkpoint, not from the stable run's, and ends where the uninterrupted branch did."""
    cfg, stable_id = trained["branch_cfg"], trained["stable_cfg"].run_id
    runs = tmp_path / "runs" / "test"
    runs.mkdir(parents=True)
    os.symlink(trained["runs"] / stable_id, runs / stable_id)  # the stable run, as the branch's sibling
    first = Trainer(cfg, runs / cfg.run_id, trained["pool"], VOCAB, progress=False)
    first.start_branch()
    assert first.step == 9
    first.train_step()
    first.save()  # killed after step 10
    resumed = Trainer(cfg, runs / cfg.run_id, trained["pool"], VOCAB, progress=False)
    summary = resumed.fit()
    assert summary["resumed_from"] == 10 and sorted(_losses(runs / cfg.run_id)) == [11, 12]
    for (n, p), (_, q) in zip(resumed.model.named_parameters(), trained["branch"].model.named_parameters()):
        assert torch.allclose(p, q, atol=1e-6), n


def test_a_branch_without_its_stable_checkpoint_stops_naming_it(tmp_path):
    cfg = dataclasses.replace(_run(12), train=dataclasses.replace(_run(12).train, branch_run="tiny-vanilla-0123abcd",
                                                                   branch_step=9))
    tr = Trainer(cfg, tmp_path / "runs" / "test" / cfg.run_id, _pool(tmp_path), VOCAB, progress=False)
    with pytest.raises(CheckpointError, match=r"tiny-vanilla-0123abcd/checkpoints/branch/step-000009 does not exist: "
                                              r"run tiny-vanilla-0123abcd has kept no checkpoint at step 9"):
        tr.fit()


GRID = """name: {name}
runs:
  - name: vanilla
    axes: {{model.scale: [135M]}}
    set: {{model.variant: vanilla}}
modes:
  local:
    scale_map: {{135M: tiny}}
    branch_budgets: {branch}
    axes: {{train.budget_flops: [{budgets}]}}
    set:
      data: {{tokenizer: bpe-4096}}
      train: {{seq_len: 32, global_batch: 4, micro_batch: 4, checkpoint_every: 2, warmup_frac: {warm}}}
      eval: {{nll_tokens: 256, batch: 4}}
"""


def _grid(tmp_path, branch=True, budgets="2.0e9, 5.0e9, 16.5e9", warm=0.01):
    path = tmp_path / "g.yaml"
    path.write_text(GRID.format(name="g", branch=str(branch).lower(), budgets=budgets, warm=warm))
    return load_grid(path, "local")


def test_a_grid_mode_branches_its_budgets(tmp_path):
    straight = {r.config.train.budget_flops: r for r in _grid(tmp_path, branch=False).runs}
    branched = {r.config.train.budget_flops: r for r in _grid(tmp_path).runs}
    stable = branched[16.5e9].config
    assert stable.run_id == straight[16.5e9].run_id
    points = []
    for b in (2.0e9, 5.0e9):
        t = branched[b].config.train
        assert t.steps == straight[b].config.train.steps  # the budget's step count is mor.budget's
        assert (t.branch_run, t.branch_step) == (stable.run_id, t.steps - round(t.steps * 0.2))
        points.append(t.branch_step)
    assert stable.train.save_steps == tuple(points)
    with pytest.raises(GridError, match=r"modes\.local\.branch_budgets: run .* would branch at step \d+, outside "
                                        r"the stable phase"):
        _grid(tmp_path, warm=0.7)
