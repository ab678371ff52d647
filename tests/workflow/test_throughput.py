"""The throughput job (mor.engine.job), its workflow wiring and the Figure 4a report.

The report is checked on hand-built result rows (parquet in, numbers out); the job on its
pure parts (protocol, baseline, columns); the wiring by a dry run of the paper grid and,
end to end, a 2-run tiny grid through the local profile (marked slow: ~1 min).
"""

from __future__ import annotations

import dataclasses

import json

import pandas as pd
import pyarrow.parquet as pq
import pytest

from mor.config import ModelConfig, RouterConfig, RunConfig
from mor.engine.job import throughput_columns
from mor.throughput_protocol import THROUGHPUT_FILE, baseline, load_protocol
from mor.reports import render
from mor.reports.fig4a import pareto, throughput_table
from mor.results import write_rows
from helpers.paths import REPO
from helpers.tiny import _row
from helpers.workflow import TINY_LOCAL_MODE, job_counts, snakemake


def test_protocol_has_both_modes_and_app_e_values():
    cluster, local = load_protocol("cluster"), load_protocol("local")
    assert (cluster["gen_mean"], cluster["warmup_tokens"], cluster["fixed_batch"], cluster["requests"]) == (256, 100, 32, 1000)
    assert cluster["memory_gib"] == "device" and isinstance(local["memory_gib"], float)
    assert local["gen_mean"] < cluster["gen_mean"]
    with pytest.raises(ValueError, match="no throughput protocol"):
        load_protocol("nonexistent")


def test_baseline_is_the_vanilla_of_the_same_effective_depth():
    mor = lambda nr: ModelConfig(scale="360M", variant="mor", tying="middle_cycle", num_recursions=nr)  # noqa: E731
    assert baseline(mor(2)) == baseline(mor(3)) == ModelConfig(scale="360M", variant="vanilla")
    # the authors' depth rule (issue 55): 1 + floor(30 / 4) x 4 + 1 = 30 layers unless the grid sets
    # App. E's 34 (fig4a, table3 do), and the baseline is the Vanilla of that depth
    assert baseline(mor(4)).layers == 30 and baseline(mor(4)).variant == "vanilla"
    deep = dataclasses.replace(mor(4), layers=34)
    assert baseline(deep).layers == 34 and baseline(deep).variant == "vanilla"  # App. E's 34-layer Vanilla
    assert baseline(ModelConfig(scale="360M", variant="vanilla")) == ModelConfig(scale="360M", variant="vanilla")


def _measurement(run_id, tps_fixed, tps_max, batch_max=32):
    setting = lambda tps, b: {"batch": b, "tokens": 100, "steps": 10, "forward_s": 100 / tps,  # noqa: E731
                              "wall_s": 110 / tps, "tokens_per_s": tps, "tokens_per_s_wall": tps / 1.1, "occupancy": 0.9,
                              "row_fill": 0.97, "passes_per_token": 2.1 / b}
    return {"run_id": run_id, "max_batch": 400, "flops_speedup": 1.5, "flops_speedup_realised": 1.9,
            "baseline_layers": 34, "settings": {"fixed": setting(tps_fixed, 32), "max": setting(tps_max, batch_max)}}


def test_throughput_columns_read_the_job_file(tmp_path):
    assert set(throughput_columns(tmp_path / "absent.json", "r")).issubset({f.name for f in _schema()})
    assert all(v is None for v in throughput_columns(tmp_path / "absent.json", "r").values())
    f = tmp_path / THROUGHPUT_FILE
    f.write_text(json.dumps(_measurement("r", 100.0, 150.0, batch_max=45)))
    cols = throughput_columns(f, "r")
    assert cols["decode_tokens_per_s_fixed"] == 100.0 and cols["decode_batch_max"] == 45
    assert cols["decode_tokens_per_s_wall_max"] == pytest.approx(150 / 1.1) and cols["decode_flops_speedup"] == 1.5
    assert cols["decode_flops_speedup_realised"] == 1.9 and cols["decode_baseline_layers"] == 34  # same-depth Vanilla
    assert cols["decode_row_fill_fixed"] == 0.97 and cols["decode_passes_per_token_max"] == pytest.approx(2.1 / 45)
    with pytest.raises(ValueError, match="belongs to run"):
        throughput_columns(f, "other")


def _schema():
    from mor.results import RUN_SCHEMA

    return RUN_SCHEMA


def _fig4a_rows():
    """Vanilla (8 layers), Vanilla (10 layers), MoR-2/3 (8 effective), MoR-4 (10 effective)."""
    ec = RouterConfig(type="expert_choice", func="sigmoid", alpha=0.1, arch="linear", aux="aux_loss")
    mk = lambda **kw: RunConfig(grid="fig4a", paper_scale="360M", model=ModelConfig(scale="medium", **kw))  # noqa: E731
    spec = [  # run, effective layers, val_nll, tok/s fixed, tok/s max, batch max
        (mk(variant="vanilla"), 8, 5.6, 100.0, 100.0, 32),
        (mk(variant="vanilla", layers=10), 10, 5.5, 80.0, 80.0, 32),
        (mk(variant="mor", tying="middle_cycle", num_recursions=2, router=ec), 8, 5.3, 120.0, 150.0, 42),
        (mk(variant="mor", tying="middle_cycle", num_recursions=3, router=ec), 8, 5.4, 140.0, 180.0, 48),
        (mk(variant="mor", tying="middle_cycle", num_recursions=4, router=ec), 10, 5.45, 160.0, 200.0, 51),
    ]
    rows = []
    for run, layers, nll, f, m, b in spec:
        van = run.model.variant == "vanilla"
        cols = {f"decode_{k}": v for k, v in dict(
            max_batch=b * 10, batch_max=b, flops_speedup=1.0 if van else 1.5,
            flops_speedup_realised=1.0 if van else 1.6, baseline_layers=layers,
            tokens_per_s_fixed=f, tokens_per_s_wall_fixed=f / 2, occupancy_fixed=0.95,
            row_fill_fixed=0.97, passes_per_token_fixed=0.06,
            tokens_per_s_max=m, tokens_per_s_wall_max=m / 2, occupancy_max=0.9).items()}
        label = "Vanilla" if van else f"MoR-{run.model.num_recursions}"
        causal = nll if van else nll + 0.1  # causal routing scores worse than the top-k it was trained with
        rows.append({**_row(run, val_nll=nll, val_nll_causal=causal, label=label, **cols), "effective_layers": layers})
    return rows


def test_fig4a_normalises_each_model_to_the_vanilla_of_its_depth(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_rows(tmp_path / "r.parquet", _fig4a_rows())
    grid = tmp_path / "fig4a.yaml"
    grid.write_text((REPO / "grids" / "fig4a.yaml").read_text())
    files = render("tables/fig4a", str(tmp_path / "r.parquet"), str(grid))
    assert [f.name for f in files] == ["fig4a.csv", "fig4a.html", "fig4a.md", "fig4a.tex"]
    t = pd.read_csv(files[0]).set_index("model")
    assert t.loc["MoR-2", "rel_fixed"] == pytest.approx(1.2) and t.loc["MoR-3", "rel_max"] == pytest.approx(1.8)
    assert t.loc["MoR-4", "rel_fixed"] == pytest.approx(2.0)  # against the 10-layer Vanilla (80 tok/s), not 100
    assert t.loc["MoR-4", "rel_wall_max"] == pytest.approx(2.5)
    assert t.loc["MoR-4", "measured_over_predicted"] == pytest.approx(2.0 / 1.6)  # against the kept shares' prediction
    assert t.loc["MoR-4", "measured_over_design"] == pytest.approx(2.0 / 1.5)
    assert t.loc["MoR-4", "val_nll_causal"] == pytest.approx(5.55) and t.loc["MoR-4", "baseline_layers"] == 10
    assert t.loc["MoR-2", "row_fill_fixed"] == 0.97 and t.loc["MoR-2", "passes_per_token_fixed"] == 0.06
    assert list(t.loc[["MoR-2", "MoR-3", "MoR-4"], "paper_batch_max"]) == [42, 48, 51]
    assert sorted(t.loc["Vanilla", "rel_fixed"]) == [1.0, 1.0]
    assert "up to about 2x" in files[1].read_text()
    fig = render("figures/fig4a", str(tmp_path / "r.parquet"), str(grid))
    assert {f.suffix for f in fig} == {".png", ".pdf", ".csv"}


def test_fig4a_fails_without_a_same_depth_vanilla_or_measurements(tmp_path):
    rows = _fig4a_rows()
    df = pd.DataFrame([r for r in rows if not (r["variant"] == "vanilla" and r["effective_layers"] == 10)])
    with pytest.raises(ValueError, match="effective depth 10"):
        throughput_table(df)
    with pytest.raises(ValueError, match="no run has throughput"):
        throughput_table(pd.DataFrame(rows).assign(decode_tokens_per_s_fixed=None))


def test_pareto_front_keeps_only_undominated_points():
    pts = [(1.0, 5.6), (1.2, 5.3), (1.4, 5.4), (1.1, 5.5), (2.0, 5.45)]
    assert pareto(pts) == [(1.2, 5.3), (1.4, 5.4), (2.0, 5.45)]  # (1.0, 5.6), (1.1, 5.5) are beaten by (1.2, 5.3)


def test_dry_run_of_fig4a_has_a_throughput_job_per_run_before_its_eval(tmp_path):
    out = snakemake("figures/fig4a", "tables/fig4a", "-n", "--nolock", "--directory", str(tmp_path),
                    "--config", f"grids_dir={REPO / 'grids'}", f"data_root={tmp_path / 'data'}")
    counts = job_counts(out.stdout + out.stderr)
    assert counts == {"corpus": 1, "tokenizer": 1, "tokens": 2, "train": 5, "throughput": 5, "eval": 5, "row": 5,
                      "collect": 1, "figure": 1, "table": 1,  # no lm-eval locally: the figure needs NLL only
                      "curves": 1}  # the grid's training curves come with each artifact (workflows/rules/report.smk)
    assert (out.stdout + out.stderr).count("job_kind=throughput") == 5  # the Slurm preset kind it asks for


def test_local_throughput_jobs_reserve_every_core_but_time_with_the_configured_threads(tmp_path):
    """Decoding is timed alone: the local profile raises a throughput job's threads to all of
    --cores (so Snakemake starts nothing beside it), while torch gets config `threads` (1)."""
    import re

    import yaml

    cores = yaml.safe_load((REPO / "local" / "config.yaml").read_text())["cores"]
    out = snakemake("figures/fig4a", "-n", "-p", "--nolock", "--directory", str(tmp_path),
                    "--config", f"grids_dir={REPO / 'grids'}", f"data_root={tmp_path / 'data'}")
    text = out.stdout + out.stderr
    blocks = {kind: [b for b in re.split(r"\n(?=\[)", text) if f"rule {kind}:" in b] for kind in ("throughput", "train")}
    assert len(blocks["throughput"]) == 5 and len(blocks["train"]) == 5
    assert all(f"threads: {cores}" in b and "--threads 1 " in b for b in blocks["throughput"])
    assert not any(f"threads: {cores}" in b for b in blocks["train"])  # training keeps sharing the cores


E2E_GRID = """
name: tput
artifacts: [figures/fig4a, tables/fig4a]
defaults:
  data: {source: django-docs, tokenizer: bpe-4096}
runs:
  - name: vanilla
    set: {model.variant: vanilla}
    axes: {model.scale: [135M]}
  - name: mor
    set: {model.variant: mor, model.tying: middle_cycle, model.num_recursions: 2,
          model.router: {type: expert_choice, aux: aux_loss}}
    axes: {model.scale: [135M]}
""" + TINY_LOCAL_MODE


@pytest.mark.slow
def test_throughput_rows_and_fig4a_end_to_end(tmp_path, data_root):
    grids = tmp_path / "grids"
    grids.mkdir()
    (grids / "tput.yaml").write_text(E2E_GRID)
    snakemake("figures/fig4a", "tables/fig4a", "--directory", str(tmp_path), "--config", f"grids_dir={grids}",
              f"data_root={data_root}")
    rows = {r["variant"]: r for r in pq.read_table(tmp_path / "results" / "tput.parquet").to_pylist()}
    for r in rows.values():
        assert r["decode_tokens_per_s_fixed"] > 0 and r["decode_tokens_per_s_wall_max"] > 0
        assert 0 < r["decode_occupancy_fixed"] <= 1 and r["decode_max_batch"] > 0
    assert rows["vanilla"]["decode_flops_speedup"] == pytest.approx(1.0)
    assert rows["mor"]["decode_flops_speedup"] > 1.0 and rows["mor"]["decode_batch_max"] > 32
    assert (tmp_path / "figures" / "fig4a" / "fig4a.png").exists() and (tmp_path / "tables" / "fig4a" / "fig4a.md").exists()


def test_measure_reports_the_engines_batching(monkeypatch):
    """The job's measurement through the engine: rows per shared-block pass as a fraction of
    the batch, block passes per generated token, and the recursion shares the routers kept."""
    import torch

    from mor.config import load_scales
    from mor.engine import Request
    from mor.engine.job import measure
    from mor.model.transformer import build_model

    torch.manual_seed(0)
    cfg = ModelConfig(scale="tiny", variant="mor", tying="middle_cycle", num_recursions=3,
                      router=RouterConfig(aux="aux_router"))
    model = build_model(cfg, load_scales()["tiny"], 50).eval()
    reqs = [Request(i, [i % 50], 3 + i % 5) for i in range(24)]
    import weakref

    from mor.engine.cache import PagedCache

    import gc

    pools, init = [], PagedCache.__init__
    monkeypatch.setattr(PagedCache, "__init__", lambda self, *a, **k: (init(self, *a, **k), pools.append(weakref.ref(self)))[0])
    gc.disable()  # freed by reference counts, not by a collection that happened to run
    try:
        m = measure(model, reqs, 4, 16, 2, "cpu", torch.float32)
    finally:
        gc.enable()
    # the engine's KV pool is gone when measure returns: the throughput job's second setting
    # asks for the same memory (on a GPU most of it)
    assert len(pools) == 1 and pools[0]() is None
    assert m["tokens"] == sum(r.max_new_tokens for r in reqs) and m["max_live"] == 8
    assert 0 < m["row_fill"] <= 1 and m["passes_per_token"] >= sum(m["recursion_share"]) / 4 * 0.9
    assert m["recursion_share"][0] == 1.0 and m["block_passes"] >= m["mixed_depth_passes"]
    # one window (requests waiting) for rows/pass, passes/token and tokens/s; the whole run beside
    assert 0 < m["window_tokens"] < m["tokens"] and 0 < m["window_forward_s"] < m["forward_s"]
    assert m["tokens_per_s"] == pytest.approx(m["window_tokens"] / m["window_forward_s"])
    assert m["tokens_per_s_run"] == pytest.approx(m["tokens"] / m["forward_s"])
    assert m["row_fill"] >= m["row_fill_run"]  # the drain at the end runs partial passes
    # with a memory budget the live sequences are what flops.max_batch fits in it, not 2 x batch
    from mor.flops import max_batch, model_bytes

    budget = model_bytes(cfg, model.shape, 50, 4) + 100_000  # ~12 sequences of KV at this size
    fits = max_batch(cfg, model.shape, 50, 16, budget, 4, block_size=16)  # the engine's CPU blocks, whole
    assert 2 * 4 < fits < max_batch(cfg, model.shape, 50, 16, budget, 4) < len(reqs)  # the budget bounds it
    assert measure(model, reqs, 4, 16, 0, "cpu", torch.float32, memory_bytes=budget)["max_live"] == fits


def test_fig4a_leaves_a_missing_causal_nll_a_gap(tmp_path, monkeypatch):
    """A MoR run without val_nll_causal gets an empty NLL in the table and is named, not drawn,
    in the figure: its top-k NLL is never relabelled as the causal one; a Vanilla's one NLL is
    causal. A run without a waiting window (its window tokens/s null) keeps its whole-run
    speed-up and shows a gap for the window's."""
    rows = _fig4a_rows()
    for r in rows:
        if r["label"] == "MoR-3":
            r["val_nll_causal"] = None
        if r["label"] == "MoR-2":
            r["decode_tokens_per_s_fixed"] = None
        r["decode_tokens_per_s_run_fixed"] = r["decode_tokens_per_s_wall_fixed"] * 1.5
        r["decode_row_fill_run_fixed"] = 0.9
    for r in rows:
        if r["variant"] == "vanilla":
            r["val_nll_causal"] = None
    t = throughput_table(pd.DataFrame(rows)).set_index("model")
    assert pd.isna(t.loc["MoR-3", "val_nll_causal"]) and t.loc["MoR-3", "val_nll"] == 5.4
    assert sorted(t.loc["Vanilla", "val_nll_causal"]) == [5.5, 5.6]
    assert pd.isna(t.loc["MoR-2", "rel_fixed"]) and t.loc["MoR-2", "rel_run_fixed"] == pytest.approx(1.2)
    assert t.loc["MoR-2", "row_fill_run_fixed"] == 0.9
    monkeypatch.chdir(tmp_path)
    write_rows(tmp_path / "r.parquet", rows)
    grid = tmp_path / "fig4a.yaml"
    grid.write_text((REPO / "grids" / "fig4a.yaml").read_text())
    texts = []
    import matplotlib.axes

    real = matplotlib.axes.Axes.text
    monkeypatch.setattr(matplotlib.axes.Axes, "text", lambda self, *a, **k: (texts.append(a[2]), real(self, *a, **k))[1])
    render("figures/fig4a", str(tmp_path / "r.parquet"), str(grid))
    assert any("no causal NLL" in x and "MoR-3" in x for x in texts)


def test_realised_share_prediction_covers_both_routers():
    """decode_flops_per_token at given recursion shares: the design shares reproduce the design
    prediction for expert- and token-choice, and fewer tokens deep cost fewer FLOPs for both
    (the job's flops_speedup_realised is no longer the design number under token-choice)."""
    from mor.config import load_scales
    from mor.flops import decode_flops_per_token

    s = load_scales()["360M"]
    for router in (RouterConfig(type="expert_choice"), RouterConfig(type="token_choice", func="softmax", alpha=1.0)):
        cfg = ModelConfig(scale="360M", variant="mor", tying="middle_cycle", num_recursions=3, router=router)
        design = decode_flops_per_token(cfg, s, 49152, 128)
        assert decode_flops_per_token(cfg, s, 49152, 128, shares=(1.0, 2 / 3, 1 / 3)) == pytest.approx(design)
        assert decode_flops_per_token(cfg, s, 49152, 128, shares=(1.0, 0.5, 0.2)) < design
