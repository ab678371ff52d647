"""The plan's CPU prices against measured CPU (mor.launch.price_check), and the local `paper`
target's price with the claims' whole look held to its budget."""

from __future__ import annotations

import argparse

import pytest

from helpers.paths import REPO
from mor.grids import load_grid
from mor.launch.__main__ import _usage
from mor.launch.cost import JobEstimate, plan_grid
from mor.launch.presets import load_presets
from mor.launch.price_check import fit_start, job_label, priced_cpu_minutes, rates, shared_cpu_minutes, with_full_look
from mor.status.targets import resolve_targets
from mor.usage import read

# Issue 31: the local `paper` target, the claims' look included, priced within 240 CPU-minutes
# (2 hours on an idle 2-core machine); grids/claims/claims.yaml's look is 20 fresh seeds.
PAPER_BUDGET_CPU_MIN = 240.0


def _job(scale: str, kind: str, flops: float, hours: float, analysis: str = "") -> JobEstimate:
    return JobEstimate("r", kind, scale, 1, 0, 1, 60, flops, hours, 1, analysis=analysis)


def test_rates_are_ratios_of_sums_per_scale_and_preset_kind():
    """Three small train jobs of 1, 3 and 1 TFLOP measured 10, 30 and 90 CPU-s: 5 TFLOP in 130 s
    (a ratio of sums, 0.0385; the mean of the three ratios would be 0.0704); with a 2 s start-up
    a job, 5 TFLOP in 124 s. An analysis prices as eval and joins the eval jobs of its scale."""
    r = rates([(_job("small", "train", 1e12, 0.01), "train", 10.0, 2.0),
               (_job("small", "train", 3e12, 0.01), "train", 30.0, 2.0),
               (_job("small", "train", 1e12, 0.02), "train", 90.0, 2.0),
               (_job("small", "eval", 2e11, 0.001), "eval", 4.0, 0.0),
               (_job("small", "analysis", 2e11, 0.001, "depth_cap"), "eval", 6.0, 0.0),
               (_job("micro", "train", 1e11, 0.001), "train", 5.0, 5.0)])
    by = {(x.scale, x.kind): x for x in r}
    assert set(by) == {("small", "train"), ("small", "eval"), ("micro", "train")}
    t = by[("small", "train")]
    assert (t.jobs, t.cpu_s, t.start_s) == (3, 130.0, 6.0)
    assert t.tflops == pytest.approx(5 / 124)
    assert t.priced_s == pytest.approx(0.04 * 3600)
    assert t.measured_over_priced == pytest.approx(130 / 144)
    assert by[("small", "eval")].tflops == pytest.approx(4e11 / 10 / 1e12)
    assert by[("micro", "train")].tflops == 0.0  # all of it start-up: no rate to report


def test_the_start_up_fit_recovers_a_planted_line_and_declines_what_it_cannot_separate():
    """Jobs costing 7 s + FLOPs at 0.05 TFLOP/s, with +-0.5 s of noise that sums to zero at each
    end: the fit gives back 7 s and 0.05; jobs of one size (eval of one token count) cannot
    separate the two, and a line falling with FLOPs is not a cost."""
    flops = [1e11, 1e11, 5e11, 5e11, 2e12, 2e12]
    noise = [0.5, -0.5, 0.5, -0.5, 0.5, -0.5]
    start, tflops = fit_start((f, 7.0 + f / 0.05e12 + e) for f, e in zip(flops, noise))
    assert start == pytest.approx(7.0, abs=1e-9) and tflops == pytest.approx(0.05, rel=1e-9)
    assert fit_start([(1e11, 5.0), (1.2e11, 6.0)]) is None
    assert fit_start([(1e11, 9.0), (1e12, 5.0)]) is None


def test_the_price_check_reads_the_record_the_launcher_writes(tmp_path):
    """An analysis job's record is found under the name the launcher gives it, for every job a
    real grid plans (fig5c's depth-cap analyses included); an eval job's under its eval settings'
    hash, which the workflow's eval rule passes (--eval-settings)."""
    g = load_grid(REPO / "grids" / "fig5c.yaml", "local")
    jobs = plan_grid(g, load_presets())
    assert {j.kind for j in jobs} >= {"train", "eval", "analysis"}
    for j in jobs[:8]:
        settings = g.run(j.run_id).config.eval_hash if j.kind == "eval" else None
        a = argparse.Namespace(kind=j.kind, analysis=j.analysis, run_dir=str(tmp_path / j.run_id), threads=1,
                               run_id=j.run_id, eval_settings=settings)
        _usage(a, 0.0, finished=True)
        assert read(tmp_path / j.run_id / "usage" / f"{job_label(j, settings or '')}.json")["finished"] is True


def test_two_eval_settings_of_one_run_keep_two_cost_records(tmp_path):
    """Issue 58: a run scored under two eval settings has two eval jobs; each keeps its own usage
    record, so the second never overwrites the first's CPU time."""
    for settings, cpu in (("aaaa1111", 3.0), ("bbbb2222", 5.0)):
        a = argparse.Namespace(kind="eval", analysis="", run_dir=str(tmp_path / "r"), threads=1, run_id="r",
                               eval_settings=settings)
        _usage(a, 0.0, finished=True)
    names = sorted(p.name for p in (tmp_path / "r" / "usage").iterdir())
    assert names == ["eval-aaaa1111.json", "eval-bbbb2222.json"]


def test_the_full_look_raises_exactly_the_local_familys_blocks():
    """The local design's look (20 fresh seeds from seed 29, the third design) raises fig5c's MoR
    block and deciding's balancing pair, skipping the seeds earlier designs read (3-28), and
    nothing else."""
    paper = resolve_targets(["paper"], REPO / "grids", "local")
    before = {g.name: len(g.runs) for g in paper}
    after = {g.name: g for g in with_full_look(paper, "local")}
    changed = {n for n in before if len(after[n].runs) != before[n]}
    assert changed == {"fig5c", "deciding"}
    assert len(after["fig5c"].runs) == 3 * (3 + 20)
    bal = [r for r in after["deciding"].runs if r.block == "balancing"]
    assert len(bal) == 2 * 23
    assert sorted({r.config.train.seed for r in bal}) == [0, 1, 2] + list(range(29, 49))
    assert len(after["deciding"].runs) - len(bal) == before["deciding"] - 2 * 3


def test_local_paper_with_its_whole_look_is_priced_within_the_budget():
    """The presets' measured CPU rates price every job of `paper` in the local mode, the claims'
    look at its last seed included, within issue 31's budget: a grid edit that breaks it fails
    here before anyone trains (benchmarks/price_check.py prices it against a finished run)."""
    paper = with_full_look(resolve_targets(["paper"], REPO / "grids", "local"), "local")
    minutes = priced_cpu_minutes(paper, load_presets())
    assert set(minutes) == {g.name for g in paper} and all(m > 0 for m in minutes.values())
    assert sum(minutes.values()) <= PAPER_BUDGET_CPU_MIN, minutes


def test_local_paper_prices_each_distinct_run_once_and_its_eval_once_per_eval_settings():
    """Issue 58: run together, `paper`'s grids train a shared run once and score it once per
    distinct eval settings, so its price is the per-grid price less exactly the repeats: the
    repeated listings' train / lm-eval / analysis / throughput jobs, and their evals where the
    settings agree."""
    from mor.launch.cost import plan_grid

    paper = resolve_targets(["paper"], REPO / "grids", "local")
    presets = load_presets()
    shared, per_grid = shared_cpu_minutes(paper, presets), priced_cpu_minutes(paper, presets)
    seen, repeats = set(), 0.0
    for g in sorted(paper, key=lambda g: g.name):
        for j in plan_grid(g, presets):
            key = (j.kind, j.run_id, j.analysis, g.run(j.run_id).config.eval_hash if j.kind == "eval" else "")
            repeats += j.device_hours * 60 if key in seen else 0.0
            seen.add(key)
    assert repeats > 0  # the paper's grids share runs: the test means something
    assert abs(sum(per_grid.values()) - repeats - sum(shared.values())) < 1e-6
    evals = {(r.run_id, r.config.eval_hash) for g in paper for r in g.runs}
    rows = sum(len(g.runs) for g in paper)
    assert len(evals) < rows  # some shared runs are scored alike: one eval serves several rows
