"""Checkpoints the authors' code saved (tests/fixtures/authors_ckpt/, by benchmarks/authors_checkpoints.py)
imported as our run folders (mor.checkpoints.authors): the imported model's training forward gives
their logits (<= 1e-6) and routes the same tokens; every weight is accounted for."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from mor.checkpoints.authors import import_checkpoint, open_imported
from mor.checkpoints.native import CheckpointError

FIXTURES = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "authors_ckpt"
CASES = json.loads((FIXTURES / "cases.json").read_text())


def _forward(run_dir: Path, expected):
    model = open_imported(run_dir).train()  # their training forward: top-k routing
    ids = torch.from_numpy(expected["input_ids"])
    with torch.no_grad():
        return model, model(ids, targets=ids)


@pytest.mark.parametrize("name", list(CASES))
def test_import_matches_their_logits_and_routing(name, tmp_path):
    router, sharing, nr, _, kv, attention = CASES[name]
    meta = import_checkpoint(FIXTURES / name, tmp_path / "run")
    m = meta["model"]
    assert (m["router"]["type"], m["tying"], m["num_recursions"]) == (f"{router}_choice", sharing, nr)
    assert m["kv"] == ("shared" if kv else "recursion_wise")
    assert m["recursion_attention"] == attention
    prov = meta["provenance"]
    assert prov["authors_commit"] == "aef56f7" and "pytorch_model.bin" in prov["files_sha256"]
    expected = np.load(FIXTURES / name / "expected.npz")
    model, out = _forward(tmp_path / "run", expected)
    assert (out.logits - torch.from_numpy(expected["logits"])).abs().max().item() <= 1e-6
    if router == "expert":
        mismatches = (torch.stack(out.routing.selected).numpy() != expected["selected"]).sum()
    else:
        mismatches = (out.routing.assignment.numpy() != expected["depth_id"]).sum()
    assert mismatches == 0


@pytest.mark.parametrize("name", list(CASES))
def test_imported_folder_is_a_finished_run(name, tmp_path):
    """The fixtures have our `tiny` scale's shape: the folder is a run that open_run (the one way
    eval, lmeval, analysis and the engine open a trained run) opens, with the same forward."""
    from mor.trained import open_run

    meta = import_checkpoint(FIXTURES / name, tmp_path / "run")
    assert meta["config"]["model"]["scale"] == "tiny"
    run = open_run(tmp_path / "run", device="cpu")
    expected = np.load(FIXTURES / name / "expected.npz")
    ids = torch.from_numpy(expected["input_ids"])
    with torch.no_grad():
        out = run.model.train()(ids, targets=ids)
    assert (out.logits - torch.from_numpy(expected["logits"])).abs().max().item() <= 1e-6


def test_fixtures_cover_the_issue():
    cases = list(CASES.values())
    assert {c[0] for c in cases} == {"expert", "token"}
    assert {c[1] for c in cases} == {"middle_cycle", "cycle"}
    assert {c[4] for c in cases} == {True, False} and {c[5] for c in cases} == {"tied", "untied"}
    assert sum(f.stat().st_size for f in FIXTURES.rglob("*") if f.is_file()) < 1_100_000  # 1.03 MB: expert_mc3_tied_v512 (issue 62) holds a bpe-512 vocabulary


def _edited(tmp_path: Path, edit) -> Path:
    src = FIXTURES / "expert_mc3_kv_tied"
    ckpt = tmp_path / "ckpt"
    shutil.copytree(src, ckpt)
    sd = torch.load(ckpt / "pytorch_model.bin", weights_only=True)
    edit(sd)
    torch.save(sd, ckpt / "pytorch_model.bin")
    return ckpt


def test_missing_weight_is_named(tmp_path):
    key = "model.layers.2.block.0.mlp.up_proj.weight"
    ckpt = _edited(tmp_path, lambda sd: sd.pop(key))
    with pytest.raises(CheckpointError, match=f"missing weight {key}"):
        import_checkpoint(ckpt, tmp_path / "run")


def test_missing_router_is_named(tmp_path):
    ckpt = _edited(tmp_path, lambda sd: sd.pop("model.norm.weight"))
    with pytest.raises(CheckpointError, match="missing weight model.norm.weight"):
        import_checkpoint(ckpt, tmp_path / "run")


def test_extra_weight_is_named(tmp_path):
    ckpt = _edited(tmp_path, lambda sd: sd.__setitem__("model.extra_head.weight", torch.zeros(2, 2)))
    with pytest.raises(CheckpointError, match="unexpected weight model.extra_head.weight"):
        import_checkpoint(ckpt, tmp_path / "run")


def test_untied_mlp_across_recursions_is_refused(tmp_path):
    key = "model.layers.3.block.0.mlp.up_proj.weight"
    ckpt = _edited(tmp_path, lambda sd: sd.__setitem__(key, sd[key].clone() + 1))
    with pytest.raises(CheckpointError, match=key.replace(".", r"\.")):
        import_checkpoint(ckpt, tmp_path / "run")


def test_config_must_agree_with_the_weights(tmp_path):
    ckpt = _edited(tmp_path, lambda sd: None)
    cfg = yaml.safe_load((ckpt / "authors_config.yaml").read_text())
    cfg["recursive"]["num_recursion"] = 2
    (ckpt / "authors_config.yaml").write_text(yaml.safe_dump(cfg))
    with pytest.raises(CheckpointError, match="num_recursion"):
        import_checkpoint(ckpt, tmp_path / "run")


def test_cli_imports_and_refuses_a_full_folder(tmp_path, capsys):
    from mor.cli import main

    src = FIXTURES / "token_mc3_kv"
    assert main(["import-authors", str(src), str(tmp_path / "run"), "--commit", "abc1234"]) == 0
    meta = json.loads((tmp_path / "run" / "config.json").read_text())
    assert meta["provenance"]["authors_commit"] == "abc1234"
    assert set(meta["provenance"]["files_sha256"]) >= {"config.json", "pytorch_model.bin", "authors_config.yaml"}
    assert main(["import-authors", str(src), str(tmp_path / "run")]) == 2
    assert "not empty" in capsys.readouterr().err


@pytest.mark.parametrize("edit, match", [
    (lambda c: c["mor"].__setitem__("type", "expert"), "mor.type"),
    (lambda c: c["kv_sharing"].__setitem__("enable", False), "kv_sharing.enable"),
    (lambda c: c.__setitem__("relaxation", {"enable": True}), "relaxation"),
])
def test_their_config_is_checked_against_the_checkpoint(edit, match, tmp_path):
    ckpt = tmp_path / "ckpt"
    shutil.copytree(FIXTURES / "token_mc3_kv", ckpt)
    cfg = yaml.safe_load((ckpt / "authors_config.yaml").read_text())
    edit(cfg)
    (ckpt / "authors_config.yaml").write_text(yaml.safe_dump(cfg))
    with pytest.raises(CheckpointError, match=match):
        import_checkpoint(ckpt, tmp_path / "run")
