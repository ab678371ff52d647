"""A grid's run that imports the authors' checkpoint (``model.import_checkpoint``, issue 62): its
id follows the checkpoint's path and bytes, a bad path stops the grid at its line, the import job
checks the grid's model and vocabulary against the checkpoint, and our engine decodes the imported
model exactly as ``mor.model.decode.generate`` does. (tests/workflow/test_authors_workflow.py runs
eval, lmeval and the engine on it through Snakemake.)"""

from __future__ import annotations

import dataclasses
import json
import random
import shutil
from pathlib import Path

import pytest
import torch

from mor.checkpoint_identity import folder_digest
from mor.checkpoints.authors import import_checkpoint
from mor.authors.import_job import import_job
from mor.checkpoints.native import CheckpointError
from mor.config import ConfigError, ModelConfig
from mor.engine import Engine, Request
from mor.grids import GridError, load_grid
from mor.jobs import import_kind
from mor.trained import open_run

from helpers.engine import solo

FIXTURES = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "authors_ckpt"
CASES = json.loads((FIXTURES / "cases.json").read_text())
SHIPPED = Path(__file__).resolve().parents[2] / "grids" / "imported" / "imported.yaml"
# the fixtures our engine serves: tied attention (the release's untied expert-choice is decode-only)
TIED = [n for n, c in CASES.items() if c[5] == "tied"]


def _grid(tmp_path: Path, ckpt: Path, pin: str = "") -> Path:
    """The shipped example grid, pointed at ``ckpt`` (pinned to ``pin``)."""
    text = SHIPPED.read_text().replace("tests/fixtures/authors_ckpt/expert_mc3_tied_v512", str(ckpt))
    if pin:
        text = text.replace(f"model.import_checkpoint: {ckpt}", f"model.import_checkpoint: {ckpt}, model.import_sha256: {pin}")
    folder = tmp_path / "grids"
    folder.mkdir(exist_ok=True)
    (folder / "imported.yaml").write_text(text)
    return folder / "imported.yaml"


def _run(path: Path):
    (run,) = load_grid(path, "local").runs
    return run.config


def test_shipped_grid_imports_a_fixture_and_hashes_it():
    cfg = _run(SHIPPED)
    assert cfg.model.import_sha256 == folder_digest(FIXTURES / "expert_mc3_tied_v512")
    assert "-imported-" in cfg.run_id and import_kind("train", cfg) == "import"
    assert cfg.training_dict()["model"]["import_sha256"] == cfg.model.import_sha256


def test_run_id_follows_the_checkpoints_path_and_bytes(tmp_path):
    first = _run(_grid(tmp_path, FIXTURES / "expert_mc3_tied_v512")).run_id
    assert _run(_grid(tmp_path, FIXTURES / "expert_mc3_tied_v512")).run_id == first  # read again: the same run
    copy = tmp_path / "copy"
    shutil.copytree(FIXTURES / "expert_mc3_tied_v512", copy)
    moved = _run(_grid(tmp_path, copy)).run_id
    assert moved != first  # an edited path is never silently the old run
    (copy / "authors_config.yaml").write_text((copy / "authors_config.yaml").read_text() + "# edited\n")
    assert _run(_grid(tmp_path, copy)).run_id not in (first, moved)  # other bytes: another run folder


def test_runs_without_the_key_keep_their_ids():
    cfg = _run(SHIPPED)
    plain = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, import_checkpoint="", import_sha256=""))
    assert {"import_checkpoint", "import_sha256"}.isdisjoint(plain.training_dict()["model"])
    assert "imported" not in plain.run_id


def _without_weights(tmp: Path) -> Path:
    (tmp / "c").mkdir()
    (tmp / "c" / "config.json").write_text("{}")
    return tmp / "c"


@pytest.mark.parametrize("make, match", [
    (lambda tmp: tmp / "absent", "no such folder"),
    (lambda tmp: tmp, "has no config.json"),
    (_without_weights, "has no weights"),
])
def test_a_bad_path_stops_the_grid_at_its_line(tmp_path, make, match):
    path = _grid(tmp_path, make(tmp_path))
    line = next(i for i, s in enumerate(path.read_text().splitlines(), 1) if "model.import_checkpoint:" in s)
    with pytest.raises(GridError, match=match) as e:
        load_grid(path, "local")
    assert str(e.value).startswith(f"{path}, line {line}: key model.import_checkpoint")
    assert "\n" not in str(e.value)


def test_a_pin_that_is_not_the_folders_is_refused(tmp_path):
    good = folder_digest(FIXTURES / "expert_mc3_tied_v512")
    assert _run(_grid(tmp_path, FIXTURES / "expert_mc3_tied_v512", pin=good)).model.import_sha256 == good
    with pytest.raises(GridError, match="the checkpoint changed since the grid pinned it"):
        load_grid(_grid(tmp_path, FIXTURES / "expert_mc3_tied_v512", pin="ab" * 32), "local")


def test_the_config_refuses_what_an_import_cannot_be():
    with pytest.raises(ConfigError, match="import_checkpoint is not set"):
        ModelConfig(scale="tiny", variant="mor", num_recursions=3, import_sha256="0" * 64)
    with pytest.raises(ConfigError, match="MoR checkpoints only"):
        ModelConfig(scale="tiny", variant="recursive", num_recursions=3, import_checkpoint="x")


def test_the_grids_model_must_be_the_checkpoints(tmp_path):
    cfg = _run(SHIPPED)
    wrong = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, kv="shared"))
    with pytest.raises(CheckpointError, match=r"says model\.kv='shared', but the checkpoint is model\.kv='recursion_wise'"):
        import_checkpoint(FIXTURES / "expert_mc3_tied_v512", tmp_path / "run", run=wrong)
    assert not (tmp_path / "run").exists()  # refused before anything is written


def test_the_imported_folder_is_the_grids_run(tmp_path):
    """open_run with the grid's config (as a workflow job opens it) checks the summary's config hash."""
    cfg = _run(SHIPPED)
    meta = import_checkpoint(FIXTURES / "expert_mc3_tied_v512", tmp_path / "run", run=cfg)
    assert meta["provenance"]["import_sha256"] == cfg.model.import_sha256
    assert meta["provenance"]["authors_commit"] == "aef56f7"
    run = open_run(tmp_path / "run", config=cfg, device="cpu")
    assert run.summary["config_hash"] == cfg.config_hash and run.model.embed_tokens.weight.shape[0] == 512


def test_a_vocabulary_that_is_not_the_datas_is_refused_before_anything_is_written(tmp_path):
    from mor.data.tokenizer import train_bpe

    text = tmp_path / "train.txt"
    text.write_text("the authors' checkpoint and our tokenizer\n" * 50)
    train_bpe(text, 300, tmp_path / "data" / "tokenizer" / "bpe-300.json")
    path = _grid(tmp_path, FIXTURES / "expert_mc3_tied_v512")
    path.write_text(path.read_text().replace("tokenizer: bpe-512", "tokenizer: bpe-300"))
    (run,) = load_grid(path, "local").runs
    with pytest.raises(CheckpointError, match=r"vocabulary 512, but run .* reads data.tokenizer 'bpe-300'"):
        import_job(str(path), run.run_id, "local", str(tmp_path / "run"), data_root=str(tmp_path / "data"))
    assert not (tmp_path / "run").exists()


def _requests(vocab: int, n: int = 7, seed: int = 0) -> list[Request]:
    rnd = random.Random(seed)
    return [Request(i, [rnd.randrange(vocab) for _ in range(rnd.randint(1, 6))], rnd.randint(1, 9)) for i in range(n)]


@pytest.mark.parametrize("name", TIED)
def test_engine_equals_generate_on_the_imported_model(name, tmp_path):
    """Their weights in our depth-wise batching engine: greedy tokens identical to each request
    generated alone by mor.model.decode.generate (the engine tests' reference, helpers.engine.solo)."""
    import_checkpoint(FIXTURES / name, tmp_path / "run")
    model = open_run(tmp_path / "run", device="cpu").model
    reqs = _requests(model.embed_tokens.weight.shape[0])
    with torch.no_grad():
        res = Engine(model, batch=3, max_len=16).run(reqs)
        assert sorted(res.outputs) == [r.id for r in reqs]
        for r in reqs:
            assert res.outputs[r.id] == solo(model, r), f"request {r.id}"
    ran = res.recursion_tokens()
    assert min(ran) < ran[0]  # their routers sent tokens out early: the depth-wise batching was exercised


def test_the_plan_and_the_dag_agree_on_an_imported_runs_jobs():
    """No GPU job imports (the import runs where the workflow runs); the engine measures it when it
    serves it (tied attention), as common.smk's throughput_result asks mor.throughput_protocol.measured."""
    from mor.launch.cost import run_jobs
    from mor.throughput_protocol import measured

    grid = load_grid(SHIPPED, "local")
    cfg = grid.runs[0].config
    assert [k for k, _ in run_jobs(grid, cfg)] == ["eval", "lmeval", "throughput"]
    untied = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, recursion_attention="untied"))
    assert measured((), cfg) and not measured((), untied) and measured(("tables/fig4a",), untied)
