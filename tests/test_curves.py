"""Training curves: the train-log reader, and the figure + CSV drawn from logs and results.

A made-up grid: two scales; a Recursive config with two seeds, a Vanilla with one, and a
MoR whose log carries its router loss. The CSV must hold exactly what the figure draws.
"""

import json

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
            write_log(tmp_path / "runs" / "g" / rid / "train_log.jsonl", base + off, torn=seed == 1)
            rows.append(row(rid, scale, "recursive", seed, 5.5 + base + off, "Cycle Nr=2"))
        rid = f"{scale}-vanilla"
        write_log(tmp_path / "runs" / "g" / rid / "train_log.jsonl", base + 0.1)
        rows.append(row(rid, scale, "vanilla", 0, 5.6 + base, "Vanilla"))
        rid = f"{scale}-mor"
        write_log(tmp_path / "runs" / "g" / rid / "train_log.jsonl", base - 0.1, aux=0.01)
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


def test_a_run_without_log_names_its_file(grid_files):
    (grid_files / "runs" / "g" / "small-vanilla" / "train_log.jsonl").unlink()
    with pytest.raises(TrainLogError, match=r"small-vanilla/train_log\.jsonl: no train log"):
        render_curves(grid_files / "results" / "g.parquet", grid_files / "runs", "g", grid_files / "out")
