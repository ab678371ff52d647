"""A table is drawn only from exactly the runs its grid lists, whatever Snakemake's metadata
says (issue 57, items 1 and 5): a results folder copied without `.snakemake`, an axis value
added, and the dry run lists the new run's train / lmeval / eval jobs (also under
`--rerun-triggers mtime`); a stale merge is refused, never drawn; one mode's results are never
merged or drawn over by the other mode.

Nothing is trained here: the outputs a first run would leave are written as placeholder files
(what a dry run lists), with fixed modification times, so the DAG sees what a copied results
folder looks like. Only the dry runs' plans and errors are checked."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers.workflow import TINY_LOCAL_MODE, job_counts, snakemake

T0 = 1_700_000_000  # every output written by "the other clone" (a fixed time, not the clock)

GRID = """
name: rl
artifacts: [tables/table10]
defaults:
  data: {source: django-docs, tokenizer: bpe-4096}
  eval: {lm_eval_tasks: [mor_piqa], lm_eval_limit: 8}
runs:
  - label: Vanilla
    tags: [ci]
    set: {model.variant: vanilla}
    axes: {model.scale: [135M]}
  - label: "{model_tying}"
    set: {model.variant: recursive, model.num_recursions: 2}
    axes: {model.scale: [135M], model.tying: [middle_cycle]}
""" + TINY_LOCAL_MODE + """  cluster:
    scale_map: {135M: tiny}
    set:
      train: {tokens: 8192, seq_len: 64, global_batch: 8, micro_batch: 8, checkpoint_every: 8}
      eval: {nll_tokens: 2048, batch: 8}
"""
ADDED = GRID.replace("model.tying: [middle_cycle]", "model.tying: [middle_cycle, cycle]")


def dry_run(workdir: Path, *args: str, config: tuple[str, ...] = (), check: bool = True):
    out = snakemake(*args, "-n", "--directory", str(workdir), "--config", f"grids_dir={workdir / 'grids'}",
                    f"data_root={workdir / 'data'}", *config, check=check)
    return out.returncode, out.stdout + out.stderr


def plan(workdir: Path, *args: str, config: tuple[str, ...] = ()) -> dict[str, int]:
    text = dry_run(workdir, *args, config=config)[1]
    return {} if "Nothing to be done" in text else job_counts(text)


def run_ids(workdir: Path, grid: str = "rl", mode: str = "local") -> list[str]:
    from mor.grids import load_grid

    return [r.run_id for r in load_grid(workdir / "grids" / f"{grid}.yaml", mode).runs]


def first_run(workdir: Path, mode: str = "local") -> None:
    """What a finished `tables/table10` leaves, as placeholders: every output its dry run lists,
    and the merged results as a parquet holding the grid's run ids in ``mode``."""
    text = dry_run(workdir, "tables/table10", config=(f"mode={mode}",))[1]
    outputs = [f.strip() for line in re.findall(r"^\s+output: (.+)$", text, re.M) for f in line.split(",")]
    assert any(o.startswith("runs/") for o in outputs), text[-2000:]
    for o in outputs:
        p = workdir / o
        if o.startswith(("tables/", "figures/")):
            p.mkdir(parents=True, exist_ok=True)
        else:
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text("placeholder")
    ids = run_ids(workdir, mode=mode)
    pq.write_table(pa.table({"run_id": ids, "mode": [mode] * len(ids)}), workdir / "results" / "rl.parquet")
    for o in outputs:
        os.utime(workdir / o, (T0, T0))
    os.utime(workdir / "grids" / "rl.yaml", (T0 - 100, T0 - 100))


def clone_with_results(tmp_path: Path) -> Path:
    """A second clone holding the first one's grids, data, runs and results, but no .snakemake."""
    source = tmp_path / "source"
    (source / "grids").mkdir(parents=True)
    (source / "grids" / "rl.yaml").write_text(GRID)
    first_run(source)
    assert plan(source, "tables/table10") == {}  # the first clone is up to date
    clone = tmp_path / "clone"
    shutil.copytree(source, clone, ignore=shutil.ignore_patterns(".snakemake"))  # copy2: mtimes kept
    assert not (clone / ".snakemake").exists()
    return clone


def add_axis_value(clone: Path, when: int) -> str:
    grid = clone / "grids" / "rl.yaml"
    grid.write_text(ADDED)
    os.utime(grid, (when, when))
    (new,) = set(run_ids(clone)) - set(run_ids(clone / ".." / "source"))
    return new


@pytest.mark.parametrize("triggers", [(), ("--rerun-triggers", "mtime")], ids=["profile", "mtime"])
def test_an_added_axis_value_is_trained_in_a_copied_results_folder(tmp_path, triggers):
    clone = clone_with_results(tmp_path)
    new = add_axis_value(clone, T0 + 100)  # the researcher edits the grid after copying
    code, text = dry_run(clone, "tables/table10", *triggers)
    assert job_counts(text) == {"train": 1, "lmeval": 1, "eval": 1, "row": 1, "collect": 1, "curves": 1, "table": 1}
    for rule in ("train", "lmeval", "eval", "row"):
        assert re.search(rf"rule {rule}:\n(?:    .*\n)*?    wildcards: (?:grid=rl, )?run_id={new}(?:, eval_hash=[0-9a-f]{{12}})?\n",
                         text), (rule, text[-3000:])


def test_a_table_newer_than_its_edited_grid_is_refused_until_rebuilt(tmp_path):
    clone = clone_with_results(tmp_path)
    new = add_axis_value(clone, T0 - 50)  # results copied after the edit: the drawn table looks newest
    code, text = dry_run(clone, "tables/table10", check=False)
    assert code != 0
    line = [ln for ln in text.splitlines() if ln.startswith("error:")]
    assert len(line) == 1 and "tables/table10" in line[0] and f"missing 1: {new}" in line[0], text[-2000:]
    assert "--forcerun collect" in line[0]
    # the command it names plans the new run and the rebuild
    assert plan(clone, "tables/table10", "--forcerun", "collect") == {
        "train": 1, "lmeval": 1, "eval": 1, "row": 1, "collect": 1, "curves": 1, "table": 1}


def test_a_tags_change_without_metadata_is_refused_naming_the_extra_run(tmp_path):
    clone = clone_with_results(tmp_path)
    (extra,) = [r for r in run_ids(clone) if "recursive" in r]  # the block without the ci tag
    code, text = dry_run(clone, "tables/table10", config=("tags=[ci]",), check=False)
    assert code != 0
    line = [ln for ln in text.splitlines() if ln.startswith("error:")]
    assert len(line) == 1 and f"extra 1: {extra}" in line[0] and "tags ['ci']" in line[0], text[-2000:]
    assert plan(clone, "tables/table10", "--forcerun", "collect", config=("tags=[ci]",)) == {
        "collect": 1, "curves": 1, "table": 1}


def test_the_drawing_step_refuses_a_merge_that_is_not_the_grids_runs(tmp_path, capsys):
    from mor.cli import main

    (tmp_path / "grids").mkdir()
    grid = tmp_path / "grids" / "rl.yaml"
    grid.write_text(ADDED)
    ids = run_ids(tmp_path)
    merged = tmp_path / "rl.parquet"
    old = [i for i in ids if "-cycle-" not in i] + ["135M-vanilla-00000000"]
    pq.write_table(pa.table({"run_id": old, "mode": ["local"] * len(old)}), merged)
    assert main(["report", "--artifact", "tables/table10", "--results", str(merged), "--grid", str(grid)]) == 2
    err = capsys.readouterr().err.strip()
    (missing,) = set(ids) - set(old)
    assert err.count("\n") == 0 and f"missing 1: {missing}" in err and "extra 1: 135M-vanilla-00000000" in err, err
    assert not (tmp_path / "tables").exists()
    full = [i for i in ids if "-cycle-" not in i]  # the merge before the axis value was added
    pq.write_table(pa.table({"run_id": full, "mode": ["local"] * len(full)}), merged)
    assert main(["report", "--artifact", "tables/table10", "--results", str(merged), "--grid", str(grid),
                 "--tags", "ci"]) == 2
    err = capsys.readouterr().err
    assert "(mode local, tags ['ci'])" in err and "extra 1: 135M-recursive-middlecycle" in err and "missing 1" not in err


def test_one_modes_results_are_never_drawn_over_by_the_other(tmp_path):
    (tmp_path / "grids").mkdir()
    (tmp_path / "grids" / "rl.yaml").write_text(GRID)
    first_run(tmp_path)  # a local run's results
    assert plan(tmp_path, "tables/table10") == {}
    for target in ("tables/table10", "results/rl.parquet"):
        code, text = dry_run(tmp_path, target, config=("mode=cluster",), check=False)
        assert code != 0
        line = [ln for ln in text.splitlines() if ln.startswith("error:")]
        assert len(line) == 1, text[-2000:]
        assert "results/rl.parquet: holds mode local's results" in line[0] and "mode cluster" in line[0]
        assert "tables/table10" in line[0] and "--profile slurm" in line[0]
        assert "set of input files has changed" not in text
    assert (tmp_path / "tables" / "table10").is_dir() and (tmp_path / "results" / "rl.parquet").exists()
