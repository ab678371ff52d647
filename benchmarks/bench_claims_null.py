"""The whole claims machinery under a global null, per noise model: how often the real rounds
(``mor.claims.seeding.next_round``: the predicates on simulated parquet-shaped frames, the
shipped design with its looks, the local family and Holm, the cost-per-decision planner, the
real local budget and the real grids' run ids) end with any "holds" or "contradicted" when
every true effect is zero.

The frames, grids and rounds are those of tests/unit/test_null_adaptive.py (imported from it, so
the benchmark and the suite's test cannot drift apart); only the noise differs:

    homoscedastic   every run's NLL, MaxVio, entropy and router histogram mean with one sd
    per-variant     each block's sd drawn once per family from 0.5x-2x (heteroscedastic pairs)
    log-normal      skewed noise: sd x (exp(Z) - e^0.5) / sqrt((e - 1) e), mean 0, same sd
    seed-offsets    a per-seed offset shared by the runs of a seed with loadings 0.5-1.5 per
                    block, so it only partly cancels in a paired difference

    .venv/bin/python benchmarks/bench_claims_null.py --reps 2000 --models homoscedastic
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))  # the helpers package
sys.path.insert(0, str(REPO / "tests" / "unit"))

import test_null_adaptive as T  # noqa: E402

MODELS = ("homoscedastic", "per-variant", "log-normal", "seed-offsets")


def _noise(rng, model: str, size: int = 1) -> np.ndarray:
    z = rng.standard_normal(size)
    if model == "log-normal":
        return (np.exp(z) - math.exp(0.5)) / math.sqrt((math.e - 1) * math.e)
    return z


def draw(rng, model: str) -> dict[str, pd.DataFrame]:
    """Every run of deciding and fig5c at the last look, every comparison's true mean 0."""
    frames = {}
    scale, loading = {}, {}
    for g in T.GRIDS:
        static = T._static(g, "local")
        seeds = sorted({row["seed"] for row, _ in static})
        common = {s: (T.SEED_SD * rng.standard_normal() if model == "seed-offsets" else 0.0) for s in seeds}
        rows = []
        for fixed, m in static:
            key = (g, m.variant, m.router.type if m.variant == "mor" else None)  # one law per kind of run
            if key not in scale:
                scale[key] = float(np.exp(rng.uniform(math.log(0.5), math.log(2.0)))) if model == "per-variant" else 1.0
                loading[key] = float(rng.uniform(0.5, 1.5)) if model == "seed-offsets" else 1.0
            sd, off = scale[key], loading[key] * common[fixed["seed"]]
            row = {**fixed, "val_nll": T.NLL + off + sd * T.NLL_SD * float(_noise(rng, model)[0]), "max_vio": None,
                   "entropy": None, "router_output_hist": None}
            if m.variant == "mor" and m.router.type == "token_choice":
                row["max_vio"] = T.MAX_VIO[0] + sd * T.ROUTER_SD * float(_noise(rng, model)[0])
                row["entropy"] = T.ENTROPY[0] + sd * T.ROUTER_SD * float(_noise(rng, model)[0])
            if g == "fig5c":
                row["router_output_hist"] = _hist(rng, model, sd, m.num_recursions, m.router.alpha)
                row["depth_cap_nll_1"] = T.NLL + off + sd * T.NLL_SD * float(_noise(rng, model)[0])
            rows.append(row)
        df = pd.DataFrame(rows)
        frames[g] = df.astype({c: object for c in df.columns if isinstance(df[c].dtype, pd.StringDtype)})
    return frames


def _hist(rng, model: str, sd: float, nr: int, alpha: float) -> str:
    import json

    edges = np.linspace(0.0, alpha, T.BINS + 1)
    out = []
    for _ in range(nr):
        group = {}
        for name, mean in (("selected", T.SELECTED), ("unselected", T.UNSELECTED)):
            x = (mean + sd * T.HIST_SD * float(_noise(rng, model)[0])) * T.BINS - 0.5
            i = min(max(int(math.floor(x)), 0), T.BINS - 2)
            h = np.zeros(T.BINS)
            h[i], h[i + 1] = 1 - (x - i), x - i
            group[name] = h.tolist()
        out.append({"bin_edges": edges.tolist(), **group, "n_selected": 100, "n_unselected": 100})
    return json.dumps(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=2000)
    ap.add_argument("--models", nargs="*", default=list(MODELS))
    ap.add_argument("--rng", type=int, default=0)
    ap.add_argument("--every", type=int, default=100, help="print the running rates every this many families")
    a = ap.parse_args()
    budget = T.load_budget(mode="local")
    rngs = {m: np.random.default_rng([a.rng, MODELS.index(m)]) for m in a.models}
    wrong = {m: 0 for m in a.models}
    seeds = {m: [] for m in a.models}
    spent = {m: [] for m in a.models}
    t = time.time()
    for rep in range(1, a.reps + 1):  # the models interleaved: a run stopped early has them all at the same n
        for model in a.models:
            table, _, cost = T._adaptive(draw(rngs[model], model), "local", budget)
            v = table.loc[list(T.FAMILY)]
            wrong[model] += int(v["verdict"].isin(["holds", "contradicted"]).any())
            seeds[model].append(v["n seeds"].astype(int).to_numpy())
            spent[model].append(cost)
        if rep % a.every == 0 or rep == a.reps:
            for model in a.models:
                rate = wrong[model] / rep
                se = math.sqrt(max(rate * (1 - rate), 1e-12) / rep)
                print(f"{model}: {wrong[model]} of {rep} families with a decisive verdict, family-wise rate {rate:.4f} "
                      f"(se {se:.4f}; nominal 0.05); mean seeds "
                      f"{dict(zip(T.FAMILY, np.mean(seeds[model], axis=0).round(2).tolist()))}; "
                      f"CPU-min added {np.mean(spent[model]):.1f}; {time.time() - t:.0f} s", flush=True)

if __name__ == "__main__":
    main()
