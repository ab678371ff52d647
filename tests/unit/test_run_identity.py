"""Run identity = what is trained (issue 29). How a run computes (micro-batch, activation
checkpointing, compile, loss chunking, the attention kernel and fused optimizer, the site's
GPUs) moves no run id; what decides the trained weights (lr, tokens, seed, data order,
architecture, precision) moves it.

Ids are taken where the workflow takes them: a grid expanded for a mode, planned with a
preset file (``mor.launch plan``, whose run ids are the ones the train job trains under)."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest
import torch
import yaml

from helpers.paths import REPO
from helpers.tiny import VOCAB, tiny_run
from mor.config import ConfigError, ModelConfig, RunConfig, TrainConfig, run_config_from_dict
from mor.grids import grid_path, load_grid
from mor.launch.cost import plan_grid
from mor.launch.presets import load_presets


def _ids(grid) -> list[str]:
    return [r.run_id for r in grid.runs]


def _presets(tmp_path: Path, name: str, site: str, execution: dict) -> Path:
    """slurm/presets.yaml with another site and every train entry's execution replaced."""
    raw = yaml.safe_load((REPO / "slurm" / "presets.yaml").read_text())
    raw["site"] = site
    for kinds in raw["scales"].values():
        if isinstance(kinds.get("train"), dict) and kinds["train"].get("gpus_per_node"):
            kinds["train"]["execution"] = dict(execution)
    out = tmp_path / f"{name}.yaml"
    out.write_text(yaml.safe_dump(raw))
    return out


EXECUTIONS = {
    "micro_batch": {"micro_batch": 2},
    "activation_checkpointing": {"activation_checkpointing": True},
    "compile": {"compile": True},
    "loss_chunk": {"loss_chunk": 512},
    "attention": {"attention": "sdpa"},
    "fused_optimizer": {"fused_optimizer": "off"},
}


def test_execution_settings_and_the_site_move_no_run_id(tmp_path):
    grid = load_grid(grid_path("table10"), "cluster")
    ref = plan_grid(grid, load_presets(_presets(tmp_path, "ref", "a100-80gb", {"micro_batch": "auto"})))
    ref_ids = sorted({j.run_id for j in ref})
    assert ref_ids == sorted(_ids(grid)) and len(ref_ids) > 10
    cases = {**{k: ("a100-80gb", v) for k, v in EXECUTIONS.items()},
             "site h100": ("h100-80gb", {"micro_batch": "auto"}), "site h200": ("h200", {"micro_batch": "auto"})}
    for name, (site, execution) in cases.items():
        presets = load_presets(_presets(tmp_path, name.replace(" ", "_"), site, execution))
        jobs = plan_grid(grid, presets)
        assert sorted({j.run_id for j in jobs}) == ref_ids, name
        if name == "micro_batch":  # the setting did reach the jobs: their micro-batch changed
            assert {j.micro_batch for j in jobs if j.kind == "train"} == {2}


def test_execution_settings_cannot_be_set_in_a_grid():
    """They live in the presets (mor.config.ExecConfig); a grid that sets one is refused, so
    no such setting can slip into a run's hashed fields."""
    base = tiny_run().to_dict()
    for key in EXECUTIONS:
        if key == "micro_batch":
            continue  # train.micro_batch exists: see the next test
        bad = {**base, "train": {**base["train"], key: EXECUTIONS[key][key]}}
        with pytest.raises(ConfigError, match=rf"unknown key\(s\) \['{key}'\]"):
            run_config_from_dict(bad)


def test_changing_train_micro_batch_in_paper_10b_renames_no_run(tmp_path, monkeypatch):
    """The issue's case: a site with smaller GPUs sets a smaller micro-batch for the cluster
    mode (grids/modes/paper-10B.yaml); under data_order 'sequence' every table10 id stays."""
    grids = tmp_path / "grids"
    shutil.copytree(REPO / "grids" / "modes", grids / "modes")
    shutil.copy(REPO / "grids" / "table10.yaml", grids / "table10.yaml")
    mode_file = grids / "modes" / "paper-10B.yaml"
    text = mode_file.read_text()
    assert "micro_batch: 16," in text
    ref = load_grid(grids / "table10.yaml", "cluster")
    assert {r.config.train.micro_batch for r in ref.runs} == {16}
    for mb in (8, 4, 1):
        mode_file.write_text(text.replace("micro_batch: 16,", f"micro_batch: {mb},"))
        got = load_grid(grids / "table10.yaml", "cluster")
        assert {r.config.train.micro_batch for r in got.runs} == {mb}  # the edit took effect
        assert _ids(got) == _ids(ref), mb
    assert len(_ids(ref)) >= 20
    # before this rule every one of them was renamed (the test can fail)
    import mor.identity

    monkeypatch.setattr(mor.identity, "ORDER_NEUTRAL_FIELDS", {})
    assert not set(_ids(load_grid(grids / "table10.yaml", "cluster"))) & set(_ids(ref))


def _run(**train) -> RunConfig:
    model = ModelConfig(scale="tiny", variant="mor", tying="middle_cycle", num_recursions=2)
    base = dict(tokens=8192, seq_len=64, global_batch=8, micro_batch=8)
    return RunConfig(grid="g", model=model, train=TrainConfig(**{**base, **train}))


def test_what_changes_training_moves_the_id():
    ref = _run()
    assert ref.train.data_order == "sequence"
    moved = {
        "lr": _run(lr=1e-3),
        "tokens": _run(tokens=16384),
        "seed": _run(seed=1),
        "data order": _run(data_order="rank"),
        "precision": _run(precision="fp32"),
        "global batch": _run(global_batch=16),
        "recursions": dataclasses.replace(ref, model=dataclasses.replace(ref.model, num_recursions=3)),
        "tying": dataclasses.replace(ref, model=dataclasses.replace(ref.model, tying="cycle")),
        "variant": dataclasses.replace(ref, model=dataclasses.replace(ref.model, variant="recursive")),
        "scale": dataclasses.replace(ref, model=dataclasses.replace(ref.model, scale="micro")),
    }
    for name, run in moved.items():
        assert run.config_hash != ref.config_hash, name
        assert run.run_id != ref.run_id, name
    # under data_order "sequence" the draw size decides nothing and names nothing...
    assert _run(micro_batch=4).run_id == ref.run_id == _run(micro_batch=1).run_id
    # ...under "rank" it keys the draws (which sequences a step trains on), so it stays in the id
    assert _run(data_order="rank", micro_batch=4).run_id != _run(data_order="rank").run_id
    # labels, eval settings and the grid's name are no part of it either
    assert dataclasses.replace(ref, label="x", grid="other").run_id == ref.run_id


def test_the_id_is_cached_and_follows_a_replaced_config():
    ref = _run()
    assert ref.run_id is ref.run_id  # computed once per config
    other = dataclasses.replace(ref, train=dataclasses.replace(ref.train, lr=1e-3))
    assert other.run_id != ref.run_id and other.config_hash == RunConfig(**{
        f.name: getattr(other, f.name) for f in dataclasses.fields(RunConfig)}).config_hash


def test_train_micro_batch_under_sequence_order_trains_the_same_weights(data_root, tmp_path):
    """Why it may leave the id: with data_order 'sequence' a step trains on the same
    sequences whatever train.micro_batch is, and the passes it sets change float summation
    order only (the same tolerance as tests/unit/test_exec_settings.py)."""
    from mor.train.trainer import Trainer

    tokens = data_root / "tokens" / f"train-bpe-{VOCAB}.npy"
    trained = []
    for mb in (8, 2):
        run = tiny_run(steps=3, batch=8, seq_len=32, variant="mor", nr=2)
        run = dataclasses.replace(run, train=dataclasses.replace(run.train, micro_batch=mb))
        tr = Trainer(run, tmp_path / f"mb{mb}", tokens, VOCAB, progress=False)
        assert tr.micro == mb
        for _ in range(3):
            tr.train_step()
        trained.append(tr)
    a, b = trained
    assert a.run.run_id == b.run.run_id
    for (n, p), q in zip(a.model.named_parameters(), b.model.parameters()):
        torch.testing.assert_close(q, p, rtol=1e-4, atol=5e-5, msg=n)
