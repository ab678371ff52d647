"""An edit of grids/claims/claims.yaml that the planning does not read replans nothing: the
rounds (checkpoint `seeding`) depend on a digest of what they plan with (mor.claims.plan_inputs), not on the
file, so a `reanalyses` record, a comment or the other mode's budget redraws tables/claims alone
(it draws the file), while this mode's budget replans. Real Snakemake on a grids folder with no
grid: round 0 plans with no runs and stops, so the built state is two short jobs, no training."""

from __future__ import annotations

import yaml

from helpers.workflow import plan, snakemake

from mor.claims import SPEC_FILE

REANALYSIS = """
# a note on an earlier re-analysis: it changes no test, margin or design
reanalyses:
  - {mode: local, date: "2026-12-05", issues: [1], why: "a note", runs: "the pilot's seeds",
     commit_before: abc1234, verdicts_before: {aux-separates: inconclusive}}
"""


def test_an_edit_the_planning_does_not_read_replans_nothing(tmp_path):
    grids, data = tmp_path / "grids", tmp_path / "data"
    (grids / "claims").mkdir(parents=True)
    data.mkdir()
    spec_file = grids / "claims" / "claims.yaml"
    spec = yaml.safe_load(SPEC_FILE.read_text())
    spec.pop("reanalyses", None)
    spec_file.write_text(yaml.safe_dump(spec, sort_keys=False))
    snakemake("tables/claims", "--directory", str(tmp_path), "--config", f"grids_dir={grids}", f"data_root={data}")
    assert plan(tmp_path, grids, data, "tables/claims") == {}

    spec_file.write_text(spec_file.read_text() + REANALYSIS)  # the table shows it: that job alone
    assert plan(tmp_path, grids, data, "tables/claims") == {"claims": 1}

    spec["design"]["budget"]["cluster_gpu_hours"] += 1  # the other mode's: this mode's rounds stand
    spec_file.write_text(yaml.safe_dump(spec, sort_keys=False) + REANALYSIS)
    assert plan(tmp_path, grids, data, "tables/claims") == {"claims": 1}

    spec["design"]["budget"]["local_cpu_minutes"] += 1  # what a round plans with: the rounds again
    spec_file.write_text(yaml.safe_dump(spec, sort_keys=False) + REANALYSIS)
    assert plan(tmp_path, grids, data, "tables/claims") == {"seeding": 1, "claims": 1}
