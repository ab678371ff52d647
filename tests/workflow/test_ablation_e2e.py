"""Tables 13 and 14 from real CPU runs: the grids' `ci` rows through the local profile."""

from __future__ import annotations

import json

import pandas as pd
import pyarrow.parquet as pq
import pytest

from helpers.paths import REPO
from helpers.workflow import snakemake


@pytest.mark.slow
def test_router_tables_13_and_14_end_to_end(tmp_path, data_root):
    snakemake("tables/table13", "tables/table14", "--directory", str(tmp_path),
              "--config", f"grids_dir={REPO / 'grids'}", f"data_root={data_root}", "tags=ci")

    ec = pq.read_table(tmp_path / "results" / "table13.parquet").to_pylist()
    assert {r["router_type"] for r in ec} == {"expert_choice"} and len(ec) == 2
    for r in ec:
        assert 0 <= r["dead_token_ratio"] <= 2 / 3 and 0 <= r["sampling_accuracy"] <= 1
        assert 1 <= r["mean_depth"] <= 3 and sum(r["depth_histogram"]) > 0
        assert r["max_vio"] is None
        assert len(json.loads(r["router_output_hist"])) == 3  # Fig. 5b material, per recursion
        assert len(r["sample_token_depths"]) == len(r["sample_token_ids"]) > 0  # Table 17 material
    t13 = pd.read_csv(tmp_path / "tables" / "table13" / "table13.csv")
    assert set(t13["aux"]) == {"aux_router", "aux_loss"}
    assert t13["Sampling acc"].notna().all()

    tc = pq.read_table(tmp_path / "results" / "table14.parquet").to_pylist()
    assert {r["router_type"] for r in tc} == {"token_choice"} and len(tc) == 2
    for r in tc:
        assert r["max_vio"] >= 0 and 0 < r["entropy"] <= 1.0987  # log 3
        assert r["dead_token_ratio"] is None
    t14 = pd.read_csv(tmp_path / "tables" / "table14" / "table14.csv")
    assert set(t14["balancing"]) == {"loss", "loss_free"}
    assert {"MaxVio", "Entropy", "NLL (top-k, sees future)", "NLL (causal)"} <= set(t14.columns)
