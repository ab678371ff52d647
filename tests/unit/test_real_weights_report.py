"""tables/real_weights (mor.reports.real_weights) from a results file written here."""

import json

import pandas as pd
import pytest

from helpers.paths import REPO
from mor.results import RUN_SCHEMA, write_rows

GRID = REPO / "grids" / "real_weights.yaml"
TASKS = ("mor_lambada", "mor_hellaswag", "mor_piqa", "mor_winogrande", "mor_arc_easy", "mor_arc_challenge")


def _row(run_id, label, variant, nll, tying="middle_cycle", nr=1, **kw):
    r = {n: None for n in RUN_SCHEMA.names}
    cfg = {"model": {"tied_init": "stepwise", "init_checkpoint": "smollm2-135m-instruct"}}
    r.update(run_id=run_id, grid="real_weights", config_hash=run_id, git_commit="abc", scale="135M-smollm2", seed=0,
             label=label, variant=variant, tying=tying, num_recursions=nr, unique_layers=30, effective_layers=30,
             n_params=1, val_nll=nll, val_nll_causal=nll, val_tokens=4096, config_json=json.dumps(cfg), **kw)
    return r


@pytest.fixture
def results(tmp_path):
    acc = dict(zip(TASKS, (0.30, 0.40, 0.65, 0.52, 0.60, 0.28)))
    se = {t: 0.05 for t in TASKS}
    start = _row("start", "SmolLM2-135M-Instruct (Q4_1)", "vanilla", 3.2, tying=None, accuracy=acc, accuracy_stderr=se,
                 accuracy_norm={"mor_hellaswag": 0.42}, accuracy_norm_stderr={"mor_hellaswag": 0.05},
                 avg_accuracy=sum(acc.values()) / 6, avg_accuracy_stderr=0.02)
    rows = [start, _row("mc2", "middle_cycle (step 0)", "recursive", 9.1, nr=2),
            _row("c2", "cycle (step 0)", "recursive", 11.5, tying="cycle", nr=2)]
    out = tmp_path / "real_weights.parquet"
    write_rows(out, rows)
    return out


def test_accuracy_beside_published_and_step0_nlls(results, tmp_path):
    from mor.reports.real_weights import render

    files = render(results, GRID, tmp_path / "tables" / "real_weights", "local")
    names = {f.name for f in files}
    assert {"real_weights.md", "accuracy.csv", "step0.csv"} <= names
    acc = pd.read_csv(tmp_path / "tables" / "real_weights" / "accuracy.csv").set_index("Task")
    assert acc.loc["HellaSwag", "published"] == 0.409 and acc.loc["PIQA", "published"] == 0.663
    arc = acc.loc["ARC (average of Easy, Challenge)"]
    assert arc["acc"] == pytest.approx(0.44) and arc["published"] == 0.373
    assert arc["acc stderr"] == pytest.approx((2 * 0.05 ** 2) ** 0.5 / 2)
    assert pd.isna(acc.loc["LAMBADA", "published"])  # the card publishes none
    assert acc.loc["Mean of the six tasks", "acc"] == pytest.approx(sum((0.30, 0.40, 0.65, 0.52, 0.60, 0.28)) / 6)
    step0 = pd.read_csv(tmp_path / "tables" / "real_weights" / "step0.csv")
    assert list(step0["Step-0 NLL"]) == [3.2, 11.5, 9.1]  # the start checkpoint first, then by Nr and tying
    md = (tmp_path / "tables" / "real_weights" / "real_weights.md").read_text()
    assert "HuggingFaceTB/SmolLM2-135M" in md and "Q4_1" in md and "Evidence: demonstration" in md
