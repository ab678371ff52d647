"""Errors reach a Snakemake user as one line naming the file (issue 45, item 6): a grid error
at parse time (not ``GridError in file ".../common.smk"`` plus frames), an unknown target or run
in an input function (not an ``InputFunctionException``), a config key the profile cannot use
(refused, not ignored). Dry runs, a few seconds each."""

from __future__ import annotations

import shutil

import pytest
from helpers.paths import REPO
from helpers.workflow import snakemake


def _one_line(proc) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    text = proc.stdout + proc.stderr
    assert "Traceback" not in text and "common.smk" not in text and "InputFunctionException" not in text, text
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 1, proc.stderr
    return errors[0]


@pytest.fixture
def grids(tmp_path):
    """A copy of the shipped grids to break one of."""
    out = tmp_path / "grids"
    shutil.copytree(REPO / "grids", out)
    return out


def test_a_default_the_mode_overrides_stops_the_workflow_as_one_line_naming_both_places(tmp_path, grids):
    text = (grids / "table10.yaml").read_text()
    (grids / "table10.yaml").write_text(text.replace("  model.variant: recursive\n",
                                                     "  model.variant: recursive\n  eval.batch: 4\n"))
    line_no = next(i for i, ln in enumerate((grids / "table10.yaml").read_text().splitlines(), 1) if "eval.batch" in ln)
    proc = snakemake("tables/table10", "-n", "--nolock", "--directory", str(tmp_path), "--config",
                     f"grids_dir={grids}", check=False)
    line = _one_line(proc)
    assert f"table10.yaml, line {line_no}: defaults eval.batch=4 never takes effect in mode 'local'" in line
    assert "modes/cpu-local.yaml" in line and "eval.batch=16" in line


def test_a_negative_default_lr_is_refused_as_a_value(tmp_path, grids):
    text = (grids / "table10.yaml").read_text()
    (grids / "table10.yaml").write_text(text.replace("  model.variant: recursive\n",
                                                     "  model.variant: recursive\n  train.lr: -0.001\n"))
    proc = snakemake("tables/table10", "-n", "--nolock", "--directory", str(tmp_path), "--config",
                     f"grids_dir={grids}", check=False)
    assert "train.lr=-0.001 must be > 0" in _one_line(proc)


@pytest.mark.parametrize("target, config, message", [
    ("tables/table99", [], "error: tables/table99: no grid in {grids} lists it under artifacts; known: ["),
    ("results/runs/table10/135M-recursive-cycle-nr2.parquet", [],
     "no run with id '135M-recursive-cycle-nr2' in mode 'local'; ids starting so: ['135M-recursive-cycle-nr2-"),
    ("results/runs/table77/x.parquet", [], "error: no grid 'table77' in {grids} (a target names it)"),
    ("tables/table10", ["presets=/nonexistent.yaml"],
     "error: --config presets=/nonexistent.yaml: the local launcher runs every job on this machine and reads no "
     "presets file"),
    ("tables/table10", ["fineweb=/nonexistent.yaml"], "no run of mode 'local' reads FineWeb-Edu"),
    ("tables/table10", ["tags=cii"], "error: --config tags: ['cii'] is no tag of any block"),
    ("tables/table10", ["launcer=slurm"], "error: workflow config: unknown key(s) ['launcer']"),
    ("tables/table10", ["mode=locall"], "error: workflow config: key mode: 'locall' is not one of"),
])
def test_targets_and_config_keys_that_cannot_work_are_one_line(tmp_path, target, config, message):
    grids = REPO / "grids"
    proc = snakemake(target, "-n", "--nolock", "--directory", str(tmp_path), "--config", f"grids_dir={grids}",
                     *config, check=False)
    assert message.format(grids=grids) in _one_line(proc)
    assert not (tmp_path / "runs").exists()


def test_common_smk_changes_nothing_when_parsed():
    """Issue 46: the rules' helper file defines helpers; the process set-up (import path, the
    stale-lock check, which must run before Snakemake looks for its locks) is the Snakefile's."""
    import ast

    common = ast.parse((REPO / "workflows" / "rules" / "common.smk").read_text().replace("\nwildcard_constraints:", "\nif 0:"))
    calls = {ast.unparse(n.value.func) for n in common.body if isinstance(n, ast.Expr) and isinstance(n.value, ast.Call)}
    assert not calls & {"sys.path.insert", "clear_stale_locks"}, calls
    snakefile = (REPO / "Snakefile").read_text()
    assert snakefile.index("clear_stale_locks()") < snakefile.index('include: "workflows/rules/common.smk"')
