"""Figures 1, 5b, 5c, 7, 8 and Table 17 drawn from hand-built parquet rows and analysis
files: the numbers written beside each figure are the ones put in."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from helpers.figures import png_size
from helpers.tiny import tiny_run
from mor.analysis.sidecar import sidecar_path, write_sidecar
from mor.config import RouterConfig
from mor.data.tokenizer import load_tokenizer
from mor.metrics.routing import router_output_histogram
from mor.reports import render
from mor.results import write_rows


def row(run_id, cfg, **metrics):
    m = cfg.model
    return {"run_id": run_id, "grid": "g", "config_hash": cfg.config_hash, "git_commit": "x", "scale": "tiny",
            "paper_scale": "135M", "seed": 0, "variant": m.variant, "tying": m.tying, "num_recursions": m.num_recursions,
            "router_type": m.router.type if m.variant == "mor" else None, "kv": m.kv, "mode": "local",
            "val_nll": 5.0, "config_json": json.dumps(cfg.to_dict(), sort_keys=True), **metrics}


def grid_file(tmp_path):
    p = tmp_path / "g.yaml"
    p.write_text("name: g\nreference: []\n")
    return p


def mor(nr):
    return tiny_run(variant="mor", nr=nr, router=RouterConfig(type="expert_choice"))


def test_fig5c_draws_each_runs_capped_nll(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rows = [row(f"mor{nr}", mor(nr)) for nr in (2, 3)] + [row("van", tiny_run())]
    write_rows(tmp_path / "results" / "g.parquet", rows)
    for r, nll in zip(rows[:2], ([5.5, 5.0], [6.0, 5.4, 5.1])):
        write_sidecar(sidecar_path(tmp_path / "results", r["run_id"], "depth_cap"),
                      {"run_id": r["run_id"], "config_hash": r["config_hash"]},
                      {"max_depth": list(range(1, len(nll) + 1)), "val_nll": nll, "val_nll_causal": [x + 0.1 for x in nll]})
    files = render("figures/fig5c", str(tmp_path / "results" / "g.parquet"), str(grid_file(tmp_path)))
    assert sorted(f.name for f in files) == ["fig5c.csv", "fig5c.pdf", "fig5c.png"]
    table = pd.read_csv(tmp_path / "figures" / "fig5c" / "fig5c.csv")
    assert table["run_id"].tolist() == ["mor2"] * 2 + ["mor3"] * 3  # the vanilla run has no depth cap
    assert table["val_nll"].tolist() == [5.5, 5.0, 6.0, 5.4, 5.1]
    assert table["val_nll_causal"].tolist() == pytest.approx([5.6, 5.1, 6.1, 5.5, 5.2])


def test_fig5c_refuses_an_analysis_file_of_another_training(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = row("mor2", mor(2))
    write_rows(tmp_path / "results" / "g.parquet", [r])
    write_sidecar(sidecar_path(tmp_path / "results", "mor2", "depth_cap"), {"run_id": "mor2", "config_hash": "old"},
                  {"max_depth": [1, 2], "val_nll": [1, 2], "val_nll_causal": [1, 2]})
    with pytest.raises(ValueError, match="written for config_hash 'old'"):
        render("figures/fig5c", str(tmp_path / "results" / "g.parquet"), str(grid_file(tmp_path)))


def test_fig5b_draws_the_stored_histograms(tmp_path, monkeypatch, drawn_figures):
    monkeypatch.chdir(tmp_path)
    rng = np.random.default_rng(0)
    hists = []
    for _ in range(3):
        s = rng.random(40)
        hists.append(router_output_histogram(s, s > 0.5, bins=4, value_range=(0, 1)))
    write_rows(tmp_path / "results" / "g.parquet", [row("mor3", mor(3), router_output_hist=json.dumps(hists))])
    render("figures/fig5b", str(tmp_path / "results" / "g.parquet"), str(grid_file(tmp_path)))
    bars = pd.read_csv(tmp_path / "figures" / "fig5b" / "fig5b.csv")
    assert bars["recursion"].tolist() == [1] * 4 + [2] * 4 + [3] * 4
    for r, h in enumerate(hists, start=1):
        sub = bars[bars["recursion"] == r]
        assert sub["selected"].tolist() == pytest.approx(h["selected"])
        assert sub["unselected"].tolist() == pytest.approx(h["unselected"])
        assert sub["selected"].iloc[:2].sum() == 0 and sub["unselected"].iloc[2:].sum() == 0  # g > 0.5 = selected
    # the figure: one panel per recursion, its two bar series at the histogram's values
    [fig] = drawn_figures
    panels = [ax for ax in fig.axes if ax.get_visible() and ax.axison]
    assert [ax.get_title() for ax in panels] == ["recursion 1", "recursion 2", "recursion 3"]
    for ax, h in zip(panels, hists):
        selected, unselected = ax.containers
        assert [b.get_height() for b in selected] == pytest.approx(h["selected"])
        assert [b.get_height() for b in unselected] == pytest.approx(h["unselected"])
        assert [t.get_text() for t in ax.get_legend().get_texts()] == [
            f"selected (n={h['n_selected']})", f"unselected (n={h['n_unselected']})"]
    w, h = fig.get_size_inches() * 150
    assert png_size(tmp_path / "figures" / "fig5b" / "fig5b.png") == pytest.approx((w, h), abs=1)


def test_fig7_and_fig8_draw_the_stored_kv_arrays(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = tiny_run(variant="recursive", tying="cycle", nr=2)
    r = row("rec", cfg)
    write_rows(tmp_path / "results" / "g.parquet", [r, row("mor2", mor(2))])
    mag = np.arange(12, dtype=float).reshape(4, 3)
    cos = np.eye(4) * 0.5 + 0.5
    write_sidecar(sidecar_path(tmp_path / "results", "rec", "kv"),
                  {"run_id": "rec", "config_hash": r["config_hash"], "depth_labels": ["r1.L0", "r1.L1", "r2.L0", "r2.L1"],
                   "recursion_layers": [0, 2, 2, 0]},
                  {"key_magnitude": mag, "value_magnitude": mag * 2, "key_cosine": cos, "value_cosine": cos * 0.9})
    results, grid = str(tmp_path / "results" / "g.parquet"), str(grid_file(tmp_path))
    render("figures/fig7", results, grid)
    render("figures/fig8", results, grid)
    f7 = pd.read_csv(tmp_path / "figures" / "fig7" / "fig7.csv")
    assert f7[f7["state"] == "value"][["pos0", "pos1", "pos2"]].to_numpy() == pytest.approx(mag * 2)
    assert f7["layer"].tolist()[:4] == ["r1.L0", "r1.L1", "r2.L0", "r2.L1"]
    f8 = pd.read_csv(tmp_path / "figures" / "fig8" / "fig8.csv")
    assert f8[f8["state"] == "key"][["r1.L0", "r1.L1", "r2.L0", "r2.L1"]].to_numpy() == pytest.approx(cos)
    assert (tmp_path / "figures" / "fig8" / "fig8.pdf").read_bytes()[:4] == b"%PDF"


def test_table17_and_fig1_decode_tokens_with_the_runs_tokenizer(tmp_path, monkeypatch, data_root, drawn_figures):
    monkeypatch.chdir(tmp_path)
    tok = load_tokenizer(data_root / "tokenizer" / "bpe-4096.json")
    ids = tok.encode("The model routes each token. The model routes | each token.")
    cfg = mor(3)
    seq = cfg.train.seq_len
    ids = (ids * (2 * seq // len(ids) + 1))[: 2 * seq]
    depths = [1 + (i % 3) for i in range(len(ids))]
    write_rows(tmp_path / "results" / "g.parquet",
               [row("mor3", cfg, sample_token_ids=ids, sample_token_depths=depths), row("van", tiny_run())])
    results, grid = str(tmp_path / "results" / "g.parquet"), str(grid_file(tmp_path))
    render("tables/table17", results, grid, data_root=str(data_root))
    long = pd.read_csv(tmp_path / "tables" / "table17" / "table17.csv", keep_default_na=False)
    assert long["count"].sum() == len(ids)
    for d in (1, 2, 3):
        sub = long[long["depth"] == d]
        want = pd.Series([tok.decode([t]) for t, dd in zip(ids, depths) if dd == d]).value_counts()
        assert dict(zip(sub["token"], sub["count"])) == want.to_dict()
    md = (tmp_path / "tables" / "table17" / "table17.md").read_text()
    assert "mor3" in md and "van" not in md and "\\|" in md  # a '|' token does not break the table
    render("figures/fig1", results, grid, data_root=str(data_root))
    f1 = pd.read_csv(tmp_path / "figures" / "fig1" / "fig1.csv", keep_default_na=False)
    assert f1["depth"].tolist() == depths[:seq]  # the first window
    assert "".join(f1["token"]) == tok.decode(ids[:seq])
    # the figure shows those tokens, in order, each on its depth's colour (one panel: the MoR run)
    [fig] = drawn_figures
    [ax] = fig.axes
    # (a token that starts a wrapped line loses its leading space)
    assert [t.get_text().lstrip() for t in ax.texts] == [tok.lstrip() for tok in f1["token"]]
    colors = {d: {t.get_bbox_patch().get_facecolor() for t, dd in zip(ax.texts, f1["depth"]) if dd == d}
              for d in (1, 2, 3)}
    assert all(len(c) == 1 for c in colors.values()) and len(set().union(*colors.values())) == 3
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["depth 1", "depth 2", "depth 3"]
    w, h = fig.get_size_inches() * 170
    assert png_size(tmp_path / "figures" / "fig1" / "fig1.png") == pytest.approx((w, h), abs=1)
