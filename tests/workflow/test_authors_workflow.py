"""The authors' checkpoint through our DAG (issue 62): the shipped grid grids/imported/imported.yaml,
pointed at a fixture their code wrote, runs through the local profile as its own grids folder. The
run's train job imports the checkpoint (nothing trained), then lmeval, the throughput engine and eval
(NLL under both protocols) run on it as on any trained run, and the merge holds its row. Marked slow
(about 1 min: the bpe-512 tokenizer and token files are built, then four jobs on a 44 K-parameter model)."""

from __future__ import annotations

import json
import math
import shutil

import pyarrow.parquet as pq
import pytest

from mor.atomic import sha256_file
from mor.grids import load_grid
from mor.layout import RunPaths
from helpers.paths import REPO
from helpers.workflow import job_counts, snakemake

FIXTURE = REPO / "tests" / "fixtures" / "authors_ckpt" / "expert_mc3_tied_v512"
SHIPPED = REPO / "grids" / "imported" / "imported.yaml"


def _setup(tmp_path, data_root, ckpt):
    """A workdir, a grids folder holding the shipped grid pointed at ``ckpt``, and a data root
    holding the embedded corpus (the tokenizer and token files of bpe-512 are the workflow's to build)."""
    grids = tmp_path / "grids"
    grids.mkdir(exist_ok=True)
    (grids / "imported.yaml").write_text(SHIPPED.read_text().replace(
        "tests/fixtures/authors_ckpt/expert_mc3_tied_v512", str(ckpt)))
    data = tmp_path / "data"
    if not data.exists():
        shutil.copytree(data_root / "corpus", data / "corpus")
    return grids, data


def _plan(tmp_path, grids, data):
    out = snakemake("results/imported.parquet", "-n", "--directory", str(tmp_path), "--config", f"grids_dir={grids}",
                    f"data_root={data}")
    text = out.stdout + out.stderr
    return {} if "Nothing to be done" in text else job_counts(text)


@pytest.mark.slow
def test_eval_lmeval_and_the_engine_run_on_an_imported_checkpoint(tmp_path, data_root):
    grids, data = _setup(tmp_path, data_root, FIXTURE)
    planned = _plan(tmp_path, grids, data)
    assert {k: planned.get(k) for k in ("train", "lmeval", "throughput", "eval", "collect")} == \
        {"train": 1, "lmeval": 1, "throughput": 1, "eval": 1, "collect": 1}
    snakemake("results/imported.parquet", "--directory", str(tmp_path), "--config", f"grids_dir={grids}",
              f"data_root={data}")

    (run,) = load_grid(grids / "imported.yaml", "local").runs
    files = RunPaths.of(tmp_path / "runs" / run.run_id)
    assert "no training" in (tmp_path / "logs" / "runs" / run.run_id / "train.log").read_text()
    assert not files.dir.joinpath("checkpoints").exists()  # imported, never trained
    meta = json.loads(files.config.read_text())
    prov = meta["provenance"]
    assert prov["authors_commit"] == "aef56f7" and prov["import_sha256"] == run.config.model.import_sha256
    assert prov["files_sha256"]["pytorch_model.bin"] == sha256_file(FIXTURE / "pytorch_model.bin")
    assert meta["config"]["model"]["import_checkpoint"] == str(FIXTURE)

    (row,) = pq.read_table(tmp_path / "results" / "imported.parquet").to_pylist()
    assert row["run_id"] == run.run_id and row["train_steps"] == 0
    # random weights (std 0.02): both protocols score about the uniform NLL, ln 512
    for key in ("val_nll", "val_nll_causal"):
        assert abs(row[key] - math.log(512)) < 0.05, (key, row[key])
    assert dict(row["accuracy"]).keys() == {"mor_piqa", "mor_arc_easy"}  # lmeval's, copied by eval
    assert row["decode_tokens_per_s_fixed"] > 0 and row["decode_tokens_per_s_max"] > 0  # the engine's
    assert json.loads(files.throughput.read_text())["run_id"] == run.run_id

    assert _plan(tmp_path, grids, data) == {}  # done: nothing re-runs
    copy = tmp_path / "ckpt"  # the path edited (to a copy): another run, imported and scored anew
    shutil.copytree(FIXTURE, copy)
    _setup(tmp_path, data_root, copy)
    again = _plan(tmp_path, grids, data)
    assert {k: again.get(k) for k in ("train", "lmeval", "throughput", "eval")} == \
        {"train": 1, "lmeval": 1, "throughput": 1, "eval": 1}
