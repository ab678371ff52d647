"""What the Snakemake report says under each table and figure (``snakemake ... --report``).

Each artifact belongs to a paper section (its report category) and to the claims that rest
on its grid (``mor.claims.CLAIMS``). The caption states those claims, their local verdicts
from ``tables/claims/claims.csv``, the number of runs and seeds behind the artifact and the
commits that made them. It is computed when the report is rendered, from the files on disk,
so it is never a Snakemake param (a param would re-run the report jobs whenever a verdict
changed). ``workflows/report/artifact.rst`` calls ``Captions.caption``.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from mor.claims import CLAIMS
from mor.layout import RESULTS, grid_results

SECTIONS = {
    "tables/table3": "3.1 Main results (the released runs)",
    "tables/table9": "5.1 Compute-optimal scaling (isoFLOP)", "figures/fig5a": "5.1 Compute-optimal scaling (isoFLOP)",
    "tables/table10": "App. F Parameter sharing", "figures/fig6": "App. F Parameter sharing",
    "figures/fig4b": "App. F Parameter sharing", "tables/table11": "App. F Parameter sharing",
    "tables/table12": "App. F Parameter sharing", "tables/real_weights": "App. F Parameter sharing",
    "tables/table13": "App. G Routing strategies", "tables/table14": "App. G Routing strategies",
    "tables/table15": "App. H KV caching", "tables/table16": "App. H KV caching",
    "figures/fig7": "App. H KV caching", "figures/fig8": "App. H KV caching",
    "figures/fig4a": "App. E Decoding throughput", "tables/fig4a": "App. E Decoding throughput",
    "figures/fig1": "5.2 Routing analysis", "tables/table17": "5.2 Routing analysis",
    "figures/fig5b": "5.2 Routing analysis", "figures/fig5c": "5.3 Test-time scaling",
    "tables/claims": "0 The paper's claims, checked", "tables/deciding": "0 The paper's claims, checked",
}


def section(artifact: str) -> str:
    return SECTIONS.get(artifact, "Other")


class Captions:
    """Lazily read captions: ``artifact_grid`` maps artifact -> grid name."""

    def __init__(self, artifact_grid: dict[str, str], root: Path = Path("."), grids_dir: Path | None = None):
        self.artifact_grid, self.root = dict(artifact_grid), Path(root)
        self.grids_dir = Path(grids_dir) if grids_dir is not None else self.root / "grids"

    def caption(self, artifact: str) -> str:
        lines = [f"**{artifact}** ({section(artifact)})."]
        if artifact == "tables/claims":
            return "\n\n".join(lines + ["One row per qualitative claim of the paper: the effect over seeds, its 95% "
                                        "interval and the verdict (see the table's note); claims_forest.png draws each "
                                        "interval against 0 (or its equivalence margin), coloured by verdict."]) + "\n"
        grid = self.artifact_grid.get(artifact)
        verdicts = self._verdicts()
        for c in (c for c in CLAIMS if grid in c.grids):
            v = verdicts.get(c.id, "not checked yet")
            lines.append(f"Paper: {c.statement} ({c.evidence}). Local verdict: **{v}**.")
        lines.append(self._provenance(grid))
        return "\n\n".join(lines) + "\n"

    def _verdicts(self) -> dict[str, str]:
        p = self.root / "tables" / "claims" / "claims.csv"
        if not p.exists():
            return {}
        t = pd.read_csv(p)
        return {r["claim"]: f"{r['verdict']} (n = {int(r['n seeds'])} seeds)" for _, r in t.iterrows()}

    def _provenance(self, grid: str | None) -> str:
        if grid is None:
            return ""
        p = grid_results(self.root / RESULTS, grid)
        if not p.exists():
            return f"Grid {grid}: results not built."
        from mor.results import read_frame  # the one reader of result parquet (schema-checked)

        df = read_frame(p)
        commits = ", ".join(sorted(c[:12] for c in df["git_commit"].unique()))
        from mor.reports.common import evidence_note

        modes = sorted(df["mode"].unique())
        grid_file = self.grids_dir / f"{grid}.yaml"
        evidence = " ".join(evidence_note(grid_file, m) for m in modes) if grid_file.exists() else ""
        return (f"Grid grids/{grid}.yaml, mode {', '.join(modes)}: {len(df)} runs, "
                f"seeds {sorted(int(s) for s in df['seed'].unique())}, commit(s) {commits}. {evidence}").rstrip()
