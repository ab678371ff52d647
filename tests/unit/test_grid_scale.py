"""Planning cost that does not grow with the runs (issue 29): every YAML file is parsed once
per process, however many runs ask for it, and a run lookup is a dict access.

The reads are counted at the one parser call (``mor.yaml_io._parse``) while a grid of 10 and
one of 1,000 runs go through everything the workflow and the launcher do per run: expand
both modes, plan the cluster jobs with the presets, collect ``mor status`` of every run,
look every run up by id, and call every job kind's settings hook (the rules' params)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

import mor.grids.load as grids_load  # where Grid expands more seeds (mor.grids re-exports it)
import mor.yaml_io as yaml_io
from helpers.paths import REPO
from mor.config import ConfigError, load_scales
from mor.grids import GridError, load_grid
from mor.jobs import KINDS
from mor.launch.cost import run_jobs

sys.path.insert(0, str(REPO / "benchmarks"))
from bench_dag import generated_grid  # noqa: E402


@pytest.fixture
def parses(monkeypatch):
    """The paths the YAML parser is called on, from a cold cache."""
    yaml_io.clear_cache()
    seen: list[str] = []
    real = yaml_io._parse

    def counting(path, text):
        seen.append(str(Path(path).resolve()))
        return real(path, text)

    monkeypatch.setattr(yaml_io, "_parse", counting)
    yield seen
    yaml_io.clear_cache()


def _every_per_run_step(path: Path) -> int:
    """What Snakemake's parse and input functions, ``mor.launch plan`` and ``mor status`` do,
    for every run."""
    from mor.launch.cost import plan_grid
    from mor.launch.presets import load_presets
    from mor.status import Paths, collect

    root = path.parent

    n = 0
    for mode in ("local", "cluster"):
        grid = load_grid(path, mode)
        n = len(grid.runs)
        if mode == "cluster":
            assert len(plan_grid(grid, load_presets())) >= 3 * n  # train, eval, lmeval per run
            statuses = collect([grid], Paths(runs=root / "runs", results=root / "results", logs=root / "logs",
                                             slurm_logs=root / "logs" / "slurm"))
            assert [r.state for r in statuses[0].runs] == ["not started"] * n  # `mor status`, every run
        for r in grid.runs:
            assert grid.run(r.run_id) is r
            for kind, analysis in run_jobs(grid, r.config) + [("throughput", "")]:
                KINDS[kind].settings_of(r.config, mode, {"analysis": analysis})
    return n


@pytest.mark.parametrize("runs, seeds, settings", [(10, 1, 2), (1000, 5, 4)])
def test_yaml_files_are_parsed_once_whatever_the_runs(tmp_path, parses, runs, seeds, settings):
    path = tmp_path / f"gen{runs}.yaml"
    path.write_text(generated_grid(path.stem, runs, seeds=seeds, settings=settings))
    assert _every_per_run_step(path) == runs
    # each file once: the grid, its schema, both mode bases, the scales, the presets, the site,
    # the throughput protocol, the lm-eval task sizes; the same list for 10 and 1,000 runs
    assert len(parses) == len(set(parses)), sorted(parses)
    expected = {str(path.resolve())} | {str(REPO / f) for f in (
        "workflows/schemas/grid.schema.yaml", "grids/modes/cpu-local.yaml", "grids/modes/paper-10B.yaml",
        "grids/scales.yaml", "slurm/presets.yaml", "workflows/config/throughput.yaml", "slurm/lm_eval_tasks.yaml")}
    assert expected <= set(parses)
    assert len(parses) <= len(expected) + 1  # + the presets' site profile


def test_a_changed_file_is_parsed_again_and_callers_get_their_own_copy(tmp_path, parses):
    f = tmp_path / "x.yaml"
    f.write_text("a: {b: 1}\n")
    first = yaml_io.load_yaml(f)
    first["a"]["b"] = 99  # the caller's copy: the next caller still gets the file's value
    assert yaml_io.load_yaml(f) == {"a": {"b": 1}}
    assert len(parses) == 1
    f.write_text("a: {b: 22}\n")  # another size: a new parse, whatever the clock's resolution
    assert yaml_io.load_yaml(f) == {"a": {"b": 22}}
    assert len(parses) == 2


def test_a_syntax_error_names_the_file_and_the_line(tmp_path):
    lines = (REPO / "grids" / "scales.yaml").read_text().splitlines()
    lines[26] = "  broken: {hidden: 32, layers: 4]"  # line 27 of a copy of the scales: an unclosed mapping
    bad = tmp_path / "scales.yaml"
    bad.write_text("\n".join(lines) + "\n")
    with pytest.raises(ConfigError, match=rf"^{bad}, line 27: not valid YAML: "):
        load_scales(bad)
    # a file of this checkout is named from the repository root
    assert yaml_io.where(REPO / "grids" / "scales.yaml", 27) == "grids/scales.yaml, line 27"


def test_a_bad_value_names_its_line(tmp_path):
    """Errors found after parsing (the grid schema, a scale's values) name the line too."""
    text = (REPO / "grids" / "scales.yaml").read_text()
    name = next(iter(load_scales()))
    bad = tmp_path / "scales.yaml"
    start = text.index(f"\n  {name}:")
    bad.write_text(text[:start] + re.sub(r" heads: *\d+", " heads: 0", text[start:], count=1))
    line = text[: start + 1].count("\n") + 1
    with pytest.raises(ConfigError, match=rf"{bad}, line {line}: .*heads"):
        load_scales(bad)

    grid = tmp_path / "g.yaml"
    grid.write_text(generated_grid("g", 2, seeds=1, settings=2).replace("artifacts: []", "artifacts: []\nbogus: 1"))
    want = grid.read_text().splitlines().index("bogus: 1") + 1
    with pytest.raises(GridError, match=rf"bogus.*\({grid}, line {want}\)"):
        load_grid(grid, "local")


def test_further_seeds_are_expanded_once_per_seed_count(tmp_path, monkeypatch):
    """The claims rounds ask for seeds the grid file does not list: each lookup is a dict
    access once the grid with that many seeds has been expanded, not a new expansion."""
    path = tmp_path / "g.yaml"
    path.write_text(generated_grid("g", 4, seeds=1, settings=2))
    grid = load_grid(path, "local")
    wider = load_grid(path, "local", seeds={b: 4 for b in grid.blocks})
    extra = [r.run_id for r in wider.runs if r.config.train.seed == 3]
    assert len(extra) == 4 and all("-s3-" in i for i in extra)
    calls = []
    real = grids_load.load_grid
    monkeypatch.setattr(grids_load, "load_grid", lambda *a, **k: calls.append(k) or real(*a, **k))
    for _ in range(3):
        for rid in extra:
            assert grid.run(rid).config.train.seed == 3
    assert len(calls) == 1
    with pytest.raises(GridError, match="no run with id"):
        grid.run(extra[0][:-8] + "00000000")
