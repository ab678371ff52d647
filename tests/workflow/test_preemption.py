"""Preemption that saves (``mor.train.stop``): a SIGTERM or SIGUSR2 to a training job stops it
at the end of the step in progress with a checkpoint of that step, and the same command then
finishes the run to the weights of an uninterrupted one. Waits on the train log (an event),
never on a clock; the deadlines only bound a hang."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers.paths import REPO
from mor.atomic import sha256_file
from mor.grids import load_grid
from mor.train.checkpoint import load_latest
from mor.train.stop import StopRequest, stop_on_signals

STEPS = 300  # long enough that the signal always lands mid-run (it is sent after the 3rd logged step)


def _grid(path: Path) -> Path:
    path.write_text(f"name: {path.stem}\nruns:\n  - set: {{model.scale: 135M, model.variant: mor, model.num_recursions: 2}}\n"
                    "modes:\n  local:\n    scale_map: {135M: tiny}\n    set:\n"
                    f"      train: {{tokens: {STEPS * 2 * 16}, seq_len: 16, global_batch: 2, micro_batch: 2, "
                    "checkpoint_every: 1000}\n      eval: {nll_tokens: 64, batch: 2}\n")
    return path


def _cmd(grid: Path, run_id: str, run_dir: Path, data_root: Path) -> list[str]:
    return [sys.executable, "-m", "mor.launch", "train", "--grid", str(grid), "--run-id", run_id, "--mode", "local",
            "--run-dir", str(run_dir), "--data-root", str(data_root), "--threads", "1", "--device", "cpu"]


def _logged_steps(run_dir: Path) -> list[int]:
    log = run_dir / "train_log.jsonl"
    if not log.exists():
        return []
    return [json.loads(line)["step"] for line in log.read_text().splitlines() if line.endswith("}")]


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGUSR2])
def test_signal_checkpoints_the_step_in_progress_and_the_rerun_matches_an_uninterrupted_run(
        sig, tmp_path, data_root):
    grid = _grid(tmp_path / "pre.yaml")
    run_id = load_grid(grid, "local").runs[0].run_id
    env = {"PYTHONPATH": str(REPO / "src"), "PATH": "/usr/bin:/bin"}
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(_cmd(grid, run_id, run_dir, data_root), env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300  # bounds a hang only
        while len(_logged_steps(run_dir)) < 3:
            assert proc.poll() is None, proc.communicate()[1][-2000:]
            assert time.monotonic() < deadline, "no training step logged"
            time.sleep(0.05)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 75, err[-2000:]
    stopped = _logged_steps(run_dir)[-1]
    assert 3 <= stopped < STEPS
    assert f"stopped by {signal.Signals(sig).name} after step {stopped}; checkpoint saved" in err
    found = load_latest(run_dir / "checkpoints", load_grid(grid, "local").runs[0].config.config_hash)
    assert found is not None and found[1]["step"] == stopped  # nothing trained is lost: redone steps = 0
    assert not (run_dir / "train_summary.json").exists()

    again = subprocess.run(_cmd(grid, run_id, run_dir, data_root), env=env, capture_output=True, text=True,
                           timeout=600)
    assert again.returncode == 0, again.stderr[-2000:]
    assert json.loads((run_dir / "train_summary.json").read_text())["resumed_from"] == stopped
    assert _logged_steps(run_dir) == list(range(1, STEPS + 1))  # no duplicated or missing log rows

    straight = subprocess.run(_cmd(grid, run_id, tmp_path / "straight", data_root), env=env, capture_output=True,
                              text=True, timeout=600)
    assert straight.returncode == 0, straight.stderr[-2000:]
    assert sha256_file(run_dir / "final" / "model.safetensors") == \
        sha256_file(tmp_path / "straight" / "final" / "model.safetensors")


def test_stop_request_routes_signals_and_restores_the_previous_handlers():
    seen = []
    previous = signal.signal(signal.SIGUSR2, lambda s, f: seen.append(s))
    try:
        stop = StopRequest()
        with stop_on_signals(stop):
            assert not stop.requested()
            signal.raise_signal(signal.SIGUSR2)
            signal.raise_signal(signal.SIGTERM)  # the first signal is the one reported
            assert stop.requested() and stop.signum == signal.SIGUSR2
        assert seen == []  # routed to the stop request while the block ran
        signal.raise_signal(signal.SIGUSR2)
        assert seen == [signal.SIGUSR2]  # and back to the previous handler after it
    finally:
        signal.signal(signal.SIGUSR2, previous)
