"""benchmarks/device_check.py, the script a session with a GPU runs first, works end to end
on the CPU: it trains the variants it is given, runs its equivalence checks and writes its
report (so device time is never spent on a broken script)."""

import json
import subprocess
import sys

import pytest
import torch
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
    assert all(r["requests"] >= 3 * r["batch"] and r["tokens_per_s"] is not None for r in eng["protocol"])
    # every shape captured before the measured run, none inside it; the backend and K/V read per pass
    assert all(r["shapes_captured"] > 0 and r["captures_in_run"] == 0 for r in eng["protocol"])
    assert all(r["attention"] == "sdpa_gathered" and r["attn_mb_per_pass"] > 0 for r in eng["protocol"])
    # the state every pass leaves, graphs on (captured in the run and before it) vs off, fp32
    assert len(eng["state_graphs_vs_eager"]) == 6 and max(eng["state_graphs_vs_eager"].values()) <= 1e-4
    assert len({(r["model"], r["batch"], r["graphs"]) for r in eng["protocol"]}) == len(eng["protocol"])
    # the lockstep target: each MoR model under both policies, the same tokens, fewer block passes
    assert sorted(r["model"] for r in eng["policy"]) == ["MoR-2", "MoR-3", "MoR-4"]
    for r in eng["policy"]:
        assert r["same_tokens"] == 1 and r["block_passes_new"] <= r["block_passes_old"]
        assert r["target_block"] == pytest.approx(0.9 * r["block_passes_old"] / r["block_passes_new"])
        assert r["speedup"] == pytest.approx(r["tokens_per_s_new"] / r["tokens_per_s_old"])


def _device_check():
    """benchmarks/device_check.py as a module (its helpers, without running it)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("device_check", ROOT / "benchmarks" / "device_check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _report(flash_state, same=True):
    return {"runs": [], "checks": {"chunked_attention_max_err": 0.0}, "skipped_rows": [],
            "engine": {"matches_decode": {"mor-ec graphs=True": same},
                       "flash_paged": {"state": flash_state, "max_err": 1e-3 if flash_state == "pass" else None,
                                       "why": "flash-attn not installed" if flash_state == "not run" else None}}}


def test_flash_absent_reads_not_run_neither_pass_nor_failure(monkeypatch):
    """Without flash-attn (the lent GPU image has none) the paged flash check is NOT RUN, named
    with why: the verdict is 'incomplete', not 'pass'; ok (the exit status) follows the checks
    that ran, true when they pass and false when one fails."""
    from mor.engine import cache as kvc

    dc = _device_check()
    monkeypatch.setattr(kvc, "_flash_with_kvcache", None)
    flash = dc.flash_paged_check(torch.device("cuda"))  # returns before touching a device
    assert flash == {"state": "not run", "why": "flash-attn not installed", "max_err": None}
    assert dc.flash_text(flash) == "NOT RUN (flash-attn not installed)"
    absent = dc.outcome(_report("not run"))
    assert absent == {"ok": True, "status": "incomplete", "failed": [],
                      "not_run": ["flash paged attention (flash-attn not installed)"]}
    assert dc.outcome(_report("pass"))["status"] == "pass"
    broken = dc.outcome(_report("not run", same=False))
    assert not broken["ok"] and broken["status"] == "fail" and broken["not_run"] == absent["not_run"]


def test_state_drift_and_captures_in_a_measured_run_fail():
    """A state after some pass that moved past the tolerance with graphs on (or is not finite),
    and a shape captured inside a measured row, are failures."""
    dc = _device_check()
    report = _report("pass")
    report["engine"]["state_graphs_vs_eager"] = {"mor-ec captured in run": 8.6e-3, "mor-tc captured in run": 1e-7,
                                                 "mor-seq captured in run": float("nan")}
    report["engine"]["protocol"] = [{"model": "MoR-3", "batch": 32, "captures_in_run": 2},
                                    {"model": "MoR-2", "batch": 32, "captures_in_run": 0}]
    out = dc.outcome(report)
    assert out["status"] == "fail" and len(out["failed"]) == 3
    assert any("mor-ec" in f for f in out["failed"]) and any("mor-seq" in f for f in out["failed"])
    assert any("MoR-3 b=32: 2 shapes captured" in f for f in out["failed"])


def test_policy_tokens_that_differ_fail_in_fp32_only():
    """Lockstep and depth-wise tokens must agree in fp32 (a failure otherwise); in bf16 a row's
    rounding may follow its pass's row count, so their agreement is a figure, not a check."""
    dc = _device_check()
    for dtype, fails in (("float32", True), ("bfloat16", False)):
        report = _report("pass") | {"dtype": dtype}
        report["engine"]["policy"] = [{"model": "MoR-3", "same_tokens": 0.97}, {"model": "MoR-2", "same_tokens": 1.0}]
        out = dc.outcome(report)
        assert out["failed"] == (["MoR-3: depth-wise and lockstep tokens differ"] if fails else [])
        assert out["status"] == ("fail" if fails else "pass")


def test_protocol_window_is_sized_and_never_borrows_whole_run_figures():
    """Each row runs >= 3 x its rows per pass requests (so the waiting window is not empty at
    B = 42-51 with 96 requests); a row with an empty window records None for the window's
    figures, the whole run's only under *_run, and its ratio over the Vanilla is None in the
    window; a Vanilla runs its base batch once per graphs setting."""
    from argparse import Namespace

    from mor.engine.engine import EngineResult

    dc = _device_check()
    a = Namespace(engine_requests=96, engine_requests_per_row=3.0)
    assert [dc.requests_for(b, a) for b in (32, 42, 48, 51)] == [96, 126, 144, 153]
    # 4 rows per pass, never waiting and never 2B = 8 live: no window
    res = EngineResult({0: [1, 2], 1: [3, 4]}, batch=4, kinds=["block", "head", "block", "head"], rows=[2, 2, 2, 2],
                       waiting=[0] * 4, live=[2] * 4, pass_s=[0.5] * 4, forward_s=2.0)
    fig = dc.window_figures(res)
    assert fig["tokens_per_s"] is None and fig["fill"] is None and fig["passes_per_token"] is None
    assert fig["tokens_per_s_run"] == 2.0 and fig["fill_run"] == 0.5 and fig["passes_per_token_run"] == 0.5
    rows = [dict(model="Vanilla-8", batch=32, graphs=True, tokens_per_s=100.0, tokens_per_s_run=90.0),
            dict(model="MoR-2", batch=42, graphs=True, tokens_per_s=None, tokens_per_s_run=180.0)]
    dc.attach_ratios(rows, {"Vanilla-8": "Vanilla-8", "MoR-2": "Vanilla-8"}, 32)
    assert rows[0]["vs_vanilla"] == 1.0 and rows[1]["vs_vanilla"] is None and rows[1]["vs_vanilla_run"] == 2.0
    plan = dc.protocol_plan({"Vanilla-8": None, "MoR-2": None}, {"Vanilla-8": 32.0, "MoR-2": 42.7}, 32, cuda=True)
    assert plan == [("Vanilla-8", 32, True), ("MoR-2", 32, True), ("MoR-2", 42, True),
                    ("Vanilla-8", 32, False), ("MoR-2", 32, False)]


def test_budget_skips_rows_by_name_and_the_report_says_so(tmp_path):
    """--budget-s 0: the checks run, no protocol row starts, each is named as skipped, the
    report is written and reads 'incomplete' (nothing failed), and the paged flash check
    prints NOT RUN on a machine without flash-attn or a GPU."""
    cmd = [sys.executable, str(ROOT / "benchmarks" / "device_check.py"), "--device", "cpu", "--engine-only",
           "--engine-scale", "tiny", "--engine-protocol", "local", "--dtype", "float32", "--budget-s", "0",
           "--out", str(tmp_path)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "flash paged attention: NOT RUN (" in done.stdout
    report = json.loads((tmp_path / "device_check.json").read_text())
    assert report["ok"] and report["status"] == "incomplete" and report["engine"]["protocol"] == []
    assert {"MoR-2 b=32 graphs=True", "MoR-4 b=32 graphs=True", "MoR-2 policy b=32"} <= set(report["skipped_rows"])
    assert all(f"{n} (--budget-s)" in report["not_run"] for n in report["skipped_rows"])
    assert report["engine"]["flash_paged"]["state"] == "not run" and all(report["engine"]["matches_decode"].values())
