"""Training curves: the train-log reader, and the figure + CSV drawn from logs and results.

A made-up grid: two scales; a Recursive config with two seeds, a Vanilla with one, and a
MoR whose log carries its router loss. The CSV must hold exactly what the figure draws.
"""

import json
import os
import shutil
from pathlib import Path

import pandas as pd
import pytest

from mor.reports.curves import caption, curve_table, render_curves
from mor.results import RUN_SCHEMA, write_rows
from mor.train_log import TrainLogError, read_train_log, router_keys

STEPS, TOKENS = 50, 2048


def write_log(path, offset: float, aux: float = 0.0, torn: bool = False):
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"step": s, "loss": 8 - s * 0.05 + offset, "aux_loss": aux * (1 + 1 / s), "lr": 1e-3,
                         "tokens_per_s": 1e4, "tokens_seen": s * TOKENS}) for s in range(1, STEPS + 1)]
    path.write_text("\n".join(lines) + "\n" + ('{"step": 51, "lo' if torn else ""))


def row(run_id, scale, variant, seed, val, label, router=None):
    r = {n: None for n in RUN_SCHEMA.names}
    cfg = {"model": {"scale": scale, "variant": variant, "router": router}, "train": {"seed": seed}}
    r.update(run_id=run_id, grid="g", config_hash=run_id[-6:], git_commit="abc", scale=scale, seed=seed,
             paper_scale={"small": "135M", "medium": "360M"}[scale], variant=variant, label=label, val_nll=val,
             router_type=router, config_json=json.dumps(cfg))
    return r


@pytest.fixture
def grid_files(tmp_path):
    rows = []
    for scale, base in (("small", 0.0), ("medium", -0.5)):
        for seed, off in ((0, 0.0), (1, 0.2)):
            rid = f"{scale}-recursive-s{seed}"
            write_log(tmp_path / "runs" / rid / "train_log.jsonl", base + off, torn=seed == 1)
            rows.append(row(rid, scale, "recursive", seed, 5.5 + base + off, "Cycle Nr=2"))
        rid = f"{scale}-vanilla"
        write_log(tmp_path / "runs" / rid / "train_log.jsonl", base + 0.1)
        rows.append(row(rid, scale, "vanilla", 0, 5.6 + base, "Vanilla"))
        rid = f"{scale}-mor"
        write_log(tmp_path / "runs" / rid / "train_log.jsonl", base - 0.1, aux=0.01)
        rows.append(row(rid, scale, "mor", 0, 5.4 + base, "MoR expert-choice", router="expert_choice"))
    write_rows(tmp_path / "results" / "g.parquet", rows)
    return tmp_path


def test_reader_skips_torn_lines_and_keeps_the_last_record_of_a_step(tmp_path):
    log = tmp_path / "train_log.jsonl"
    write_log(log, 0.0, torn=True)
    log.write_text(log.read_text().replace('{"step": 51, "lo', json.dumps({"step": 50, "loss": 1.0}) + "\n"))
    df = read_train_log(log)
    assert list(df["step"]) == list(range(1, STEPS + 1)) and df["loss"].iloc[-1] == 1.0
    assert router_keys(df) == [] and df["grad_norm"].isna().all()  # absent columns exist, empty
    with pytest.raises(TrainLogError, match="no train log"):
        read_train_log(tmp_path / "missing.jsonl")


def test_curves_fold_seeds_and_mark_val_nll(grid_files):
    curves, val, window = curve_table(grid_files / "results" / "g.parquet", grid_files / "runs", "g")
    assert window == STEPS // 25
    rec = curves[(curves["label"] == "Cycle Nr=2") & (curves["paper_scale"] == "135M") & (curves["metric"] == "loss")]
    assert len(rec) == STEPS and (rec["n_seeds"] == 2).all()
    last = rec.iloc[-1]  # mean of the last `window` steps, seed 0 and seed 1 (+0.2)
    s0 = sum(8 - s * 0.05 for s in range(STEPS - window + 1, STEPS + 1)) / window
    assert last["lo"] == pytest.approx(s0) and last["hi"] == pytest.approx(s0 + 0.2)
    assert last["mean"] == pytest.approx(s0 + 0.1) and last["tokens"] == STEPS * TOKENS
    aux = curves[curves["metric"] == "aux_loss"]
    assert set(aux["label"]) == {"MoR expert-choice"}  # router statistics of MoR runs only
    v = val[(val["label"] == "Cycle Nr=2") & (val["paper_scale"] == "360M")].iloc[0]
    assert (v["mean"], v["lo"], v["hi"], v["n_seeds"], v["tokens"]) == pytest.approx((5.1, 5.0, 5.2, 2, STEPS * TOKENS))


def test_figure_and_its_csv_twin(grid_files):
    out = grid_files / "figures" / "curves" / "g"
    files = render_curves(grid_files / "results" / "g.parquet", grid_files / "runs", "g", out)
    assert sorted(p.name for p in files) == ["curves.csv", "curves.pdf", "curves.png"]
    assert (out / "curves.png").stat().st_size > 20_000
    drawn = pd.read_csv(out / "curves.csv")
    assert set(drawn["metric"]) == {"loss", "aux_loss", "val_nll"}
    assert len(drawn[drawn["metric"] == "loss"]) == 2 * 3 * STEPS  # 2 scales x 3 configs x steps
    assert len(drawn[drawn["metric"] == "val_nll"]) == 6
    assert "figures/curves/g" in caption("g") and "validation NLL" in caption("g")


def test_configurations_sharing_a_label_stay_apart(tmp_path):
    """table10 labels both Nr=2 and Nr=3 Cycle runs "cycle": two curves, each going forward in
    tokens (drawn as one, the line ran from the end of one back to the start of the other)."""
    rows = []
    for nr, off in ((2, 0.0), (3, 0.3)):
        rid = f"small-recursive-nr{nr}"
        write_log(tmp_path / "runs" / rid / "train_log.jsonl", off)
        r = row(rid, "small", "recursive", 0, 5.5 + off, "cycle")
        r["num_recursions"] = nr
        r["config_json"] = json.dumps({"model": {"scale": "small", "num_recursions": nr}, "train": {"seed": 0}})
        rows.append(r)
    write_rows(tmp_path / "results" / "g.parquet", rows)
    curves, val, _ = curve_table(tmp_path / "results" / "g.parquet", tmp_path / "runs", "g")
    loss = curves[curves["metric"] == "loss"]
    assert set(loss["label"]) == {"cycle Nr=2", "cycle Nr=3"} and set(val["label"]) == {"cycle Nr=2", "cycle Nr=3"}
    for _, line in loss.groupby("label"):
        assert len(line) == STEPS and line["tokens"].is_monotonic_increasing and (line["n_seeds"] == 1).all()
    assert val.set_index("label")["mean"].to_dict() == pytest.approx({"cycle Nr=2": 5.5, "cycle Nr=3": 5.8})


def test_a_run_without_log_names_its_file(grid_files):
    (grid_files / "runs" / "small-vanilla" / "train_log.jsonl").unlink()
    with pytest.raises(TrainLogError, match=r"small-vanilla/train_log\.jsonl: no train log"):
        render_curves(grid_files / "results" / "g.parquet", grid_files / "runs", "g", grid_files / "out")


@pytest.mark.slow
@pytest.mark.browser
def test_curves_are_in_the_report_under_training_curves(tmp_path, data_root):
    """table10's workflow (tiny runs, two seeds) with --report: Chromium opens the report's
    "1 Training curves" section (second in the menu, after the claims; mor.reports.landing),
    whose one entry figures/curves/table10 shows at once, and decodes curves.png at its own width."""
    import struct

    from helpers.browser import Browser
    from helpers.report_page import CLICK, CURVES_CATEGORY, DECODED_PNGS, GRID, LINK, ROW, SHARING, VIEW, chromium
    from helpers.workflow import snakemake

    browser = chromium()
    grids = tmp_path / "grids"
    grids.mkdir()
    (grids / "table10.yaml").write_text(GRID)
    report = tmp_path / "report.html"
    snakemake("tables/table10", "--report", str(report), "--report-after-run", "--directory", str(tmp_path),
              "--config", f"grids_dir={grids}", f"data_root={data_root}")
    png = (tmp_path / "figures" / "curves" / "table10" / "curves.png").read_bytes()
    drawn = pd.read_csv(tmp_path / "figures" / "curves" / "table10" / "curves.csv")
    assert set(drawn["metric"]) == {"loss", "val_nll"} and drawn["n_seeds"].max() == 2
    shot = tmp_path / "curves-shot.png"

    async def read_report(page):
        section = LINK.replace("NAME", CURVES_CATEGORY)
        await page.open(report.as_uri(), ready=f"typeof categories == 'object' && {section}")
        assert sorted(await page.js("Object.keys(categories)")) == [CURVES_CATEGORY, SHARING]
        await page.js(CLICK.replace("NAME", CURVES_CATEGORY))  # one entry: the section opens on it
        await page.wait_for(ROW.replace("NAME", "curves.png"))
        await page.js(VIEW.replace("NAME", "curves.png"))
        await page.wait_for(DECODED_PNGS + ".length > 0")
        widths = await page.js(DECODED_PNGS + ".map(i => i.naturalWidth)")
        await page.screenshot(shot)
        return widths

    with Browser(browser) as b:
        widths = b.run(read_report)
    assert "training curves of every run of grids/table10.yaml" in report.read_text()  # the caption
    assert widths == [struct.unpack(">I", png[16:20])[0]]
    assert shot.stat().st_size > 20_000
    if os.environ.get("MOR_REPORT_SHOT"):
        Path(os.environ["MOR_REPORT_SHOT"]).mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, Path(os.environ["MOR_REPORT_SHOT"]) / shot.name)


@pytest.mark.parametrize("router, key", [(None, None), ("expert_choice", "sampling_accuracy"),
                                         ("token_choice", "max_vio")])
def test_training_logs_router_statistics_per_step(data_root, tmp_path, router, key):
    from helpers.tiny import VOCAB, tiny_run
    from mor.config import RouterConfig
    from mor.train.trainer import Trainer

    kw = dict(variant="mor", nr=2, router=RouterConfig(type=router)) if router else {}
    Trainer(tiny_run(steps=3, **kw), tmp_path / "r", data_root / "tokens" / f"train-bpe-{VOCAB}.npy", VOCAB,
            progress=False).fit()
    log = read_train_log(tmp_path / "r" / "train_log.jsonl")
    stats = {k for k in ("sampling_accuracy", "max_vio") if k in log and log[k].notna().all()}
    assert stats == ({key} if key else set())
    if key == "sampling_accuracy":
        assert log[key].between(0, 1).all()
    if key == "max_vio":
        assert (log[key] >= 0).all()
