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
    t3              Student t with 3 df (heavy, symmetric tails), unit variance
    log-normal-<s>-mixed   centred log-normal sigma s (0.4: skewness 1.3; 0.8: 3.7), its skew sign
                    drawn per kind of run and quantity, once a family: a paired difference of two
                    opposite signs is skewed (issue 47)
    log-normal-<s>-right   the same, always right-skewed, each kind of run and quantity with its own
                    sd (0.5x-2x): same-law differences would be symmetric, unequal ones are not

``--skew SIGMA`` replaces the design's skew bound (grids/claims/claims.yaml design.skew; 0: the
Student t test of before issue 47), so the same draws show both tests:

    .venv/bin/python benchmarks/bench_claims_null.py --reps 2000 --models log-normal-0.8-right --skew 0

    .venv/bin/python benchmarks/bench_claims_null.py --reps 2000 --models homoscedastic

``--workers N`` runs the families in N forked processes; each family's generator comes from
(--rng, model, index), so the results do not depend on N. ``--record FILE`` writes every family's
verdicts, seeds and every round's table; ``--check FILE`` compares a run with such a recording
(``--check-decisions``: the decisions' numbers only), so a change meant only for speed can be
checked against the families it must not change:

    .venv/bin/python benchmarks/bench_claims_null.py --reps 40 --models homoscedastic log-normal-0.8-mixed \
        --record before.json        # then, after the change: --check before.json

``--planted`` plants every claim of the local family at the effect sizes its pilot measured
(bench_claims_design.PILOT: each comparison's mean / seed sd, the d the second design was
chosen on) and prints each claim's power, the share of families that reach the verdict the
planted effect implies, beside the design simulation's power at the same d:

    .venv/bin/python benchmarks/bench_claims_null.py --planted --reps 500 --models homoscedastic

``--deeper {trend,last-step,steps}`` decides deeper-recursion with one of issue 61's candidate
predicates (trend: the registered one; last-step: the last trained step, pooled the same way;
steps: issue 48's every step), so the choice can be re-run; the null run prints each claim's
decisive count beside the family-wise rate:

    .venv/bin/python benchmarks/bench_claims_null.py --planted --reps 300 --models homoscedastic \
        log-normal-0.8-right --deeper last-step
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
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

sys.path.insert(0, str(REPO / "benchmarks"))
from bench_claims_design import PILOT  # noqa: E402

MODELS = ("homoscedastic", "per-variant", "log-normal", "seed-offsets", "t3", "log-normal-0.4-mixed",
          "log-normal-0.8-mixed", "log-normal-0.4-right", "log-normal-0.8-right")


def _d(claim: str) -> list[float]:
    """The pilot's standardised effect of each comparison of ``claim`` (mean / seed sd)."""
    means, sds, _ = PILOT[claim]
    return [m / s for m, s in zip(means, sds)]


def _entropy(a: float) -> float:
    """The assignment entropy of the fixture's depth shares (1/3 + a, 1/3, 1/3 - a)."""
    q = np.array([1 / 3 + a, 1 / 3, 1 / 3 - a])
    return float(-(q * np.log(q)).sum())


def _entropy_shift(target: float, a: float = 0.15) -> float:
    """The rise in a that lowers the entropy by ``target`` (bisection)."""
    lo, hi = 0.0, 1 / 3 - a - 1e-6
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _entropy(a) - _entropy(a + mid) < target else (lo, mid)
    return (lo + hi) / 2


# What --planted adds to the simulated runs, in the simulation's own units, so that each
# comparison's mean / per-seed sd equals the pilot's d (homoscedastic: a difference of two runs
# has sd sqrt(2) x the per-run sd; the seed offset cancels):
#   aux-separates     selected tokens lower, every (run, recursion) cell at the pilot's weakest
#                     cell, d = -1.75 (its 6 cells: -1.75 .. -3.92): "contradicted"
#   deeper-recursion  NLL falls by the pilot's cap-1-vs-full d per Nr (0.79, 1.79, 0.89), spread
#                     evenly over the Nr - 1 steps of its curve (issue 48 reads every step)
#   balancing-*       MaxVio(loss-free) above the balancing loss's by the pilot's d (1.79);
#                     assignment entropy(loss-free) below by the pilot's entropy d (1.64, at the
#                     fixture's entropy sd, |dH/da| x the share's sd); NLL(loss-free) - NLL(loss)
#                     + margin at the pilot's d (1.00)
ROOT2 = math.sqrt(2.0)
NI_MARGIN = T.SPECS["balancing-nll"].ni_margin  # grids/claims/claims.yaml, read, not copied (issue 48: its own claim)
_H_SD = abs(math.log((1 / 3 - 0.15) / (1 / 3 + 0.15))) * T.ROUTER_SD  # one run's entropy sd at the fixture's a
PLANT = {
    "separation": min(_d("aux-separates"), key=abs) * ROOT2 * T.HIST_SD,
    "depth_cap": {nr: d * ROOT2 * T.NLL_SD / (nr - 1) for nr, d in zip((2, 3, 4), _d("deeper-recursion"))},  # a step
    "max_vio": _d("balancing-maxvio")[0] * ROOT2 * T.ROUTER_SD,
    "assign": _entropy_shift(_d("balancing-entropy")[0] * ROOT2 * _H_SD),
    "nll_free": _d("balancing-nll")[0] * ROOT2 * T.NLL_SD - NI_MARGIN,
}
EXPECT = {"aux-separates": "contradicted", "deeper-recursion": "holds", "balancing-maxvio": "holds",
          "balancing-entropy": "holds", "balancing-nll": "holds"}


class Noise:
    """One family's noise: a law per kind of run and quantity (its sd scale and skew sign, drawn
    once), unit variance and mean 0 at scale 1."""

    def __init__(self, rng, model: str):
        self.rng, self.model, self.laws = rng, model, {}
        self.sigma = float(model.split("-")[2]) if model.startswith("log-normal-") else None

    def law(self, key) -> tuple[float, float, float]:
        """(sd scale, seed-offset loading, skew sign) of one kind of run and quantity."""
        if key not in self.laws:
            m, rng = self.model, self.rng
            scale = float(np.exp(rng.uniform(math.log(0.5), math.log(2.0)))) if m in ("per-variant",) or \
                m.endswith("-right") else 1.0
            loading = float(rng.uniform(0.5, 1.5)) if m == "seed-offsets" else 1.0
            sign = float(rng.choice([-1.0, 1.0])) if m.endswith("-mixed") else 1.0
            self.laws[key] = (scale, loading, sign)
        return self.laws[key]

    def __call__(self, key) -> float:
        scale, _, sign = self.law(key)
        z = float(self.rng.standard_normal())
        if self.model == "t3":
            return scale * float(self.rng.standard_t(3)) / math.sqrt(3.0)
        if self.model == "log-normal":  # sigma 1, always right, one sd: same-law differences are symmetric
            return scale * (math.exp(z) - math.exp(0.5)) / math.sqrt((math.e - 1) * math.e)
        if self.sigma:
            s = self.sigma
            return scale * sign * (math.exp(s * z) - math.exp(s * s / 2)) / math.sqrt((math.exp(s * s) - 1) * math.exp(s * s))
        return scale * z


def draw(rng, model: str, planted: bool = False) -> dict[str, pd.DataFrame]:
    """Every run of deciding and fig5c at the last look in tests/unit/test_null_adaptive.py's
    columns (every depth cap, the depth assignments), every comparison's true mean 0 (or,
    ``planted``, at the pilot's d: ``PLANT``), with ``model``'s noise."""
    frames, noise = {}, Noise(rng, model)
    for g in T.GRIDS:
        static = T._static(g, "local")
        seeds = sorted({row["seed"] for row, _ in static})
        common = {s: (T.SEED_SD * rng.standard_normal() if model == "seed-offsets" else 0.0) for s in seeds}
        rows = []
        for fixed, m in static:
            kind = (g, m.variant, m.router.type if m.variant == "mor" else None, m.num_recursions)  # one law per kind
            off = noise.law(kind + ("offset",))[1] * common[fixed["seed"]]
            row = {**fixed, "val_nll": T.NLL + off + T.NLL_SD * noise(kind + ("nll",)), "max_vio": None,
                   "entropy": None, "router_output_hist": None}
            if m.variant == "mor" and m.router.type == "token_choice":
                free = planted and m.router.balancing == "loss_free"
                kb = kind + (m.router.balancing,)
                row["max_vio"] = T.MAX_VIO[0] + T.ROUTER_SD * noise(kb + ("max_vio",)) + free * PLANT["max_vio"]
                row["entropy"] = T.ENTROPY[0] + T.ROUTER_SD * noise(kb + ("entropy",))
                a = min(max(0.15 + T.ROUTER_SD * noise(kb + ("assign",)) + free * PLANT["assign"], -0.33), 0.33)
                row["depth_histogram"] = [round(1000 * (1 / 3 + a)), round(1000 / 3), round(1000 * (1 / 3 - a))]
                # balancing-nll's null is its boundary: loss-free's NLL lower by the margin (planted: PLANT)
                shift = (PLANT["nll_free"] if planted else -NI_MARGIN) if m.router.balancing == "loss_free" else 0.0
                row["val_nll"] = T.NLL + off + T.NLL_SD * noise(kb + ("nll",)) + shift
            if g == "fig5c":
                row["router_output_hist"] = _hist(noise, kind, m.num_recursions, m.router.alpha,
                                                  PLANT["separation"] if planted else 0.0)
                nr = m.num_recursions
                for d in range(1, nr):  # cap d's NLL (cap Nr: val_nll): planted, each step down by PLANT
                    row[f"depth_cap_nll_{d}"] = (T.NLL + off + T.NLL_SD * noise(kind + (f"cap{d}",))
                                                 + (PLANT["depth_cap"][nr] * (nr - d) if planted else 0.0))
            rows.append(row)
        df = pd.DataFrame(rows)
        frames[g] = df.astype({c: object for c in df.columns if isinstance(df[c].dtype, pd.StringDtype)})
    return frames


def _hist(noise: Noise, kind, nr: int, alpha: float, shift: float = 0.0) -> str:
    import json

    edges = np.linspace(0.0, alpha, T.BINS + 1)
    out = []
    for r in range(nr):
        group = {}
        for name, mean in (("selected", T.SELECTED + shift), ("unselected", T.UNSELECTED)):
            x = (mean + T.HIST_SD * noise(kind + (name, r))) * T.BINS - 0.5
            i = min(max(int(math.floor(x)), 0), T.BINS - 2)
            x = min(max(x, i), i + 1)
            h = np.zeros(T.BINS)
            h[i], h[i + 1] = 1 - (x - i), x - i
            group[name] = h.tolist()
        out.append({"bin_edges": edges.tolist(), **group, "n_selected": 100, "n_unselected": 100})
    return json.dumps(out)


DEEPER = {  # --deeper: deeper-recursion's predicate (issue 61's choice; "trend" is the registered one)
    "trend": dict(compare="deeper_trend", pool="mean"),
    "last-step": dict(compare="deeper_last_step", pool="mean"),
    "steps": dict(compare="deeper_is_better", pool=""),
}


def _set_deeper(name: str | None) -> None:
    """Decide deeper-recursion with another candidate predicate than the registered one."""
    if name is None:
        return
    from mor.claims import predicates, registry

    how = DEEPER[name]
    registry.CLAIMS = tuple(dataclasses.replace(c, compare=getattr(predicates, how["compare"]), pool=how["pool"])
                            if c.id == "deeper-recursion" else c for c in registry.CLAIMS)


def _set_skew(skew: float | None) -> None:
    """Run the rounds under another skew bound than the shipped design's (the same draws)."""
    if skew is not None:
        T.DESIGNS["local"] = dataclasses.replace(T.DESIGNS["local"], skew=skew)


# what --record / --check compare, besides the verdicts and seeds: every round's table (evaluate()) of the
# family's claims; the decision's numbers, then the planner's (MDE, its chance that the next look decides)
DECISION = ["verdict", "n seeds", "p", "p Holm", "mean effect", "raw lo", "raw hi"]
PLANNER = ["MDE", "chance next look", "seeds needed"]


@functools.lru_cache(maxsize=None)
def _budget():
    """The local mode's pre-registered budget, read once (its YAML parse cost 50 ms a family)."""
    return T.load_budget(mode="local")


def family(job: tuple) -> tuple:
    """One family through the real rounds: ((verdict, ...), (n seeds, ...) of T.FAMILY, CPU-min
    added, CPU seconds it took, every round's table as JSON-able rows: ``DECISION`` + ``PLANNER``).
    ``job``: (model, index, rng, planted, skew); its generator comes from (rng, model, index) alone,
    so a family's draw does not depend on --workers or on the order the families run in."""
    from mor.claims import verdict

    model, index, seed, planted, skew, deeper = job
    _set_skew(skew)
    _set_deeper(deeper)
    tables, evaluate = [], verdict.evaluate

    def kept(*args, **kw):  # next_round's evaluate(), its tables kept
        out = evaluate(*args, **kw)
        tables.append(out.set_index("claim").reindex(index=list(T.FAMILY), columns=DECISION + PLANNER))
        return out

    t = time.process_time()
    verdict.evaluate = kept
    try:
        rng = np.random.default_rng([seed, (100 if planted else 0) + MODELS.index(model), index])
        table, _, cost = T._adaptive(draw(rng, model, planted), "local", _budget())
    finally:
        verdict.evaluate = evaluate
    secs = time.process_time() - t
    v = table.loc[list(T.FAMILY)]
    rounds = [[[v if isinstance(v, str) else None if pd.isna(v) else float(v) for v in row] for row in x.to_numpy().tolist()]
              for x in tables]
    return tuple(v["verdict"]), tuple(int(x) for x in v["n seeds"]), float(cost), secs, rounds


def _families(a, models: list[str], planted: bool):
    """Every family of ``models`` (interleaved: a run stopped early has them all at the same n),
    in order, over --workers processes (forked, so each inherits the tabulated null laws)."""
    jobs = [(m, i, a.rng, planted, a.skew, a.deeper) for i in range(a.reps) for m in models]
    # one family no run draws fills this process's caches (the skew tables, the grids) first, so the CPU
    # seconds a family reports exclude them, and forked workers inherit them
    family(("homoscedastic", 10 ** 9, a.rng, planted, a.skew, a.deeper))
    if a.workers <= 1:
        yield from map(family, jobs)
        return
    import multiprocessing as mp

    with mp.get_context("fork").Pool(a.workers) as pool:
        yield from pool.imap(family, jobs, chunksize=1)


def _check(a, models: list[str], got: dict) -> None:
    """--record: write each family's verdicts, seeds and every round's table; --check: compare them
    with a recording (--check-decisions: the tables' ``DECISION`` columns only, not the planner's)."""
    import json

    if a.record:
        Path(a.record).write_text(json.dumps({"rng": a.rng, "reps": a.reps, "skew": a.skew, "planted": a.planted,
                                              "families": got}, indent=0))
        print(f"recorded {sum(map(len, got.values()))} families to {a.record}")
    if a.check:
        want = json.loads(Path(a.check).read_text())
        if (want["rng"], want["reps"], want["skew"], want["planted"]) != (a.rng, a.reps, a.skew, a.planted):
            sys.exit(f"--check: {a.check} was recorded with other settings: {want}")
        cols = len(DECISION) if a.check_decisions else None

        def same(x, y):
            return x[:2] == y[:2] and [[row[:cols] for row in r] for r in x[2]] == [[row[:cols] for row in r] for r in y[2]]

        bad = [(m, i) for m in models for i, (x, y) in enumerate(zip(want["families"][m], got[m])) if not same(x, y)]
        if bad or set(want["families"]) != set(models):
            sys.exit(f"--check: {len(bad)} families differ from {a.check}: {bad[:5]}")
        print(f"--check: every verdict, seed count and round's table{' (decisions)' if cols else ''} of "
              f"{sum(map(len, got.values()))} families as recorded")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=2000)
    ap.add_argument("--models", nargs="*", default=list(MODELS))
    ap.add_argument("--rng", type=int, default=0)
    ap.add_argument("--workers", type=int, default=1, help="processes over families (the results do not depend on it)")
    ap.add_argument("--every", type=int, default=100, help="print the running rates every this many families")
    ap.add_argument("--planted", action="store_true", help="every claim at its pilot's d: power per claim")
    ap.add_argument("--skew", type=float, default=None, help="the design's skew bound instead of the shipped one "
                    "(log-normal sigma; 0: Student's t)")
    ap.add_argument("--deeper", choices=sorted(DEEPER), default=None, help="deeper-recursion's predicate instead "
                    "of the registered one (issue 61's candidates: trend, the registered; last-step; steps, issue 48's)")
    ap.add_argument("--record", default=None, help="write every family's verdicts and seeds to this JSON file")
    ap.add_argument("--check", default=None, help="compare every family's verdicts and seeds with a --record file")
    ap.add_argument("--check-decisions", action="store_true", help="--check the decisions' numbers only, not the "
                    "planner's (MDE, chance next look, seeds needed)")
    a = ap.parse_args()
    _set_skew(a.skew)
    print(f"skew bound (log-normal sigma) {T.DESIGNS['local'].skew}; {a.workers} worker(s)", flush=True)
    got = planted(a) if a.planted else null(a)
    _check(a, a.models, got)


def null(a) -> dict:
    """Family-wise decisive rate per noise model under the global null."""
    wrong = {m: 0 for m in a.models}
    own = {m: dict.fromkeys(T.FAMILY, 0) for m in a.models}  # each claim's decisive count (issue 61: deeper-recursion's)
    seeds, spent, cpu, got = ({m: [] for m in a.models} for _ in range(4))
    t = time.time()
    for k, (verdicts, n, cost, secs, rounds) in enumerate(_families(a, a.models, planted=False)):
        model, rep = a.models[k % len(a.models)], k // len(a.models) + 1
        wrong[model] += any(v in ("holds", "contradicted") for v in verdicts)
        for c, v in zip(T.FAMILY, verdicts):
            own[model][c] += v in ("holds", "contradicted")
        seeds[model].append(n)
        spent[model].append(cost)
        cpu[model].append(secs)
        got[model].append([list(verdicts), list(n), rounds])
        if model == a.models[-1] and (rep % a.every == 0 or rep == a.reps):
            for m in a.models:
                rate = wrong[m] / rep
                se = math.sqrt(max(rate * (1 - rate), 1e-12) / rep)
                print(f"{m}: {wrong[m]} of {rep} families with a decisive verdict, family-wise rate {rate:.4f} "
                      f"(se {se:.4f}; nominal 0.05); mean seeds "
                      f"{dict(zip(T.FAMILY, np.mean(seeds[m], axis=0).round(2).tolist()))}; "
                      f"decisive per claim {dict((c, k) for c, k in own[m].items() if c in EXPECT)}; "
                      f"CPU-min added {np.mean(spent[m]):.1f}; CPU {np.mean(cpu[m]):.3f} s a family; "
                      f"{time.time() - t:.0f} s wall", flush=True)
    return got


def planted(a) -> dict:
    """Power per claim of the real rounds with every claim planted at its pilot's d."""
    print("planted (simulation units): " + ", ".join(
        f"{k} {v if not isinstance(v, dict) else {n: round(x, 5) for n, x in v.items()}}" for k, v in PLANT.items()))
    got = {}
    for model in a.models:
        hits = {c: 0 for c in EXPECT}
        wrong = {c: 0 for c in EXPECT}
        t, cpu, got[model] = time.time(), 0.0, []
        for verdicts, n, _, secs, rounds in _families(a, [model], planted=True):
            v = dict(zip(T.FAMILY, verdicts))
            cpu += secs
            got[model].append([list(verdicts), list(n), rounds])
            for c, want in EXPECT.items():
                hits[c] += v[c] == want
                wrong[c] += v[c] in ("holds", "contradicted") and v[c] != want
        print(f"{model}: {a.reps} families, power " + ", ".join(
            f"{c} {hits[c] / a.reps:.3f} (se {math.sqrt(hits[c] * (a.reps - hits[c]) / a.reps ** 3):.3f}"
            f"{f', {wrong[c]} the wrong way' if wrong[c] else ''})" for c in EXPECT)
            + f"; CPU {cpu / a.reps:.3f} s a family; {time.time() - t:.0f} s wall", flush=True)
    return got


if __name__ == "__main__":
    main()
