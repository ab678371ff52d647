"""The Snakemake DAG, for real: a dry run of table10, and a 2-run grid end to end."""

from __future__ import annotations

import json
import os
import re
import resource
import shutil
import subprocess
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from helpers.paths import REPO
from helpers.workflow import E2E_GRID, SNAKEMAKE, job_counts, plan, reference_nll, snakemake


def expected_jobs(grid_names: list[str], tables: int = 0, figures: int = 0, data: bool = True) -> dict[str, int]:
    """The jobs a dry run from scratch must list for targets drawn from these shipped grids,
    derived from the grids themselves (local mode): one train per distinct run id, an eval per
    distinct (run id, eval settings), a row per grid's run, an lmeval per distinct run with lm-eval tasks, one collect (and one set of training curves) per grid, the data
    jobs (corpus, tokenizer, the train and val token files) and the offline task conversion
    if any run scores a mor_* task."""
    from mor.grids import load_grid
    from mor.lm_eval import is_local_task

    runs = [r for g in grid_names for r in load_grid(REPO / "grids" / f"{g}.yaml", "local").runs]
    lm = {r.run_id for r in runs if r.config.eval.lm_eval_tasks}
    # a run several grids list is trained (and lm-evaluated) once, in its one home, and scored once per
    # distinct eval settings; each grid copies its row
    jobs = {"train": len({r.run_id for r in runs}), "lmeval": len(lm), "eval": len({(r.run_id, r.config.eval_hash) for r in runs}),
            "row": len(runs), "collect": len(grid_names), "table": tables, "figure": figures}
    if tables or figures:
        jobs["curves"] = len(grid_names)  # each grid's training curves come with its artifacts
    if data:  # the corpus, then per tokenizer: a trained BPE, or a real start point's own (its GGUF)
        from mor.checkpoints.gguf import START_POINTS

        tokenizers = {r.config.data.tokenizer for r in runs}
        bpe, start = sum(t not in START_POINTS for t in tokenizers), sum(t in START_POINTS for t in tokenizers)
        jobs.update(corpus=1, tokenizer=bpe, tokens=2 * bpe, start_point_tokenizer=start, start_point_tokens=2 * start)
    if any(is_local_task(t) for r in runs if r.run_id in lm for t in r.config.eval.lm_eval_tasks):
        jobs["lm_eval_tasks"] = 1
    return {k: v for k, v in jobs.items() if v}


def test_dry_run_of_table10_lists_every_job(tmp_path):
    out = snakemake("tables/table10", "figures/fig6", "-n", "--nolock", "--directory", str(tmp_path),
                    "--config", f"grids_dir={REPO / 'grids'}", f"data_root={tmp_path / 'data'}")
    counts = job_counts(out.stdout + out.stderr)
    assert counts == expected_jobs(["table10"], tables=1, figures=1)


def test_bad_grid_stops_the_workflow_before_any_job(tmp_path):
    grids = tmp_path / "grids"
    grids.mkdir()
    (grids / "broken.yaml").write_text(
        "name: broken\nruns:\n  - axes: {model.scale: [135M], model.tying: [zigzag]}\n"
        "modes:\n  local: {scale_map: {135M: tiny}}\n")
    proc = snakemake("all", "-n", "--nolock", "--directory", str(tmp_path), "--config", f"grids_dir={grids}", check=False)
    assert proc.returncode != 0
    text = proc.stdout + proc.stderr
    assert "broken.yaml" in text and "model.tying='zigzag' is not allowed" in text
    assert not (tmp_path / "runs").exists()


GOOD_PRESETS = """
defaults: {partition: debug}
scales:
  tiny: {train: {cpus_per_task: 1, mem_gb: 2, time_min: 10}, eval: {mem_gb: 2, time_min: 10}}
"""


@pytest.mark.parametrize("text, message", [
    ("defaults: {partition: debug\n", r"presets\.yaml, line \d+: not valid YAML"),
    ("", r"presets\.yaml: the preset file is empty"),
    (GOOD_PRESETS.replace("cpus_per_task: 1", "cpu_per_task: 1"),
     r"presets\.yaml: scales\.tiny\.train: unknown key\(s\) \['cpu_per_task'\]"),
    (GOOD_PRESETS.replace("mem_gb: 2, time_min: 10}, eval", "mem_gb: 0, time_min: 10}, eval"),
     r"presets\.yaml: scales\.tiny\.train\.mem_gb: expected a finite number > 0 and <= 100000, got 0"),
    (GOOD_PRESETS.replace("tiny:", "tinyy:"), r"presets\.yaml: scales\.tinyy: unknown scale 'tinyy'"),
])
def test_bad_presets_stop_the_slurm_workflow_before_any_job(tmp_path, text, message):
    presets = tmp_path / "presets.yaml"
    presets.write_text(text)
    proc = snakemake("tables/table10", "-n", "--nolock", "--directory", str(tmp_path), "--config",
                     f"grids_dir={REPO / 'grids'}", f"data_root={tmp_path / 'data'}", "launcher=slurm",
                     f"presets={presets}", check=False)
    assert proc.returncode != 0
    assert re.search(message, proc.stdout + proc.stderr), (proc.stdout + proc.stderr)[-3000:]
    assert not (tmp_path / "runs").exists() and not (tmp_path / "logs").exists()


def test_two_run_grid_end_to_end_through_the_local_profile(tmp_path, data_root):
    grids = tmp_path / "grids"
    grids.mkdir()
    (grids / "e2e.yaml").write_text(E2E_GRID)
    cfg = ["--config", f"grids_dir={grids}", f"data_root={data_root}"]
    before_cpu = _children_cpu_s()
    snakemake("tables/table10", "figures/fig6", "--directory", str(tmp_path), *cfg)
    workflow_cpu = _children_cpu_s() - before_cpu

    table = pq.read_table(tmp_path / "results" / "e2e.parquet").to_pylist()
    assert len(table) == 2
    assert_jobs_recorded_their_cpu(tmp_path, grids / "e2e.yaml", workflow_cpu)
    assert {r["variant"] for r in table} == {"vanilla", "recursive"}
    for r in table:
        assert r["grid"] == "e2e" and r["scale"] == "tiny" and r["paper_scale"] == "135M"
        assert r["git_commit"] and len(r["config_hash"]) == 12 and r["train_steps"] == 16
        # the NLL in parquet is the trained weights' NLL, recomputed here by the model's own
        # training loss on the same windows (an untrained model scores ~ln 4096 = 8.3)
        assert r["val_nll"] == pytest.approx(reference_nll(tmp_path, r, data_root), abs=1e-4)
        assert r["val_nll"] < 8.0
    md = (tmp_path / "tables" / "table10" / "table10.md").read_text()
    assert all(r["run_id"] in md for r in table) and "3.033" in md
    assert_fig6_shows(tmp_path, table)

    again = snakemake("tables/table10", "figures/fig6", "--directory", str(tmp_path), *cfg)
    assert "Nothing to be done" in again.stdout + again.stderr

    summaries = sorted((tmp_path / "runs").rglob("train_summary.json"))
    before = [p.stat().st_mtime_ns for p in summaries]
    for d in ("tables", "figures"):
        subprocess.run(["rm", "-rf", str(tmp_path / d)], check=True)
    rebuilt = snakemake("tables/table10", "figures/fig6", "--directory", str(tmp_path), *cfg)
    counts = job_counts(rebuilt.stdout + rebuilt.stderr)
    assert counts == {"table": 1, "figure": 1, "curves": 1}  # figures/curves/e2e went with figures/
    assert [p.stat().st_mtime_ns for p in summaries] == before
    assert (tmp_path / "tables" / "table10" / "table10.csv").exists()


def _children_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def assert_jobs_recorded_their_cpu(workdir: Path, grid_file: Path, workflow_cpu: float) -> None:
    """Every train and eval job left its CPU time in its run folder (mor.usage), within what the
    whole Snakemake command cost this process's children (measured here, by the kernel), and
    ``mor status`` shows their sum."""
    from mor.grids import load_grid
    from mor.layout import RunPaths
    from mor.status import Paths, collect
    from mor.status.render import cpu_line

    grid = load_grid(grid_file, "local")
    recorded = 0.0
    from mor.usage import job_name

    for run in grid.runs:
        # an eval job's record is its eval settings' (usage/eval-<eval_hash>.json: one per settings)
        for job in ("train", job_name("eval", eval_settings=run.config.eval_hash)):
            r = json.loads(RunPaths(grid.name, run.run_id, root=workdir).usage(job).read_text())
            assert r["finished"] and r["attempts"] == 1 and r["cpu_s"] > 0 and r["wall_s"] > 0, (run.run_id, job, r)
            recorded += r["cpu_s"]
    assert recorded <= workflow_cpu, (recorded, workflow_cpu)
    [gs] = collect([grid], Paths(workdir / "runs", workdir / "results", workdir / "logs", workdir / "logs" / "slurm"),
                   slurm_query=lambda j: None)
    label, text = cpu_line(gs.runs)
    assert label == "cpu" and text.startswith(f"{recorded / 60:.1f} CPU-min measured in {2 * len(grid.runs)} jobs of "
                                              f"{len(grid.runs)} runs (")


def assert_fig6_shows(workdir: Path, rows: list[dict]) -> None:
    """The workflow's fig6.png is the figure of the grid's results: byte for byte the PNG this
    process draws from the workflow's parquet, whose points and line are the runs' NLLs."""
    import matplotlib.pyplot as plt

    from helpers.figures import errorbar_points, stamped_note
    from mor.reports import render

    redraw = workdir / "redraw"
    redraw.mkdir()
    close, figs, cwd = plt.close, [], os.getcwd()
    plt.close = figs.append  # keep the figure open to read it
    os.chdir(redraw)  # renderers write their artifact folder under the working directory
    try:
        render("figures/fig6", str(workdir / "results" / "e2e.parquet"), str(workdir / "grids" / "e2e.yaml"), "local")
    finally:
        os.chdir(cwd)
        plt.close = close
    [fig] = figs
    try:
        [ax] = fig.axes
        recursive = [r["val_nll"] for r in rows if r["variant"] != "vanilla"]
        vanilla = [r["val_nll"] for r in rows if r["variant"] == "vanilla"]
        points = [y for series in errorbar_points(ax).values() for _, y, _ in series]
        assert sorted(points) == pytest.approx(sorted(recursive))
        assert [ln.get_ydata()[0] for ln in ax.get_lines() if ln.get_label() == "Vanilla"] == pytest.approx(vanilla)
        # the grid's reference row: the paper's number in the scheme's own annotation (fig6.annotate_paper)
        assert any(t.get_text() == "paper\nNr=2: 3.033" for t in ax.texts), [t.get_text() for t in ax.texts]
        assert ax.get_ylabel() == "validation NLL (lower is better)" and ax.get_title().startswith("135M (run at tiny")
        assert "seed" in stamped_note(fig) and stamped_note(fig).startswith("Evidence: ")
    finally:
        close(fig)
    png = "figures/fig6/fig6.png"
    assert (workdir / png).read_bytes() == (redraw / png).read_bytes(), "the workflow drew another figure"
    assert (workdir / "figures" / "fig6" / "fig6.pdf").read_bytes()[:4] == b"%PDF"


def test_grid_edits_redo_only_what_they_change(tmp_path, data_root):
    grids = tmp_path / "grids"
    grids.mkdir()
    grid = grids / "e2e.yaml"
    grid.write_text(E2E_GRID)
    targets = ("tables/table10", "figures/fig6")
    snakemake(*targets, "--directory", str(tmp_path), "--config", f"grids_dir={grids}", f"data_root={data_root}")
    summaries = sorted((tmp_path / "runs").rglob("train_summary.json"))
    assert len(summaries) == 2
    before = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in summaries}
    rows = {r["run_id"]: r for r in pq.read_table(tmp_path / "results" / "e2e.parquet").to_pylist()}

    # presentation: labels, description, reference rows -> the report jobs alone
    grid.write_text(E2E_GRID.replace("label: Vanilla", "label: Vanilla (6 layers)")
                    .replace("name: e2e\n", "name: e2e\ndescription: edited\n")
                    .replace("val_nll: 3.0330}", "val_nll: 3.0330}\n  - {paper_scale: 135M, variant: vanilla, val_nll: 2.9}"))
    assert plan(tmp_path, grids, data_root, *targets) == {"table": 1, "figure": 1}

    # eval settings -> every eval of the grid (new measurements) and its rows, never a train job
    grid.write_text(E2E_GRID.replace("nll_tokens: 2048", "nll_tokens: 1024"))
    assert plan(tmp_path, grids, data_root, *targets) == {"eval": 2, "row": 2, "collect": 1, "curves": 1, "table": 1,
                                                          "figure": 1}
    snakemake(*targets, "--directory", str(tmp_path), "--config", f"grids_dir={grids}", f"data_root={data_root}")
    assert {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in summaries} == before
    after = {r["run_id"]: r for r in pq.read_table(tmp_path / "results" / "e2e.parquet").to_pylist()}
    assert after.keys() == rows.keys()
    for rid, r in after.items():
        assert r["val_tokens"] == 1024 != rows[rid]["val_tokens"]
        train_cols = ("train_tokens", "train_steps", "train_flops", "train_time_s", "train_tokens_per_s",
                      "final_train_loss", "n_params", "config_hash")
        assert {k: r[k] for k in train_cols} == {k: rows[rid][k] for k in train_cols}

    # a new axis value -> its train and eval, then the grid's merge and reports
    grid.write_text(E2E_GRID.replace("nll_tokens: 2048", "nll_tokens: 1024")
                    .replace("model.tying: [middle_cycle]", "model.tying: [middle_cycle, cycle]"))
    assert plan(tmp_path, grids, data_root, *targets) == {"train": 1, "eval": 1, "row": 1, "collect": 1, "curves": 1,
                                                          "table": 1, "figure": 1}

    # a finished run re-entered (here forced) keeps its summary and its metrics bit for bit
    grid.write_text(E2E_GRID.replace("nll_tokens: 2048", "nll_tokens: 1024"))
    rid = summaries[0].parent.name
    snakemake(f"results/runs/e2e/{rid}.parquet", "--forcerun", "train", "eval", "--directory", str(tmp_path),
              "--config", f"grids_dir={grids}", f"data_root={data_root}")
    assert summaries[0].read_bytes() == before[summaries[0]][0]
    snakemake(*targets, "--directory", str(tmp_path), "--config", f"grids_dir={grids}", f"data_root={data_root}")
    again = {r["run_id"]: r for r in pq.read_table(tmp_path / "results" / "e2e.parquet").to_pylist()}
    for rid, r in again.items():  # (the write time and the checkout's commit are provenance, not results)
        assert {k: v for k, v in r.items() if k not in ("created_at", "git_commit")} == \
               {k: v for k, v in after[rid].items() if k not in ("created_at", "git_commit")}


    # a rule's shell text edited (quoting, spacing, a flag moved) redoes nothing: the profiles
    # leave Snakemake's `code` trigger off, since what a job computes is named by its run id
    # and params (a job whose output format changes bumps a VERSION param instead)
    edited = tmp_path / "edited"
    shutil.copytree(REPO / "workflows", edited / "workflows")
    shutil.copytree(REPO / "local", edited / "local")
    shutil.copy(REPO / "Snakefile", edited / "Snakefile")
    (edited / "src").symlink_to(REPO / "src")
    for name in ("train.smk", "data.smk"):
        rules = edited / "workflows" / "rules" / name
        text = rules.read_text()
        rules.write_text(text.replace(" > {log:q} 2>&1", "  >{log:q}  2>&1"))
        assert rules.read_text() != text
    from helpers.procs import run_group

    proc = run_group([*SNAKEMAKE, "--snakefile", str(edited / "Snakefile"), "--profile", str(edited / "local"), *targets,
                      "-n", "--directory", str(tmp_path), "--config", f"grids_dir={grids}", f"data_root={data_root}"],
                     cwd=edited, env=dict(os.environ, PYTHONPATH=str(REPO / "src")), timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Nothing to be done" in proc.stdout + proc.stderr, (proc.stdout + proc.stderr)[-3000:]


ACCEPTED_LINTS = {
    # one environment, built once from the lock (locks/README.md); per-rule envs would pin the same set again
    "Specify a conda environment or container for each rule.:",
    # interpreter, data folder and launcher are where a job runs, not what it computes:
    # kept out of params so switching them never re-runs finished jobs
    "Shell command directly uses variable PY from outside of the rule:",
    "Shell command directly uses variable DATA from outside of the rule:",
    "Shell command directly uses variable LAUNCH_ARGS from outside of the rule:",
    "Shell command directly uses variable GRIDS_DIR from outside of the rule:",
}


def test_snakemake_lint_reports_only_accepted_findings():
    proc = snakemake("--lint", "--nolock", check=False)
    findings = set(re.findall(r"^\s+\* (.+)$", proc.stdout + proc.stderr, re.M))
    assert findings, "lint printed nothing: did --lint run?"
    assert findings <= ACCEPTED_LINTS, findings - ACCEPTED_LINTS


@pytest.mark.parametrize("grid", ["table12", "table13", "table14", "table15", "table16"])
def test_dry_run_of_each_ablation_table(tmp_path, grid):
    out = snakemake(f"tables/{grid}", "-n", "--nolock", "--directory", str(tmp_path),
                    "--config", f"grids_dir={REPO / 'grids'}", f"data_root={tmp_path / 'data'}")
    counts = job_counts(out.stdout + out.stderr)
    want = expected_jobs([grid], tables=1)
    assert want["train"] > 0 and {k: counts.get(k, 0) for k in want} == want, (counts, want)


UPTRAIN_GRID = """
name: uptrain
artifacts: [tables/table12]
runs:
  - name: pretrained
    set: {model.variant: vanilla}
    axes: {model.scale: [135M]}
  - name: uptrained
    set: {model.variant: recursive, model.num_recursions: 2, model.tied_init: stepwise,
          model.init_checkpoint: "@pretrained"}
    axes: {model.scale: [135M], model.tying: [middle_cycle]}
modes:
  local:
    scale_map: {135M: tiny}
    set:
      data: {source: django-docs, tokenizer: bpe-4096}
      train: {tokens: 8192, seq_len: 64, global_batch: 8, micro_batch: 8, checkpoint_every: 8}
      eval: {nll_tokens: 2048, batch: 8}
"""


def test_uptraining_starts_from_the_pretrained_run_of_the_same_grid(tmp_path, data_root):
    import json

    grids = tmp_path / "grids"
    grids.mkdir()
    (grids / "uptrain.yaml").write_text(UPTRAIN_GRID)
    snakemake("tables/table12", "--directory", str(tmp_path), "--config", f"grids_dir={grids}", f"data_root={data_root}")
    rows = {r["variant"]: r for r in pq.read_table(tmp_path / "results" / "uptrain.parquet").to_pylist()}
    assert set(rows) == {"vanilla", "recursive"}
    config = json.loads(rows["recursive"]["config_json"])
    assert config["model"]["init_checkpoint"] == f"runs/{rows['vanilla']['run_id']}/final"  # its one home (issue 58)
    # started from the pretrained weights, the up-trained model's first logged loss is far
    # below a random init's (~ln 4096 = 8.3)
    log = tmp_path / "runs" / rows["recursive"]["run_id"] / "train_log.jsonl"
    first = json.loads(log.read_text().splitlines()[0])["loss"]
    pre_log = tmp_path / "runs" / rows["vanilla"]["run_id"] / "train_log.jsonl"
    pre_first = json.loads(pre_log.read_text().splitlines()[0])["loss"]
    assert first < pre_first - 0.5, (first, pre_first)
    assert "uptrain" in (tmp_path / "tables" / "table12" / "table12.md").read_text()


LMEVAL_GRID = E2E_GRID.replace("name: e2e", "name: lme").replace(
    "eval: {nll_tokens: 2048, batch: 8}",
    "eval: {nll_tokens: 2048, batch: 8, lm_eval_tasks: [mor_piqa, mor_winogrande], lm_eval_limit: 8,\n"
    "             lm_eval_limits: {mor_winogrande: 6}, lm_eval_fewshot: 0}")


@pytest.mark.slow
def test_lmeval_jobs_fill_the_accuracy_columns_and_rerun_only_on_their_settings(tmp_path, data_root):
    import json

    grids = tmp_path / "grids"
    grids.mkdir()
    grid = grids / "lme.yaml"
    grid.write_text(LMEVAL_GRID)
    targets = ("tables/table10",)
    cfg = ("--directory", str(tmp_path), "--config", f"grids_dir={grids}", f"data_root={tmp_path / 'data'}")
    (tmp_path / "data").mkdir()
    for sub in ("tokenizer", "tokens"):  # the corpus data as built; the task conversion runs here
        (tmp_path / "data" / sub).symlink_to(data_root / sub)
    assert plan(tmp_path, grids, tmp_path / "data", *targets) == {
        "lm_eval_tasks": 1, "train": 2, "lmeval": 2, "eval": 2, "row": 2, "collect": 1, "curves": 1, "table": 1}
    snakemake(*targets, *cfg)
    rows = pq.read_table(tmp_path / "results" / "lme.parquet").to_pylist()
    for r in rows:
        res = json.loads((tmp_path / "runs" / r["run_id"] / "lm_eval.json").read_text())
        assert {t: m["n"] for t, m in res["tasks"].items()} == {"mor_piqa": 8, "mor_winogrande": 6}
        acc = dict(r["accuracy"])
        assert acc == {t: m["acc"] for t, m in res["tasks"].items()}
        assert dict(r["accuracy_stderr"]) == {t: m["acc_stderr"] for t, m in res["tasks"].items()}
        assert set(dict(r["accuracy_norm"])) == {"mor_piqa"}  # WinoGrande has acc only
        assert r["avg_accuracy"] == pytest.approx(sum(acc.values()) / 2)
        se = [m["acc_stderr"] for m in res["tasks"].values()]
        assert r["avg_accuracy_stderr"] == pytest.approx((se[0] ** 2 + se[1] ** 2) ** 0.5 / 2)
        assert r["val_nll_causal"] == r["val_nll"]  # vanilla / recursive: causal already
        # the authors' top-k protocol: the same forward without a router, so the same numbers, in their own columns
        assert res["tasks_topk"] == res["tasks"] and dict(r["accuracy_topk"]) == acc
        assert r["avg_accuracy_topk"] == r["avg_accuracy"]
    md = (tmp_path / "tables" / "table10" / "table10.md").read_text()
    assert "PIQA (causal)" in md and "WinoGrande (top-k, sees future)" in md and " ± " in md

    # the NLL settings: the evals alone; the lm-eval settings: the lmeval jobs and the evals
    grid.write_text(LMEVAL_GRID.replace("nll_tokens: 2048", "nll_tokens: 1024"))
    assert plan(tmp_path, grids, tmp_path / "data", *targets) == {"eval": 2, "row": 2, "collect": 1, "curves": 1, "table": 1}
    grid.write_text(LMEVAL_GRID.replace("mor_winogrande: 6", "mor_winogrande: 4"))
    assert plan(tmp_path, grids, tmp_path / "data", *targets) == {"lmeval": 2, "eval": 2, "row": 2, "collect": 1,
                                                                  "curves": 1, "table": 1}
    grid.write_text(LMEVAL_GRID)
    assert plan(tmp_path, grids, tmp_path / "data", *targets) == {}
