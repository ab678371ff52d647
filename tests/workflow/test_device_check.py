"""benchmarks/device_check.py, the script a session with a GPU runs first, works end to end
on the CPU: it trains the variants it is given, runs its equivalence checks and writes its
report (so device time is never spent on a broken script)."""

import json
import subprocess
import sys

import pytest
from helpers.paths import REPO as ROOT


def test_device_check_runs_on_cpu_and_reports(tmp_path):
    only = ["recursive", "mor-ec shared_dagger", "mor-tc shared"]
    cmd = [sys.executable, str(ROOT / "benchmarks" / "device_check.py"), "--device", "cpu", "--scale", "tiny",
           "--seq", "64", "--batch", "2", "--steps", "2", "--dtype", "float32", "--out", str(tmp_path), "--only", *only]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads((tmp_path / "device_check.json").read_text())
    assert report["ok"] and report["device"] == "cpu" and report["seq"] == 64
    assert sorted(r["variant"] for r in report["runs"]) == sorted(only)
    for run in report["runs"]:
        assert run["finite"] and run["tokens_per_s"] > 0 and run["flash_calls"] == 0  # no flash-attn on CPU
    assert set(report["checks"]) == {"chunked_attention_max_err", *(f"{n} device_vs_cpu_max_err" for n in only)}
    assert report["checks"]["chunked_attention_max_err"] < 1e-5


@pytest.mark.slow
def test_device_check_engine_protocol_runs_on_cpu(tmp_path):
    """The engine part (--engine-only) at the tiny scale: the engine equals decode.generate with
    graphs on and off, the paged flash check is skipped without a GPU, and App. E's protocol
    gives a row per model and setting with its speed over the same-depth Vanilla."""
    cmd = [sys.executable, str(ROOT / "benchmarks" / "device_check.py"), "--device", "cpu", "--engine-only",
           "--engine-scale", "tiny", "--engine-protocol", "local", "--engine-requests", "12", "--dtype", "float32",
           "--cpu-memory-gib", "0.05", "--out", str(tmp_path)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads((tmp_path / "device_check.json").read_text())
    eng = report["engine"]
    assert report["ok"] and eng["paged_attention_max_err"] is None and all(eng["matches_decode"].values())
    assert len(eng["matches_decode"]) == 6
    models = {r["model"] for r in eng["protocol"]}
    assert {"MoR-2", "MoR-3", "MoR-4"} <= models and any(m.startswith("Vanilla") for m in models)
    assert all(r["vs_vanilla"] and r["vs_vanilla"] > 0 for r in eng["protocol"])
