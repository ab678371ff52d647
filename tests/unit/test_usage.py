"""A local job's CPU record (mor.usage): what the kernel counts, attempts that add up, and the
status line that sums them."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from mor import usage
from mor.status.render import cpu_line
from mor.status.state import RunStatus

# a child that burns at least 0.3 s of its own CPU (by its own clock) and says how much
BURN = ("import time\nt = time.process_time()\nx = 0\n"
        "while time.process_time() - t < 0.3:\n    x += 1\nprint(time.process_time())")


def test_cpu_seconds_count_the_reaped_children():
    """The child's CPU, by the child's own clock, is in the parent's count once it is reaped."""
    before = usage.cpu_seconds()
    child = float(subprocess.run([sys.executable, "-c", BURN], check=True, capture_output=True, text=True).stdout)
    assert usage.cpu_seconds() - before >= child - 0.02


def test_a_resumed_job_adds_its_attempts_and_a_rerun_after_it_finished_starts_again(tmp_path):
    path = tmp_path / "run" / "usage" / "train.json"
    assert usage.record(path, 10.0, 12.0, 2, finished=False) == {
        "cpu_s": 10.0, "wall_s": 12.0, "attempts": 1, "threads": 2, "finished": False}
    r = usage.record(path, 5.5, 6.0, 2, finished=True)  # resumed from its checkpoint and finished
    assert (r["cpu_s"], r["wall_s"], r["attempts"], r["finished"]) == (15.5, 18.0, 2, True)
    assert json.loads(path.read_text()) == r
    r = usage.record(path, 3.0, 4.0, 1, finished=True)  # run again (its result replaced): a new cost
    assert (r["cpu_s"], r["attempts"], r["threads"]) == (3.0, 1, 1)
    assert usage.run_cpu_s(tmp_path / "run") == {"train": 3.0}


@pytest.mark.parametrize("text", ["{", "[]", '{"cpu_s": -1}', '{"wall_s": 3}', ""])
def test_an_unreadable_record_counts_as_none_and_is_replaced(tmp_path, text):
    (tmp_path / "usage").mkdir()
    (tmp_path / "usage" / "eval.json").write_text(text)
    assert usage.read(tmp_path / "usage" / "eval.json") is None
    assert usage.run_cpu_s(tmp_path) == {}
    assert usage.record(tmp_path / "usage" / "eval.json", 2.0, 2.0, 1, True)["cpu_s"] == 2.0


def test_the_status_line_sums_the_jobs_by_kind():
    runs = [RunStatus("g", "a", "", "done", 1, cpu_s={"train": 120.0, "eval": 30.0, "analysis-depth_cap": 6.0}),
            RunStatus("g", "b", "", "done", 1, cpu_s={"train": 60.0, "lmeval": 24.0}),
            RunStatus("g", "c", "", "not started", 1)]
    label, text = cpu_line(runs)
    assert label == "cpu"
    assert text == "4.0 CPU-min measured in 5 jobs of 2 runs (train 3.0, eval 0.5, lmeval 0.4, analysis 0.1)"
    assert cpu_line(runs[2:]) is None
