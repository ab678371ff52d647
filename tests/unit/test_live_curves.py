"""Live curves: the train log mirrored to TensorBoard, read back with TensorBoard's own reader
(its EventAccumulator, what ``tensorboard --logdir`` runs), step for step and value for value;
a resumed run shows each step once; a sink that is not installed never stops training."""

from __future__ import annotations

import importlib.util
import math
import shutil

import numpy as np
import pytest

from helpers.tiny import VOCAB, tiny_run
from mor.train.live_curves import LiveCurves, parse_setting, scalars, tag
from mor.train.trainer import Trainer
from mor.train_log import read_train_log

pytest.importorskip("tensorboard", reason="tensorboard is in the test extra (pip install -e '.[test]')")


def _trainer(run, run_dir, data_root, sinks=("tensorboard",)):
    tr = Trainer(run, run_dir, data_root / "tokens" / f"train-bpe-{VOCAB}.npy", VOCAB, progress=False)
    tr.curves = LiveCurves(sinks, run_dir, run.run_id, run.to_dict()) if sinks else None
    return tr


def _read_events(folder) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0})  # 0: keep every event
    acc.Reload()
    return {t: [(e.step, e.value) for e in acc.Scalars(t)] for t in acc.Tags()["scalars"]}


def _expected(log) -> dict[str, list[tuple[int, float]]]:
    """What the train log says, per curve: every finite number of every logged row, as float32
    (the precision of a TensorBoard scalar)."""
    out: dict[str, list[tuple[int, float]]] = {}
    for row in log.to_dict("records"):
        for key, value in row.items():
            if key == "step" or not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
                continue
            out.setdefault(tag(key), []).append((int(row["step"]), float(np.float32(value))))
    return out


def test_tensorboard_shows_the_train_logs_steps_and_values_router_statistics_included(data_root, tmp_path):
    run = tiny_run(variant="mor", nr=2, steps=8, batch=4)
    d = tmp_path / "run"
    _trainer(run, d, data_root).fit()
    log = read_train_log(d / "train_log.jsonl")
    got, want = _read_events(d / "tensorboard"), _expected(log)
    assert got == want
    assert {"train/loss", "train/lr", "train/grad_norm", "router/aux_loss"} <= set(got)
    assert any(t in got for t in ("router/max_vio", "router/sampling_accuracy"))  # a MoR run's router statistic
    assert [s for s, _ in got["train/loss"]] == list(log["step"])


def test_a_resumed_run_shows_each_step_once(data_root, tmp_path):
    """Killed after step 8 with only step 4's checkpoint left: the resume redoes steps 5-8, and
    TensorBoard drops the first session's 5-8 (purge_step) instead of showing them twice."""
    run = tiny_run(variant="vanilla", steps=8, batch=4)
    d = tmp_path / "run"
    _trainer(run, d, data_root).fit()
    for gone in ("final", "checkpoints/step-000008"):
        shutil.rmtree(d / gone)
    for gone in ("train_summary.json", "checkpoints/latest.json"):
        (d / gone).unlink()
    assert _trainer(run, d, data_root).fit()["resumed_from"] == 4
    got = _read_events(d / "tensorboard")
    assert [s for s, _ in got["train/loss"]] == list(range(1, 9))
    assert got == _expected(read_train_log(d / "train_log.jsonl"))


def test_a_sink_that_is_not_installed_warns_and_training_goes_on(data_root, tmp_path, capsys):
    if importlib.util.find_spec("wandb") is not None:
        pytest.skip("wandb is installed here: its offline run would start")
    run = tiny_run(variant="vanilla", steps=4, batch=4)
    d = tmp_path / "run"
    assert _trainer(run, d, data_root, sinks=("wandb", "tensorboard")).fit()["steps"] == 4
    assert "live_curves: wandb is not installed" in capsys.readouterr().err
    assert [s for s, _ in _read_events(d / "tensorboard")["train/loss"]] == [1, 2, 3, 4]


def test_off_by_default_and_a_bad_setting_is_named(tmp_path, monkeypatch):
    from mor.launch.presets import PresetError, load_presets

    assert parse_setting(None) == parse_setting("off") == parse_setting("") == ()
    assert parse_setting("TensorBoard, wandb") == ("tensorboard", "wandb")
    with pytest.raises(ValueError, match=r"unknown sink\(s\) \['tensorbord'\]"):
        parse_setting("tensorbord")
    monkeypatch.delenv("MOR_SITE", raising=False)
    presets = tmp_path / "p.yaml"
    presets.write_text("scales: {135M: {train: {gpus_per_node: 1, live_curves: tensorboard}, eval: {gpus_per_node: 1}}}")
    loaded = load_presets(presets)
    assert loaded.get("135M", "train").live_curves == "tensorboard" and loaded.get("135M", "eval").live_curves == ""
    presets.write_text("scales: {135M: {train: {live_curves: tensorbord}}}")
    with pytest.raises(PresetError, match=rf"{presets}: scales.135M.train.live_curves: 'tensorbord': unknown sink"):
        load_presets(presets)
    assert scalars({"step": 3, "loss": 2.5, "mfu": None, "lr": float("nan"), "note": "x"}) == {"train/loss": 2.5}


class _FakeWandb:
    """A stand-in ``wandb`` module (the real one is an optional extra): records ``init``'s
    arguments and every ``log`` call."""

    def __init__(self):
        self.inits, self.logged, self.finished = [], [], 0

    def init(self, **kwargs):
        self.inits.append(kwargs)
        fake = self

        class _Run:
            def log(self, values, step):
                fake.logged.append((step, values))

            def finish(self):
                fake.finished += 1

        return _Run()


@pytest.mark.parametrize("env, mode, project", [({}, "offline", "mor-repro"),
                                                ({"WANDB_MODE": "online", "WANDB_PROJECT": "lab"}, "online", "lab"),
                                                ({"WANDB_MODE": "disabled"}, "disabled", "mor-repro")])
def test_wandb_honours_wandb_mode_and_files_the_run_under_grid_block_and_variant(tmp_path, monkeypatch, env, mode,
                                                                                 project):
    from mor.train.live_curves import RunLabels

    fake = _FakeWandb()
    monkeypatch.setitem(__import__("sys").modules, "wandb", fake)
    for key in ("WANDB_MODE", "WANDB_PROJECT"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    curves = LiveCurves(("wandb",), tmp_path, "135M-mor-abc", {"grid": "table3"},
                        RunLabels(grid="table3", block="mor_expert", variant="mor"))
    curves.start(0)
    curves.write({"step": 1, "loss": 2.5, "max_vio": 0.25, "note": "text"})
    curves.close()
    [kw] = fake.inits
    assert kw["mode"] == mode and kw["project"] == project
    assert kw["group"] == "table3" and kw["tags"] == ["mor_expert", "mor"]
    assert kw["id"] == kw["name"] == "135M-mor-abc" and kw["resume"] == "allow" and kw["dir"] == str(tmp_path)
    assert fake.logged == [(1, {"train/loss": 2.5, "router/max_vio": 0.25})] and fake.finished == 1


def test_the_train_job_files_its_wandb_run_under_the_grid_block_and_variant(data_root, tmp_path, monkeypatch):
    """``MOR_LIVE_CURVES=wandb`` through the train job: group is the grid's name, tags the block
    that produced the run and its variant (read from the grid, not passed by hand)."""
    from helpers.tiny import tiny_grid_file
    from mor.grids import load_grid
    from mor.train.job import train_job

    fake = _FakeWandb()
    monkeypatch.setitem(__import__("sys").modules, "wandb", fake)
    monkeypatch.setenv("MOR_LIVE_CURVES", "wandb")
    monkeypatch.delenv("WANDB_MODE", raising=False)
    grid = tiny_grid_file(tmp_path / "tiny.yaml")
    g = load_grid(grid, "local")
    run = g.runs[0]
    train_job(str(grid), run.run_id, "local", str(tmp_path / "run"), data_root=str(data_root), device="cpu", threads=1)
    [kw] = fake.inits
    assert kw["group"] == g.name and kw["tags"] == [run.block, run.config.model.variant] and kw["mode"] == "offline"
    assert [step for step, _ in fake.logged] and fake.finished == 1
