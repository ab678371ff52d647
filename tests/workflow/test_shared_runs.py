"""One run id, one home (issue 58): two grids that list the same run schedule one train job for
it, train it once into runs/<run_id>/, and score it once per distinct eval settings
(runs/<run_id>/eval/<eval_hash>.parquet); each grid's results read it from there (a result row
per grid: its grid, its label); a grid added later finds the run done and scored, and only
copies its row, unless it scores the run with other eval settings (one more eval job)."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
from helpers.workflow import E2E_GRID, plan, snakemake

from mor import layout
from mor.grids import load_grid

GA = E2E_GRID.replace("name: e2e", "name: ga").replace("artifacts: [tables/table10, figures/fig6]", "artifacts: []")
# the same Vanilla run (same model, train and data fields: the same id) under another label
GB = (GA.replace("name: ga", "name: gb").replace("label: Vanilla", "label: Baseline")
      .split("  - label: \"{model_tying}\"")[0] + GA.split("    axes: {model.scale: [135M], model.tying: [middle_cycle]}\n")[1])
GC = GB.replace("name: gb", "name: gc")
# the same run scored on fewer validation tokens: other eval settings (another eval hash), same id
GD = GB.replace("name: gb", "name: gd").replace("eval: {nll_tokens: 2048, batch: 8}", "eval: {nll_tokens: 1024, batch: 8}")


def test_two_grids_sharing_a_run_train_it_once_and_a_later_grid_trains_nothing(tmp_path, data_root):
    grids = tmp_path / "grids"
    grids.mkdir()
    (grids / "ga.yaml").write_text(GA)
    (grids / "gb.yaml").write_text(GB)
    a, b = load_grid(grids / "ga.yaml", "local"), load_grid(grids / "gb.yaml", "local")
    shared = {r.run_id for r in a.runs} & {r.run_id for r in b.runs}
    assert len(a.runs) == 2 and len(b.runs) == 1 and len(shared) == 1  # the grids as written share one run
    (rid,) = shared
    targets = ("results/ga.parquet", "results/gb.parquet")

    counts = plan(tmp_path, grids, data_root, *targets)
    # 2 distinct runs scored alike by both grids: 2 trainings, 2 evals; 3 rows (one per listing)
    assert counts["train"] == 2 and counts["eval"] == 2 and counts["row"] == 3 and counts["collect"] == 2

    snakemake(*targets, "--directory", str(tmp_path), "--config", f"grids_dir={grids}", f"data_root={data_root}")
    summaries = sorted((tmp_path / layout.RUNS).rglob(layout.SUMMARY_FILE))
    assert [p.parent for p in summaries] == sorted(layout.RunPaths.own(r.run_id, tmp_path).dir for r in a.runs)
    home = layout.RunPaths.own(rid, tmp_path)
    assert json.loads(home.config.read_text())["run_id"] == rid  # self-describing: its config and commit
    assert json.loads(home.config.read_text())["git_commit"]
    rows = {g: {r["run_id"]: r for r in pq.read_table(tmp_path / "results" / f"{g}.parquet").to_pylist()}
            for g in ("ga", "gb")}
    ra, rb = rows["ga"][rid], rows["gb"][rid]
    assert (ra["grid"], ra["label"]) == ("ga", "Vanilla") and (rb["grid"], rb["label"]) == ("gb", "Baseline")
    trained = ("train_tokens", "train_steps", "train_time_s", "final_train_loss", "config_hash", "val_nll")
    assert {k: ra[k] for k in trained} == {k: rb[k] for k in trained}  # one training, scored alike
    assert ra["created_at"] == rb["created_at"]  # one measurement, copied into both rows
    assert [p.name for p in (home.dir / layout.EVAL_DIR).iterdir()] == [f"{a.run(rid).config.eval_hash}.parquet"]
    assert rb["config_json"] != ra["config_json"] and json.loads(rb["config_json"])["label"] == "Baseline"

    # a grid added later lists the same run: its row and merge, no training
    before = home.summary.stat().st_mtime_ns
    (grids / "gc.yaml").write_text(GC)
    assert plan(tmp_path, grids, data_root, "results/gc.parquet") == {"row": 1, "collect": 1}  # no eval
    snakemake("results/gc.parquet", "--directory", str(tmp_path), "--config", f"grids_dir={grids}",
              f"data_root={data_root}")
    assert home.summary.stat().st_mtime_ns == before
    (rc,) = pq.read_table(tmp_path / "results" / "gc.parquet").to_pylist()
    assert rc["grid"] == "gc" and rc["final_train_loss"] == ra["final_train_loss"]


def test_a_grid_scoring_a_shared_run_with_other_eval_settings_schedules_its_own_eval(tmp_path, data_root):
    """Same run id, other eval.* settings: two eval jobs (one per eval hash), one training; the
    grids that agree with either share it."""
    grids = tmp_path / "grids"
    grids.mkdir()
    for name, text in (("ga", GA), ("gb", GB), ("gd", GD)):
        (grids / f"{name}.yaml").write_text(text)
    b, d = load_grid(grids / "gb.yaml", "local"), load_grid(grids / "gd.yaml", "local")
    (rb,), (rd,) = b.runs, d.runs
    assert rb.run_id == rd.run_id and rb.config.eval_hash != rd.config.eval_hash  # one run, two eval settings
    counts = plan(tmp_path, grids, data_root, "results/ga.parquet", "results/gb.parquet", "results/gd.parquet")
    # runs: ga's two, the shared one also in gb (same settings) and gd (others): 2 trainings,
    # 3 evals (ga's two, gd's other settings of the shared run), 4 rows
    assert counts["train"] == 2 and counts["eval"] == 3 and counts["row"] == 4 and counts["collect"] == 3
    assert plan(tmp_path, grids, data_root, "results/gb.parquet", "results/gd.parquet")["eval"] == 2
