"""The suite's own layout (docs/testing.md): every test file sits in one of the three group
folders, and what tests share lives in tests/helpers, never in another test file or in
conftest.py. An import of ``tests.test_engine`` once worked only while tests/ was flat at the
repository root, and broke when the files moved into groups."""

import ast

import pytest

from helpers.paths import REPO

TESTS = REPO / "tests"
GROUPS = ("unit", "workflow", "cluster")


def _imported_modules(path):
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module


def _shared_code_imports(path) -> list[str]:
    """The imports of ``path`` that reach a test file or conftest instead of tests/helpers."""
    bad = []
    for name in _imported_modules(path):
        head, last = name.split(".")[0], name.split(".")[-1]
        if head in ("tests", "conftest") or last.startswith("test_"):
            bad.append(name)
    return bad


def test_every_test_file_is_in_a_group_folder():
    stray = [p.relative_to(REPO).as_posix() for p in TESTS.rglob("test_*.py")
             if p.relative_to(TESTS).parts[0] not in GROUPS]
    assert stray == [], f"test files outside tests/{{{','.join(GROUPS)}}}/: {stray}"


def test_no_test_imports_another_test_file_or_conftest():
    offenders = {p.relative_to(REPO).as_posix(): bad for p in TESTS.rglob("*.py")
                 if (bad := _shared_code_imports(p))}
    assert offenders == {}, f"move what these import into tests/helpers: {offenders}"


@pytest.mark.parametrize("source, bad", [
    ("from tests.test_engine import make\n", ["tests.test_engine"]),
    ("def f():\n    from test_slurm_faults import fake\n", ["test_slurm_faults"]),
    ("from conftest import VOCAB\n", ["conftest"]),
    ("import helpers.engine\nfrom helpers.tiny import tiny_run\nfrom mor.engine import Engine\n", []),
])
def test_the_detector_finds_imports_anywhere_in_a_file(tmp_path, source, bad):
    f = tmp_path / "test_x.py"
    f.write_text(source)
    assert _shared_code_imports(f) == bad
