"""The table of job kinds (``mor.jobs``): every entry resolves, both launchers and the CLI run
a kind through it, and the Snakemake rules write what it says."""

from __future__ import annotations

import io
import json
import re
from contextlib import redirect_stdout

import pytest

from helpers.paths import REPO
from helpers.tiny import tiny_grid_file
from mor.jobs import KINDS, RUN_KINDS, kind, resolve


def test_every_kind_names_functions_that_exist():
    for spec in KINDS.values():
        for ref in filter(None, (spec.function, spec.summary, spec.settings)):
            assert callable(resolve(ref)), f"{spec.name}: {ref}"
    assert set(RUN_KINDS) == set(KINDS) - {"hub", "data", "import"}  # import: a train job that imports (issue 62)
    with pytest.raises(KeyError, match="unknown job kind 'nope'; known: \\['analysis'"):
        kind("nope")


def test_rules_write_the_outputs_the_table_names():
    """Each per-run rule's ``output:`` is its kind's entry, read from the table (not a copy)."""
    for name, rule_file in (("train", "train"), ("eval", "eval"), ("lmeval", "lm_eval"),
                            ("analysis", "analysis"), ("throughput", "throughput")):
        text = (REPO / "workflows" / "rules" / f"{rule_file}.smk").read_text()
        assert f'KINDS["{name}"].outputs[0]' in text, rule_file
        assert re.search(rf"mor\.launch {name}\b|\.launch {name}\b", text), f"{rule_file}.smk does not launch {name}"


def test_the_cli_hands_job_verbs_to_the_launcher():
    """``python -m mor plan`` and ``python -m mor.launch plan`` are one code path: same output."""
    from mor.cli import main as cli_main
    from mor.launch.__main__ import main as launch_main

    args = ["plan", "--grid", str(REPO / "grids" / "table10.yaml"), "--mode", "cluster"]
    outs = []
    for main in (cli_main, launch_main):
        buf = io.StringIO()
        with redirect_stdout(buf):
            assert main(args) == 0
        outs.append(buf.getvalue())
    assert outs[0] == outs[1] and "GPU-hours" in outs[0]


def test_slurm_wrapper_and_inline_launcher_run_the_same_train_job(data_root, tmp_path):
    """The pickled wrapper (outside a Slurm job: one rank) and the inline launcher train the
    same run to the same loss: both call ``KINDS['train'].function``."""
    from mor.grids import load_grid
    from mor.launch.__main__ import main as launch_main
    from mor.launch.checkpointable import Job

    grid = tiny_grid_file(tmp_path / "tiny.yaml")
    run_id = load_grid(grid, "local").runs[0].run_id
    common = dict(grid=str(grid), run_id=run_id, mode="local", data_root=str(data_root), device="cpu", threads=1)
    wrapped = Job("train", dict(common, run_dir=str(tmp_path / "a")))()
    assert (wrapped["rank"], wrapped["world_size"]) == (0, 1)
    assert launch_main(["train", "--grid", str(grid), "--run-id", run_id, "--run-dir", str(tmp_path / "b"),
                        "--data-root", str(data_root), "--threads", "1", "--device", "cpu"]) == 0
    inline = json.loads((tmp_path / "b" / "train_summary.json").read_text())
    assert wrapped["final_loss"] == inline["final_loss"] and wrapped["steps"] == inline["steps"] == 4
