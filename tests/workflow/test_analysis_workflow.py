"""The analysis figures end to end through Snakemake on a tiny grid: train, eval, the
analysis jobs (depth_cap, kv) beside the parquet, and Figs. 1, 5b, 5c, 7, 8 and Table 17
(35 s on an idle 2-core machine, so not marked slow)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from helpers.figures import png_size
from helpers.workflow import TINY_LOCAL_MODE, job_counts, plan, snakemake

ARTIFACTS = ("figures/fig1", "figures/fig5b", "figures/fig5c", "figures/fig7", "figures/fig8", "tables/table17")
GRID = """
name: ana
artifacts: [figures/fig1, figures/fig5b, figures/fig5c, tables/table17, figures/fig7, figures/fig8]
defaults:
  data: {source: django-docs, tokenizer: bpe-4096}
runs:
  - name: mor
    set: {model.variant: mor, model.tying: middle_cycle, model.num_recursions: 2,
          model.router: {type: expert_choice, aux: aux_loss}}
    axes: {model.scale: [135M]}
  - name: recursive
    set: {model.variant: recursive, model.tying: cycle, model.num_recursions: 2}
    axes: {model.scale: [135M]}
""" + TINY_LOCAL_MODE


def test_analysis_figures_build_from_a_tiny_grid(tmp_path, data_root):
    from mor.analysis.sidecar import read_sidecar

    grids = tmp_path / "grids"
    grids.mkdir()
    grid = grids / "ana.yaml"
    grid.write_text(GRID)
    cfg = ("--directory", str(tmp_path), "--config", f"grids_dir={grids}", f"data_root={data_root}")
    # one depth_cap per Recursive / MoR run, one kv for the Recursive run only
    assert plan(tmp_path, grids, data_root, *ARTIFACTS) == {
        "train": 2, "eval": 2, "row": 2, "analysis": 3, "collect": 1, "curves": 1, "figure": 5, "table": 1}
    snakemake(*ARTIFACTS, *cfg)
    rows = {r["variant"]: r for r in pq.read_table(tmp_path / "results" / "ana.parquet").to_pylist()}
    runs = tmp_path / "results" / "runs"  # a run's analysis files in its one home (mor.layout.sidecar_file)
    for variant, r in rows.items():
        meta, a = read_sidecar(runs / f"{r['run_id']}.depth_cap.npz", r["run_id"], r["config_hash"])
        assert a["max_depth"].tolist() == [1, 2]
        assert a["val_nll"][-1] == pytest.approx(r["val_nll"], abs=1e-5)  # full depth = the eval job's NLL
        assert a["val_nll_causal"][-1] == pytest.approx(r["val_nll_causal"], abs=1e-5)
    meta, kv = read_sidecar(runs / f"{rows['recursive']['run_id']}.kv.npz")
    assert kv["key_cosine"].shape == (4, 4) and np.allclose(np.diag(kv["key_cosine"]), 1.0, atol=1e-5)
    assert kv["key_magnitude"].shape == (4, 64) and meta["windows"] == 8
    assert not (runs / f"{rows['mor']['run_id']}.kv.npz").exists()
    for art in ARTIFACTS:  # each figure beside the numbers it draws (its CSV twin)
        name = art.split("/")[1]
        out = tmp_path / art
        if art.startswith("tables"):
            assert (out / f"{name}.md").exists()
        else:
            assert min(png_size(out / f"{name}.png")) > 100 and len(pd.read_csv(out / f"{name}.csv")) > 0
    # the numbers drawn are the analysis files' and the parquet's: fig5c's capped NLLs per run,
    # fig7's magnitudes of the Recursive run, fig5b's bars of the MoR run's stored histograms
    f5c = pd.read_csv(tmp_path / "figures" / "fig5c" / "fig5c.csv")
    for variant, r in rows.items():
        meta, a = read_sidecar(runs / f"{r['run_id']}.depth_cap.npz", r["run_id"], r["config_hash"])
        mine = f5c[f5c["run_id"] == r["run_id"]]
        assert mine["val_nll"].tolist() == pytest.approx(a["val_nll"].tolist())
        assert mine["val_nll_causal"].tolist() == pytest.approx(a["val_nll_causal"].tolist())
    f7 = pd.read_csv(tmp_path / "figures" / "fig7" / "fig7.csv")
    drawn = f7[f7["state"] == "key"].filter(like="pos").to_numpy()
    assert drawn == pytest.approx(kv["key_magnitude"][:, :drawn.shape[1]])
    f5b = pd.read_csv(tmp_path / "figures" / "fig5b" / "fig5b.csv")
    assert set(f5b["run_id"]) == {rows["mor"]["run_id"]}
    from mor.analysis.router_hist import histogram_bars, per_recursion

    stored = per_recursion(rows["mor"]["router_output_hist"])
    assert sorted(set(f5b["recursion"])) == list(range(1, len(stored) + 1)) == [1, 2]
    for r, h in enumerate(stored, start=1):
        bars, sub = histogram_bars(h), f5b[f5b["recursion"] == r]
        assert sub["selected"].tolist() == pytest.approx(list(bars["selected"]))
        assert sub["unselected"].tolist() == pytest.approx(list(bars["unselected"]))
    assert rows["mor"]["run_id"] in (tmp_path / "tables" / "table17" / "table17.md").read_text()

    # reports only, from parquet and the analysis files: no train, eval or analysis job
    for d in ("tables", "figures"):
        for p in (tmp_path / d).iterdir():
            import shutil

            shutil.rmtree(p)
    rebuilt = snakemake(*ARTIFACTS, *cfg)
    assert job_counts(rebuilt.stdout + rebuilt.stderr) == {"curves": 1, "figure": 5, "table": 1}
    # an eval.* edit re-runs the evals and the analyses (their settings), never training
    grid.write_text(GRID.replace("nll_tokens: 2048", "nll_tokens: 1024"))
    assert plan(tmp_path, grids, data_root, *ARTIFACTS) == {
        "eval": 2, "row": 2, "analysis": 2, "collect": 1, "curves": 1, "figure": 5, "table": 1}


def test_dry_run_of_the_paper_grids_lists_one_analysis_per_run_that_needs_one(tmp_path):
    from helpers.paths import REPO

    out = snakemake(*ARTIFACTS, "-n", "--nolock", "--directory", str(tmp_path),
                    "--config", f"grids_dir={REPO / 'grids'}", f"data_root={tmp_path / 'data'}")
    # grids/fig5c.yaml: 3 MoR runs x 3 seeds (depth_cap each); grids/fig7.yaml: 1 Recursive run (kv)
    import yaml

    seeds = yaml.safe_load((REPO / "grids" / "fig5c.yaml").read_text())["modes"]["local"]["seeds"]
    runs = 3 * seeds + 1
    assert job_counts(out.stdout + out.stderr) == {
        "corpus": 1, "tokenizer": 1, "tokens": 2, "lm_eval_tasks": 1, "train": runs, "lmeval": runs, "eval": runs,
        "row": runs, "analysis": runs, "collect": 2, "curves": 2, "figure": 5, "table": 1}
