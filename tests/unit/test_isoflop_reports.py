"""Compute-optimal analysis (mor.metrics.isoflop) on hand-made profiles, and the table9 /
fig5a / fig4b / table11 renderers on synthetic parquet."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from mor.config import ModelConfig, RunConfig, TrainConfig
from mor.reports import render
from mor.metrics.isoflop import Optimum, optimal_size, path_slope, size_exponent
from mor.results import write_rows


def test_parabola_minimum_is_recovered_exactly():
    """NLL = 3 + 0.5 (log10 N - 5.5)^2 sampled at four sizes: N* = 10^5.5, NLL* = 3."""
    n = [1e5, 2e5, 1e6, 3e6]
    nll = [3 + 0.5 * (math.log10(x) - 5.5) ** 2 for x in n]
    o = optimal_size(n, nll, 1e12)
    assert o.kind == "fit"
    assert o.n_params == pytest.approx(10**5.5, rel=1e-9)
    assert o.nll == pytest.approx(3.0, abs=1e-12)


def test_monotone_profile_has_its_optimum_at_the_edge():
    o = optimal_size([1e5, 2e5, 4e5, 8e5], [3.0, 3.1, 3.3, 3.6], 1e12)  # smallest best, concave-up min left of range
    assert (o.kind, o.n_params, o.nll) == ("edge", pytest.approx(1e5), 3.0)
    o = optimal_size([1e5, 2e5, 4e5], [3.0, 2.0, 3.5], 1e12)  # a concave-up fit inside: interior
    assert o.kind == "fit" and 1e5 < o.n_params < 4e5


def test_path_slope_and_size_exponent_by_hand():
    """Stars at N* = 1e5, 1e6 (decade apart) for budgets 1e12, 1e14: a = 1 / 2 decades = 0.5;
    NLL falls 0.3 over that decade: slope -0.3."""
    optima = [Optimum(1e12, 1e5, 3.3, "fit"), Optimum(1e14, 1e6, 3.0, "fit")]
    assert size_exponent(optima) == pytest.approx(0.5)
    assert path_slope(optima) == pytest.approx(-0.3)
    assert math.isnan(path_slope([Optimum(1e12, 1e5, 3.3, "edge"), Optimum(1e14, 1e5, 3.0, "edge")]))


def _row(run: RunConfig, n_params: int, val_nll: float, **kw):
    m = run.model
    return {"run_id": run.run_id, "grid": run.grid, "config_hash": run.config_hash, "git_commit": "abc123",
            "mode": "local", "scale": m.scale, "paper_scale": run.paper_scale, "seed": 0, "variant": m.variant,
            "tying": None if m.variant == "vanilla" else m.tying, "num_recursions": m.num_recursions,
            "reduced": m.reduced, "n_params": n_params, "unique_layers": 2, "effective_layers": 4,
            "train_tokens": 2048 * 10, "train_steps": 10, "val_nll": val_nll,
            "config_json": json.dumps(run.to_dict()), **kw}


def _table9_rows():
    """Two variants x 3 sizes x 2 budgets with known optima: NLL = a_C + 0.4 (log10 N - x*_C)^2."""
    rows, truth = [], {}
    sizes = {"135M": ("xxs", 1e5), "360M": ("xs", 3e5), "730M": ("small", 1e6)}
    for variant, shift in (("vanilla", (0.0, 0.0)), ("mor", (0.2, 0.35))):  # MoR's optimum moves 0.65 decades
        for (budget, centre), sh in zip(((1e12, 5.1), (8e12, 5.6)), shift):
            truth[(variant, budget)] = 10 ** (centre + sh)
            for paper, (scale, n) in sizes.items():
                model = ModelConfig(scale=scale, variant=variant, num_recursions=3 if variant == "mor" else 1)
                run = RunConfig(grid="table9", paper_scale=paper, model=model,
                                train=TrainConfig(tokens=20480, budget_flops=budget))
                nll = 4.0 - 0.1 * math.log10(budget) + 0.4 * (math.log10(n) - centre - sh) ** 2
                rows.append(_row(run, int(n), nll, budget_flops=budget, train_flops=budget * 0.999))
    return rows, truth


def test_table9_lists_every_run_and_the_optimum_per_budget(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rows, truth = _table9_rows()
    write_rows(tmp_path / "r.parquet", rows)
    grid = tmp_path / "table9.yaml"
    grid.write_text("reference: []\n")
    files = {f.name: f for f in render("tables/table9", str(tmp_path / "r.parquet"), str(grid))}
    table = pd.read_csv(files["table9.csv"])
    assert len(table) == 12 and list(table["Model"].unique()) == ["Vanilla", "MoR"]
    assert table["FLOPs spent / budget"].tolist() == [0.999] * 12
    opt = pd.read_csv(files["optimal.csv"])
    for _, r in opt.iterrows():
        variant = {"Vanilla": "vanilla", "MoR": "mor"}[r["Model"]]
        assert r["N* (params)"] == pytest.approx(truth[(variant, float(r["Budget (FLOPs)"]))], abs=1)  # rounded to a count
    path = pd.read_csv(files["optimal_path.csv"]).set_index("Model")
    # Vanilla's optimum moves 0.5 decades, MoR's 0.65, for log10(8) decades of compute
    assert path.loc["Vanilla", "Size exponent a (N* ~ C^a)"] == pytest.approx(0.5 / math.log10(8), abs=1e-3)
    assert path.loc["MoR", "Size exponent a (N* ~ C^a)"] == pytest.approx(0.65 / math.log10(8), abs=1e-3)
    mb = pd.read_csv(files["maxbatch.csv"])
    assert list(mb["Seed"]) == [42, 48, 51]
    assert (mb["(b) exact, len 2048"] < mb["(a) 32 x 2Nr/(Nr+1)"]).all()
    fig = render("figures/fig5a", str(tmp_path / "r.parquet"), str(grid))
    stars = pd.read_csv([f for f in fig if f.suffix == ".csv"][0])
    assert len(stars) == 4 and set(stars["kind"]) == {"fit"}
    assert np.allclose(sorted(stars["n_params_opt"]), sorted(truth.values()), rtol=1e-6)


def test_fig4b_draws_each_scheme_and_the_vanilla_references(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    mk = lambda **kw: RunConfig(grid="table10", paper_scale="135M", model=ModelConfig(scale="small", **kw))  # noqa: E731
    runs = [(mk(), 5.0), (mk(variant="vanilla", reduced=True, num_recursions=2), 5.4),
            (mk(variant="vanilla", reduced=True, num_recursions=3), 5.6)]
    runs += [(mk(variant="recursive", tying=t, num_recursions=nr), 5.1 + 0.1 * nr + 0.01 * i)
             for i, t in enumerate(["cycle", "sequence"]) for nr in (2, 3)]
    write_rows(tmp_path / "r.parquet", [_row(r, 1000, v) for r, v in runs])
    grid = tmp_path / "table10.yaml"
    grid.write_text("reference: []\n")
    drawn = pd.read_csv([f for f in render("figures/fig4b", str(tmp_path / "r.parquet"), str(grid))
                         if f.suffix == ".csv"][0])
    assert sorted(drawn["series"].unique()) == ["Cycle", "Sequence", "Vanilla", "Vanilla (reduced)"]
    seq3 = drawn[(drawn["series"] == "Sequence") & (drawn["num_recursions"] == 3)]["val_nll"].item()
    assert seq3 == pytest.approx(5.1 + 0.3 + 0.01)


def test_table11_shows_the_paper_numbers_beside_ours(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    mk = lambda **kw: RunConfig(grid="table11", paper_scale="730M",  # noqa: E731
                                model=ModelConfig(scale="small", variant="recursive", num_recursions=3, **kw))
    runs = [mk(tying="middle_cycle"), mk(tying="cycle", layers=12)]
    write_rows(tmp_path / "r.parquet", [_row(runs[0], 900, 5.0, avg_accuracy=0.3), _row(runs[1], 900, 5.1, avg_accuracy=0.31)])
    grid = tmp_path / "table11.yaml"
    grid.write_text("reference:\n"
                    "  - {paper_scale: 730M, variant: recursive, tying: middle_cycle, num_recursions: 3, val_nll: 2.7552, avg_accuracy: 0.4232}\n"
                    "  - {paper_scale: 730M, variant: recursive, tying: cycle, num_recursions: 3, val_nll: 2.7573, avg_accuracy: 0.4190}\n")
    csv = pd.read_csv(render("tables/table11", str(tmp_path / "r.parquet"), str(grid))[0]).set_index("tying")
    assert csv.loc["middle_cycle", "Paper NLL"] == 2.7552 and csv.loc["cycle", "Paper Avg acc"] == 0.419
    assert csv.loc["cycle", "layers"] == 12 and csv.loc["cycle", "NLL (top-k, sees future)"] == 5.1


def test_fig4b_draws_the_mean_over_seeds(tmp_path, monkeypatch):
    """Two seeds of one scheme (NLL 5.0 and 5.2) are one point at 5.1; two seeds of the
    vanilla one reference line at their mean."""
    monkeypatch.chdir(tmp_path)

    def mk(seed, **kw):
        return RunConfig(grid="table10", paper_scale="135M", model=ModelConfig(scale="small", **kw),
                         train=TrainConfig(seed=seed))
    rows = []
    for seed, nll in ((0, 5.0), (1, 5.2)):
        r = mk(seed, variant="recursive", tying="cycle", num_recursions=2)
        rows.append({**_row(r, 1000, nll), "seed": seed})
        v = mk(seed)
        rows.append({**_row(v, 1000, 4.8 + 0.1 * seed), "seed": seed})
    write_rows(tmp_path / "r.parquet", rows)
    grid = tmp_path / "table10.yaml"
    grid.write_text("reference: []\n")
    drawn = pd.read_csv([f for f in render("figures/fig4b", str(tmp_path / "r.parquet"), str(grid))
                         if f.suffix == ".csv"][0]).set_index("series")
    assert drawn.loc["Cycle", "val_nll"] == pytest.approx(5.1)
    assert drawn.loc["Vanilla", "val_nll"] == pytest.approx(4.85)
    table = pd.read_csv(render("tables/table10", str(tmp_path / "r.parquet"), str(grid))[0]).set_index("Model")
    assert table.loc["Cycle", "NLL (top-k, sees future)"] == pytest.approx(5.1) and table.loc["Cycle", "n"] == 2
    assert table.loc["Cycle", "NLL (top-k, sees future) sd"] == pytest.approx(0.1414, abs=1e-4)  # sd of 5.0, 5.2
