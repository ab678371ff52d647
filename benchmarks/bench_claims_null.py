"""The real deciding-grid claims under a null: how often the whole verdict machinery says
anything decisive when every true effect is zero.

sharing-costs, mor-beats-recursive-tokens, sequence-worst, balancing-maxvio and
balancing-entropy go through ``mor.claims.evaluate`` (their own predicates, comparisons, the
looks at 3, 6 and 9 seeds and Holm). The runs are simulated: every run of grids/deciding.yaml
at 9 seeds, each NLL, MaxVio and entropy drawn iid, so every comparison has mean exactly 0 and
any "holds" or "contradicted" is wrong. Too slow for a unit test (~0.4 s per table):
tests/test_claims.py and tests/test_stats.py run the same machinery on lighter claims.

    .venv/bin/python benchmarks/bench_claims_null.py --reps 400
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import numpy as np
import pandas as pd

from mor.claims import CLAIMS, evaluate
from mor.grids import load_grid

REPO = Path(__file__).resolve().parent.parent


def template(seeds: int) -> pd.DataFrame:
    grid = load_grid(REPO / "grids" / "deciding.yaml", "local")
    base = [r for r in grid.runs if r.config.train.seed == grid.runs[0].config.train.seed]
    rows = []
    for s in range(seeds):
        for r in base:
            c = dataclasses.replace(r.config, train=dataclasses.replace(r.config.train, seed=s))
            m = c.model
            rows.append({"run_id": c.run_id, "seed": s, "paper_scale": c.paper_scale, "variant": m.variant,
                         "tying": None if m.variant == "vanilla" else m.tying, "num_recursions": m.num_recursions,
                         "reduced": m.reduced, "router_type": m.router.type if m.variant == "mor" else None,
                         "config_json": json.dumps(c.to_dict())})
    return pd.DataFrame(rows)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=400)
    ap.add_argument("--seeds", type=int, default=9)
    ap.add_argument("--rng", type=int, default=0)
    a = ap.parse_args()
    claims = tuple(c for c in CLAIMS if c.grids == ("deciding",))
    df0, rng, wrong, t = template(a.seeds), np.random.default_rng(a.rng), 0, time.time()
    for _ in range(a.reps):
        df = df0.copy()
        df["val_nll"] = 3.72 + rng.normal(0, 0.02, len(df))
        df["max_vio"] = 1.0 + rng.normal(0, 0.5, len(df))
        df["entropy"] = 1.0 + rng.normal(0, 0.2, len(df))
        wrong += int((evaluate({"deciding": df}, claims)["verdict"] != "inconclusive").any())
    se = np.sqrt(0.05 * 0.95 / a.reps)
    print(f"{len(claims)} claims, {a.seeds} seeds, {a.reps} reps: family-wise rate of decisive verdicts "
          f"{wrong / a.reps:.4f} (nominal 0.05, se {se:.4f}); {time.time() - t:.0f} s")


if __name__ == "__main__":
    main()
