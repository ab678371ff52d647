"""The skewness of the comparisons' per-seed differences (mor.claims.skew, issue 47): the
estimate and its bootstrap interval on planted samples whose skew is known, the log-normal
sigma it is read against, and the table on the differences the verdict reads."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats as st

from mor.claims import CLAIMS, load_specs
from mor.claims.skew import lognormal_sigma, lognormal_skewness, skew_table, skewness

DESIGN, SPECS = load_specs(mode="local")
RESAMPLES = 2000  # enough for a 95 % interval's ends here, and fast


def test_a_log_normal_sample_is_skewed_and_a_normal_one_is_not():
    """n = 200: log-normal(0.8) differences (true skewness 3.7) give G1 > 0 with an interval
    above 0; normal differences give an interval that covers 0. G1 is scipy's adjusted
    Fisher-Pearson coefficient, the same number from the formula written out."""
    rng = np.random.default_rng(0)
    d = np.exp(0.8 * rng.standard_normal(200)) - math.exp(0.32)  # centred: a null's differences
    g, lo, hi, n = skewness(d, resamples=RESAMPLES)
    m2, m3 = ((d - d.mean()) ** 2).mean(), ((d - d.mean()) ** 3).mean()
    assert g == pytest.approx(m3 / m2 ** 1.5 * math.sqrt(n * (n - 1)) / (n - 2))
    assert n == 200 and g > 1 and 0 < lo < g < hi
    g, lo, hi, n = skewness(rng.standard_normal(200), resamples=RESAMPLES)
    assert lo < 0 < hi and abs(g) < 0.5
    assert skewness(-d, resamples=RESAMPLES)[2] < 0  # left skew: the interval below 0


def test_the_interval_is_reproducible_and_undefined_where_it_should_be():
    d = np.random.default_rng(1).standard_normal(20)
    assert skewness(d, resamples=RESAMPLES) == skewness(d, resamples=RESAMPLES)  # a fixed generator
    assert all(math.isnan(v) for v in skewness([1.0, 2.0], resamples=RESAMPLES)[:3])  # G1 needs 3 seeds
    g, lo, hi, n = skewness(np.full(20, 0.3), resamples=RESAMPLES)
    assert (g, n) == (0.0, 20) and math.isnan(lo) and math.isnan(hi)  # no spread, nothing to resample


@pytest.mark.parametrize("sigma", [0.2, 0.4, 0.6, 0.8])
def test_lognormal_sigma_inverts_the_log_normal_skewness(sigma):
    g = float(st.lognorm(sigma).stats(moments="s"))
    assert lognormal_skewness(sigma) == pytest.approx(g)
    assert lognormal_sigma(g) == pytest.approx(sigma, abs=1e-8)
    assert lognormal_sigma(-g) == pytest.approx(-sigma, abs=1e-8)
    assert lognormal_sigma(0.0) == 0.0 and math.isnan(lognormal_sigma(math.nan))


def test_the_table_reads_the_differences_the_verdict_reads():
    """fig5c's depth-cap curves of an Nr = 3 model (step cap 1 -> 2 log-normal, right-skewed; step
    2 -> 3 normal) and an Nr = 2 model (its one step normal) over 200 seeds. deeper-recursion's one
    comparison is the mean of the two models' trends (issue 61): the table has that one row, the
    skewness of exactly those per-seed means, its interval above 0; the Nr = 2 model alone gives
    its trend's row, whose interval covers 0. Seeds below the design's first fresh seed (a pilot)
    are not read, as the verdict reads none of them."""
    n, pilot = 200, 5
    rng = np.random.default_rng(2)
    step1 = 0.01 * np.exp(0.8 * rng.standard_normal(n + pilot))
    step2 = 0.01 + 0.001 * rng.standard_normal(n + pilot)
    step = 0.001 * np.random.default_rng(3).standard_normal(n + pilot)
    caps = np.stack([5.0 + step1 + step2, 5.0 + step2, np.full(n + pilot, 5.0)], axis=1)  # NLL at caps 1, 2, 3

    def rows(nr):
        if nr == 3:
            return [{"seed": s, "num_recursions": 3, "val_nll": caps[s, 2], "config_json": "{}",
                     **{f"depth_cap_nll_{d}": caps[s, d - 1] for d in (1, 2)}} for s in range(n + pilot)]
        return [{"seed": s, "num_recursions": 2, "val_nll": 5.0, "config_json": "{}", "depth_cap_nll_1": 5.0 + step[s]}
                for s in range(n + pilot)]

    design = dataclasses.replace(DESIGN, looks=(n,), first_seed=pilot)
    frames = {"fig5c": pd.DataFrame(rows(3) + rows(2))}
    table = skew_table(frames, design, SPECS, ("deeper-recursion",), resamples=RESAMPLES).set_index("comparison")
    assert list(table.index) == ["mean of 2"]
    assert (table["n seeds"] == n).all() and (table["claim"] == "deeper-recursion").all()
    planted = (((step1 + step2) / 2 + step) / 2)[pilot:]  # trends: Nr=3 (cap 1 - cap 3) / 2, Nr=2 cap 1 - cap 2
    skewed = table.loc["mean of 2"]
    assert skewed["skewness"] == pytest.approx(float(st.skew(planted, bias=False)), rel=1e-6)
    assert skewed["mean"] == pytest.approx(planted.mean(), rel=1e-9)
    assert 0 < skewed["lo"] < skewed["skewness"] < skewed["hi"] and skewed["sigma lo"] > 0
    normal = skew_table({"fig5c": pd.DataFrame(rows(2))}, design, SPECS, ("deeper-recursion",),
                        resamples=RESAMPLES).set_index("comparison").loc["Nr=2 trend"]
    assert normal["mean"] == pytest.approx(step[pilot:].mean(), rel=1e-9)
    assert normal["lo"] < 0 < normal["hi"]
    # a claim outside the family, or a grid not built, has no rows
    assert skew_table(frames, design, SPECS, ("aux-separates",), resamples=RESAMPLES).empty
    assert {c.id for c in CLAIMS} >= set(skew_table({}, design, SPECS, None, resamples=RESAMPLES)["claim"])


def test_claims_writes_the_skew_table_beside_claims_md(tmp_path):
    """``python -m mor claims --skew`` writes skew.md and skew.csv in the same folder as claims.md,
    from the parquet and depth_cap files as the pipeline writes them (the design's 20 fresh seeds)."""
    from mor.cli import main
    from mor.config import ModelConfig, RunConfig, TrainConfig
    from mor.results import write_rows

    rng, rows = np.random.default_rng(3), []
    for s in range(DESIGN.first_seed + 20):
        run = RunConfig(grid="fig5c", paper_scale="135M", train=TrainConfig(seed=s),
                        model=ModelConfig(scale="small", variant="mor", num_recursions=2))
        rows.append({"run_id": run.run_id, "grid": "fig5c", "config_hash": run.config_hash, "git_commit": "abc",
                     "mode": "local", "scale": "small", "paper_scale": "135M", "seed": s, "variant": "mor",
                     "tying": run.model.tying, "num_recursions": 2, "reduced": False, "n_params": 1, "unique_layers": 1,
                     "effective_layers": 1, "val_nll": 5.0, "config_json": json.dumps(run.to_dict())})
        path = tmp_path / "runs" / f"{run.run_id}.depth_cap.npz"
        path.parent.mkdir(parents=True, exist_ok=True)
        np.savez(path, max_depth=np.array([1, 2]), val_nll=np.array([5.05 + 0.01 * rng.standard_normal(), 5.0]))
    write_rows(tmp_path / "fig5c.parquet", rows)
    out = tmp_path / "claims"
    assert main(["claims", "--results", str(tmp_path), "--out", str(out), "--skew"]) == 0
    assert {"claims.md", "skew.md", "skew.csv"} <= {p.name for p in out.iterdir()}
    table = pd.read_csv(out / "skew.csv")
    assert list(table["comparison"]) == ["Nr=2 trend"] and table["n seeds"].iloc[0] == 20
    assert "Skewness of every comparison" in (out / "skew.md").read_text()


def test_the_markdown_names_the_comparisons_wholly_beyond_the_bound():
    """skew.md counts a comparison as past the design's bound only where its whole interval is,
    on either side: [0.8, 0.9] and [-0.9, -0.7] in sigma are past 0.6; [-0.78, -0.29] and [0.1, 0.9] are not."""
    from mor.claims.skew import COLUMNS, skew_markdown

    ends = {"a": (0.8, 0.9), "b": (-0.9, -0.7), "c": (-0.78, -0.29), "d": (0.1, 0.9)}
    table = pd.DataFrame([{**{c: 0.0 for c in COLUMNS}, "claim": k, "comparison": "x", "per seed": "",
                           "sigma lo": lo, "sigma hi": hi} for k, (lo, hi) in ends.items()], columns=COLUMNS)
    design = dataclasses.replace(DESIGN, skew=0.6)
    assert "2 of 4 comparisons have an interval wholly beyond the bound (sigma 0.6): a x, b x." in skew_markdown(table, design)
