"""The run-folder layout has one spelling, ``mor.layout``: no other module or rule file writes
a run file's name or a ``runs/{grid}/{run_id}``-style pattern in its code.

Read with ``ast`` / ``tokenize`` (nothing is imported): every string constant in code counts,
docstrings and comments do not (they may describe the layout; they cannot decide it).
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

from helpers.paths import REPO
from mor import layout

RUN_FILES = {layout.SUMMARY_FILE, layout.LM_EVAL_FILE, layout.THROUGHPUT_FILE, layout.TRAIN_LOG_FILE,
             layout.JOB_RECORD_FILE}
_QUOTES = re.compile(r"^[rbfuRBFU]*(\"\"\"|\x27\x27\x27|\"|\x27)|(\"\"\"|\x27\x27\x27|\"|\x27)$")  # a token's quotes
PATTERN = re.compile(r"(^|/)(runs|logs)/\{|results/runs|/runs/|^runs/")


def _docstring_nodes(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = getattr(node, "body", [])
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                ids.add(id(body[0].value))
    return ids


def python_strings(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), str(path))
    docs = _docstring_nodes(tree)
    return [(n.lineno, n.value) for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs]


RUN_DIRS = {layout.FINAL_DIR, layout.CHECKPOINTS_DIR}
# the same names for another thing, each with its reason
NOT_RUN_FOLDERS = {"src/mor/checkpoints/gguf.py": "data/checkpoints/: the dequantised start-point cache"}


def python_path_joins(path: Path) -> list[tuple[int, str]]:
    """``x / "final"``-style joins of a run folder's parts (the names alone are too common)."""
    tree = ast.parse(path.read_text(), str(path))
    return [(n.lineno, f'/ "{n.right.value}"') for n in ast.walk(tree)
            if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Div) and isinstance(n.right, ast.Constant)
            and n.right.value in RUN_DIRS]


def rule_file_strings(path: Path) -> list[tuple[int, str]]:
    """String tokens of a Snakefile / .smk (Python tokens, comments dropped)."""
    out = []
    for tok in tokenize.generate_tokens(io.StringIO(path.read_text()).readline):
        if tok.type == tokenize.STRING:
            out.append((tok.start[0], tok.string))
        elif tok.type == getattr(tokenize, "FSTRING_MIDDLE", -1):
            out.append((tok.start[0], tok.string))
    return out


def offences(strings: list[tuple[int, str]]) -> list[tuple[int, str]]:
    bad = []
    for line, s in strings:
        body = _QUOTES.sub("", s)
        if "<grid>" in body:  # a help text describing the layout, not a path
            continue
        if body in RUN_FILES or any(body.endswith("/" + f) for f in RUN_FILES) or PATTERN.search(body):
            bad.append((line, s))
    return bad


def test_the_detector_sees_what_it_must():
    """Derived by hand: each of the first four spells the layout, the last three do not."""
    found = offences([(1, '"train_summary.json"'), (2, 'f"runs/{grid}/{run_id}"'),
                      (3, '"results/runs/x.parquet"'), (4, '"logs/{grid}/{run_id}/train.log"'),
                      (5, '"runs"'), (6, '"model.safetensors"'), (7, '"folder of runs/<grid>/<run_id>"')])
    assert [line for line, _ in found] == [1, 2, 3, 4]


def test_no_module_or_rule_file_spells_the_run_layout():
    bad = []
    for path in sorted((REPO / "src" / "mor").rglob("*.py")):
        if path.name == "layout.py" and path.parent.name == "mor":
            continue
        bad += [f"{path.relative_to(REPO)}:{line}: {s}" for line, s in offences(python_strings(path))]
        if str(path.relative_to(REPO)) not in NOT_RUN_FOLDERS:
            bad += [f"{path.relative_to(REPO)}:{line}: {s}" for line, s in python_path_joins(path)]
    for path in [REPO / "Snakefile", *sorted((REPO / "workflows").rglob("*.smk"))]:
        bad += [f"{path.relative_to(REPO)}:{line}: {s}" for line, s in offences(rule_file_strings(path))]
    assert not bad, "spell these through mor.layout:\n" + "\n".join(bad)


def test_run_paths_agree_with_the_patterns():
    """The Snakemake patterns and RunPaths name the same files (formatted independently)."""
    p = layout.RunPaths("table10", "135M-vanilla-abc", root=Path("/r"))
    fill = {"grid": "table10", "run_id": "135M-vanilla-abc", "analysis": "kv"}
    assert p.summary == Path("/r") / layout.SUMMARY_PATTERN.format(**fill)
    assert p.lm_eval == Path("/r") / layout.LM_EVAL_PATTERN.format(**fill)
    assert p.measurement("0123456789ab") == Path("/r") / layout.MEASUREMENT_PATTERN.format(**fill, eval_hash="0123456789ab")
    assert p.throughput == Path("/r") / layout.THROUGHPUT_PATTERN.format(**fill)
    assert p.row == Path("/r") / layout.ROW_PATTERN.format(**fill)
    assert p.sidecar("kv") == Path("/r") / layout.SIDECAR_PATTERN.format(**fill)
    assert str(layout.RunPaths.of("elsewhere/g/id").summary) == "elsewhere/g/id/train_summary.json"
    assert layout.RunPaths.of("elsewhere/g/id").grid is None  # a run folder names no grid: it has one home


def test_a_run_has_one_home_whatever_grid_lists_it():
    """Issue 58: two grids' paths of one run id are one folder, one analysis file, one eval
    measurement per eval settings, one log of each of its own jobs; only the result row (and the
    row step's log) is the grid's."""
    a, b = layout.RunPaths("table10", "135M-x-abc"), layout.RunPaths("table15", "135M-x-abc")
    assert a.dir == b.dir == Path("runs/135M-x-abc") == layout.RunPaths.own("135M-x-abc").dir
    assert a.sidecar("kv") == b.sidecar("kv") == Path("results/runs/135M-x-abc.kv.npz")
    assert a.measurement("0123456789ab") == b.measurement("0123456789ab") == Path("runs/135M-x-abc/eval/0123456789ab.parquet")
    assert a.measurement("0123456789ab") != a.measurement("ba9876543210")  # other eval settings: another eval
    assert a.row != b.row and a.row == Path("results/runs/table10/135M-x-abc.parquet")
    for job in ("train", "eval-0123456789ab", "lmeval", "throughput", "analysis-kv"):
        assert layout.run_log("logs", "table10", "id", job) == layout.run_log("logs", "table15", "id", job)
        assert layout.job_folder("s", "table10", "id", job) == layout.job_folder("s", "table15", "id", job)
    assert layout.run_log("logs", "table10", "id", "row") != layout.run_log("logs", "table15", "id", "row")
    assert layout.job_folder("s", "table10", "id", "eval-0123456789ab") == Path("s/runs/id/eval-0123456789ab")
    assert layout.run_log_pattern("train").format(grid="g", run_id="i") == "logs/runs/i/train.log"
    assert layout.run_log_pattern("eval-{eval_hash}").format(grid="g", run_id="i", eval_hash="h") == "logs/runs/i/eval-h.log"
    assert layout.run_log_pattern("row").format(grid="g", run_id="i") == "logs/g/i/row.log"
    with pytest.raises(ValueError):
        layout.RunPaths.own("id").row
