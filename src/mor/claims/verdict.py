"""From the grids' results to one row per claim: comparisons per seed, the claim's sequential
p-values, Holm across the claims that have seeds, the verdict, and for an undecided claim
what it could have detected (``mor.stats`` holds every formula)."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pandas as pd

from mor import stats
from mor.claims.registry import CLAIMS, Claim, Spec, load_specs
from mor.claims.select import seeds_of

VERDICT_NOTE = (
    "How a verdict is reached (grids/claims/claims.yaml, pre-registered; mor.stats). Each claim is one or more comparisons, "
    "each a per-seed difference oriented so that > 0 is what the paper says (seed s uses only the runs of seed s). "
    "A claim of 'A is best' holds only if A beats every competitor in every cell (intersection-union test), and is "
    "contradicted if some competitor beats A (Bonferroni over the comparisons). An equivalence claim ('changes little') "
    "holds if every comparison's 90% interval lies inside +-margin (TOST). Seeds are looked at in pre-registered looks "
    "(n = {looks}); look k spends alpha x {weights} of alpha = {alpha} (power-family spending, rho = {rho}), and the claim's "
    "p-value is the smallest p_k / w_k. Holm's step-down then runs over the mode's family, pre-registered in "
    "design.family (a member with fewer than {first} seeds, or not built, counts with p = 1; a claim outside it is "
    "'not tested in this mode' and gets no seeds), so the chance of any wrong 'holds' or 'contradicted' in the table "
    "is at most {alpha}. Each comparison's seed sd is floored at its metric's resolution (design.resolution). "
    "Columns: 'raw lo/hi' is the unadjusted interval (95%; 90% for equivalence) of the binding comparison (the one "
    "closest to failing; its sd floored as the test floors it), 'p' the claim's sequential p-value, 'p Holm' after Holm, "
    "'MDE' the smallest true effect of the binding comparison, in its own metric's units, that its n seeds detect with "
    "power {power} at the level Holm asks of the claim at its look (under every seed-noise shape the test allows, "
    "design.skew: the least favourable one decides; every comparison's own MDE is in "
    "the note), 'seeds needed' the n at which the paper's effect would be. A claim that requires another (a part of its "
    "sentence that claim decides once, e.g. the balancing claims' NLL part, balancing-nll) holds only if both hold and "
    "is contradicted if either is; the shared test is one member of Holm's family, counted once; 'verdict from' says "
    "whether a verdict is the claim's own test's or comes through the claim it requires (its own test's verdict in "
    "brackets; 'p Holm' is always its own). inconclusive = not "
    "decided after Holm; not built = the grid's results are missing.")


def verdict_note(design: stats.Design) -> str:
    w = ", ".join(f"{x:.3g}" for x in design.weights())
    note = VERDICT_NOTE.format(looks=", ".join(map(str, design.looks)), weights=f"({w})", alpha=design.alpha,
                               rho=design.rho, first=design.looks[0], power=design.power)
    if design.first_seed:
        note += (f" Seeds at offsets below {design.first_seed} (train.seed minus the first seed of the claim's blocks, "
                 f"as the design raises blocks) are not read: earlier designs sized this one on them or "
                 f"decided on them, and 'n seeds' and the looks count the fresh seeds from offset {design.first_seed} on. A claim "
                 f"outside the family, which nothing tests, is shown with every seed its grids hold.")
    if design.spent_before:
        note += (f" Alpha already spent: earlier designs' final looks (and re-analyses) tested {', '.join(design.retested)} at "
                 f"alpha = {design.spent_before:g} in all; this design tests them again at a fresh alpha = "
                 f"{design.alpha:g}, so across the designs their chance of any wrong verdict is bounded by "
                 f"{design.spent_before + design.alpha:.2g} (union bound), not {design.alpha:g}.")
    return note


def by_seed(df: pd.DataFrame) -> dict[int, pd.DataFrame]:
    """A grid's rows split by seed once (seed -> its rows, in the frame's order, its index kept):
    every claim reads one seed's runs at a time, and masking the whole frame again for each claim
    and seed was most of a verdict's time (benchmarks/bench_claims_null.py). One stable sort by
    seed, then each seed's rows are a slice of it (no copy per seed)."""
    seed = df["seed"].to_numpy()
    order = np.flatnonzero(pd.notna(seed))
    order = order[np.argsort(seed[order], kind="stable")]
    rows, keys = df.iloc[order], seed[order]
    starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]]) if len(keys) else np.array([], dtype=int)
    return {int(keys[a]): rows.iloc[a:b] for a, b in zip(starts, np.r_[starts[1:], len(keys)])}


def blocks_first_seed(spec: Spec, first: dict[tuple[str, str], int] | None) -> int | None:
    """The first train.seed of the claim's deciding blocks (``decided_by``; ``first``:
    ``mor.claims.seeding.first_seeds`` of its grid), None where ``first`` has none of them."""
    d = spec.decided_by
    known = [first[(d["grid"], b)] for b in d["runs"] if (d["grid"], b) in first] if d and first else []
    return min(known) if known else None


def _comparisons(claim: Claim, spec: Spec, frames: dict[str, pd.DataFrame],
                 first_seed: int = 0, split: dict | None = None,
                 first: dict[tuple[str, str], int] | None = None) -> tuple[np.ndarray, list[str], list[int], list[str], dict]:
    """(K x n matrix, comparison labels, seeds kept, notes, label -> metric): labels missing
    or nan in every seed are dropped, then every seed missing one of the rest; both are named
    in the notes. Seeds at offsets below ``first_seed`` (the design's pilot) are never read.
    Offsets count from the claim's blocks' first seed, as ``mor.claims.seeding`` and
    ``Design.block_seeds`` count a block's seeds: a block whose runs start at train.seed 100 has
    its pilot at 100..100 + first_seed - 1, whatever seeds other blocks of its grid start at.
    That seed comes from the grid where the caller has it (``first``: (grid, block) -> the
    block's first train.seed, ``blocks_first_seed``), so a failed run at it cannot move the pilot
    onto a fresh seed; without it, it is the first seed at which the claim's runs give a
    comparison. ``split``: grid -> ``by_seed`` of its frame, filled here as needed (evaluate()
    shares one between its claims)."""
    seeds = seeds_of(frames, claim.grids)
    split = {} if split is None else split
    for g in claim.grids:
        if g not in split:
            split[g] = by_seed(frames[g])

    def compare(s):
        return claim.compare({g: split[g][s] for g in claim.grids}, spec)

    per_seed, base = {}, blocks_first_seed(spec, first)
    if base is None:  # no grid at hand: the first seed with any comparison (usually the blocks' first)
        base = seeds[0] if seeds else 0
        for s in seeds:
            per_seed[s] = compare(s)
            if any(math.isfinite(v) for v in per_seed[s].values.values()):
                base = s
                break
    pilot = [s for s in seeds if 0 <= s - base < first_seed]
    seeds = [s for s in seeds if s not in pilot]  # those before base have no comparison: noted below
    per_seed = {s: per_seed[s] if s in per_seed else compare(s) for s in seeds}
    labels = list(dict.fromkeys(k for r in per_seed.values() for k in r.values))
    notes = [f"{len(pilot)} pilot seed(s) below design's first fresh seed {base + first_seed} not read (earlier designs "
             f"sized this one on them or decided on them): {', '.join(map(str, pilot))}"] if pilot else []
    dead = [k for k in labels if not any(math.isfinite(r.values.get(k, math.nan)) for r in per_seed.values())]
    if dead:
        notes.append(f"{len(dead)} comparison(s) without runs in any seed dropped: {', '.join(dead)}")
    labels = [k for k in labels if k not in dead]
    kept, elsewhere = [], []
    for s, r in per_seed.items():
        gone = [k for k in labels if not math.isfinite(r.values.get(k, math.nan))]
        if len(gone) == len(labels) and not r.dropped:
            elsewhere.append(s)  # no comparison at all: a seed the design gave other claims' blocks
        elif gone or not labels:
            notes.append(f"seed {s} dropped ({'no ' + ', '.join(gone) if gone else 'no comparison'})")
        else:
            kept.append(s)
    if elsewhere:
        notes.append(f"{len(elsewhere)} seed(s) of its grid with no comparison, not counted (seeds raised for other "
                     f"claims' blocks, or all its runs of that seed missing): {', '.join(map(str, elsewhere))}")
    left_out = Counter(x for r in per_seed.values() for x in r.dropped)
    notes += [f"left out: {x} ({n} of {len(seeds)} seeds)" for x, n in left_out.items()]
    for name in dict.fromkeys(k for s in kept for k in per_seed[s].described):  # beside the test, not tested
        v = np.array([per_seed[s].described.get(name, math.nan) for s in kept], dtype=np.float64)
        notes.append(f"described, not tested: {name}: mean {np.nanmean(v):.3g} (seeds {np.nanmin(v):.3g} to "
                     f"{np.nanmax(v):.3g})")
    matrix = np.array([[per_seed[s].values[k] for s in kept] for k in labels], dtype=np.float64).reshape(len(labels), len(kept))
    metrics = {k: m for r in per_seed.values() for k, m in r.metrics.items()}
    if claim.pool == "mean" and len(labels) > 1:  # one comparison: the mean of the predicate's, per seed
        notes.append(f"one comparison, the mean of {len(labels)}: {', '.join(labels)}")
        labels, matrix = [f"mean of {len(labels)}"], matrix.mean(axis=0, keepdims=True)
    return matrix, labels, kept, notes, {k: metrics.get(k, claim.metric) for k in labels}


def decided_by(spec: Spec) -> str:
    d = spec.decided_by
    return f"{d['grid']}: {', '.join(d['runs'])} ({d['why']})" if d else ""


def _round(v):
    return None if v is None or not math.isfinite(v) else round(float(v), 4)


def _sig(p: float) -> float:
    return float(f"{p:.3g}")


NOT_TESTED = "not tested in this mode"


def floors(design: stats.Design, metrics: list[str]) -> np.ndarray:
    """Each comparison's sd floor: its metric's resolution (0 where the design names none)."""
    return np.array([design.floors.get(m, 0.0) for m in metrics], dtype=np.float64)


def evaluate(frames: dict[str, pd.DataFrame], claims: tuple[Claim, ...] = CLAIMS,
             design: stats.Design | None = None, specs: dict[str, Spec] | None = None,
             family: tuple[str, ...] | None = None,
             first_seeds: dict[tuple[str, str], int] | None = None) -> pd.DataFrame:
    """One row per claim: n, the binding comparison's mean and raw interval, the sequential
    and Holm-adjusted p-values, the verdict, and MDE / seeds needed where undecided.
    ``family``: the mode's pre-registered Holm family (``registry.load_family``); a claim
    outside it is shown, with its numbers, as "not tested in this mode"; None: every claim.
    ``first_seeds``: (grid, block) -> the block's first train.seed (``mor.claims.seeding.first_seeds``),
    from which a claim's pilot counts; None: read off the data (``_comparisons``)."""
    if design is None or specs is None:
        d, s = load_specs()
        design, specs = design or d, specs or s
    have = {c.id for c in claims}
    claims = tuple(claims) + tuple(c for c in CLAIMS if c.id not in have and any(c.id in x.requires for x in claims))
    members = {c.id for c in claims} if family is None else set(family)
    rows, tested, split = [], [], {}
    for c in claims:
        spec = specs.get(c.id, Spec())
        row = {"claim": c.id, "statement": c.statement, "paper sentence": c.sentence, "paper evidence": c.evidence,
               "effect": c.effect_doc, "grids": ", ".join(c.grids), "decided by": decided_by(spec),
               "_member": c.id in members}
        missing = [g for g in c.grids if g not in frames]
        if missing:
            rows.append({**row, "verdict": "not built", "n seeds": 0,
                         "note": f"results/{missing[0]}.parquet is not built; run its grid to decide this claim"})
            continue
        # the pilot's seeds are left unread for the claims this mode tests; a claim outside its family is
        # tested by nothing here, so it is shown with every seed its grids hold (the pilot's too)
        pilot = design.first_seed if row["_member"] else 0
        m, labels, kept, notes, metric = _comparisons(c, spec, frames, pilot, split, first_seeds)
        if design.first_seed and not row["_member"]:
            notes.append(f"every seed read, those below the design's first fresh seed ({design.first_seed}) too: "
                         "no test reads them")
        n = len(kept)
        equivalence = c.kind == "equivalence"
        row.update({"n seeds": n, "comparisons": len(labels), "_equivalence": equivalence})
        if spec.exclude:
            notes.append(f"excluded by the design: {spec.exclude_source}")
        if not labels or n == 0:
            rows.append({**row, "verdict": "inconclusive" if row["_member"] else NOT_TESTED,
                         "note": "; ".join(notes + ["no matching runs"])})
            continue
        floor = floors(design, [metric[k] for k in labels])
        looks = design.looks_within(n)
        shown = m[:, :looks[-1]] if looks else m  # the seeds the test reads: the interval and MDE describe them
        b = stats.binding(shown, spec.margin if equivalence else None, floor)
        level = 1 - 2 * design.alpha if equivalence else 1 - design.alpha
        mean, lo, hi, _ = stats.interval(shown[b], level, float(floor[b]), design.skew)
        if equivalence:
            notes.append(f"margin +-{spec.margin} ({spec.margin_source})")
        if spec.ni_margin:
            notes.append(f"non-inferiority margin {spec.ni_margin} ({spec.ni_margin_source})")
        if len(labels) > 1:
            notes.append(f"{len(labels)} comparisons, binding: {labels[b]}")
        if c.requires:
            notes.append(f"holds only if {', '.join(c.requires)} holds too, contradicted if it is (a part of the sentence "
                         "decided once there: one member of Holm's family)")
        if c.id in design.retested:
            notes.append(f"re-tested: earlier designs spent alpha {design.spent_before:g} on it; bound across the "
                         f"designs {design.spent_before + design.alpha:.2g}")
        sds = np.maximum(shown.std(axis=1, ddof=1), floor) if shown.shape[1] > 1 else np.full(len(labels), math.nan)
        row.update({"mean effect": _round(mean), "raw lo": _round(lo), "raw hi": _round(hi),
                    "interval": f"{level:.0%}", "per seed": ", ".join(f"{e:.4g}" for e in shown[b]),
                    "paper effect": spec.paper_effect, "_n_shown": shown.shape[1], "_sds": sds,
                    "_sd": float(sds[b]), "_m": shown, "_floor": floor, "_margin": spec.margin if equivalence else None,
                    "_b": b, "_labels": labels, "_metrics": [metric[k] for k in labels], "_requires": c.requires})
        if not row["_member"]:
            notes.append("outside this mode's pre-registered family (grids/claims/claims.yaml design.family): "
                         "no test, no seeds")
            rows.append({**row, "verdict": NOT_TESTED, "note": "; ".join(notes)})
            continue
        if not looks:
            notes.append(f"{n} seed(s): below the first look (n = {design.looks[0]}), not tested"
                         + ("; one seed has no spread, so no interval or MDE" if n < 2 else ""))
        else:
            if n > looks[-1]:
                notes.append(f"{n - looks[-1]} seed(s) past the last look reached (n = {looks[-1]}) unused, "
                             "in the test and the interval alike")
            h, k = stats.claim_p(m, design, spec.margin if equivalence else None, floor)
            row.update({"_p_hold": float(h), "_p_contra": float(k), "p": _sig(min(float(h), float(k)))})
            tested.append(len(rows))
        rows.append({**row, "note": "; ".join(notes)})
    _decide(rows, tested, design)
    out = pd.DataFrame(rows)
    for col in ("p", "p Holm", "MDE", "chance next look"):  # every table has them, tested or not
        if col not in out.columns:
            out[col] = math.nan
    return out.drop(columns=[c for c in out.columns if c.startswith("_")])


def look_level(design: stats.Design, n: int, left: int, equivalence: bool = False) -> float | None:
    """The two-sided level Holm asks of an undecided claim tested at n seeds: alpha x the
    weight of the last look n reaches / the undecided claims of the family (TOST: one-sided at
    it, so twice that as a two-sided level); None below the first look."""
    k = len(design.looks_within(n))
    if not k:
        return None
    level = design.alpha * design.weights()[k - 1] / max(left, 1)
    return 2 * level if equivalence else level


def _decide(rows: list[dict], tested: list[int], design: stats.Design) -> None:
    """Holm over the mode's pre-registered family: its members whose grids are built (those
    below the first look counting with p = 1) and, counting with p = 1 as well, the members
    not built. The family is fixed in grids/claims/claims.yaml before any data, never by the
    data: were it only the tested claims, a null claim whose weak evidence kept it seeding
    would, by spending the budget, keep others out of the family and loosen its own threshold.
    Then the MDE and seeds needed of every undecided member, at the level Holm would ask of
    it at its next look (the first look's below it), each comparison's power the least over the
    noise shapes the test allows (``design.skew``: the test's own critical value and shapes,
    ``mor.stats.power_iut``), so the MDE, the seeds needed and the planner's chance are the test's."""
    family = [i for i, r in enumerate(rows) if r.get("_member")]
    left = 0
    if family:
        p_hold = np.array([rows[i].get("_p_hold", 1.0) for i in family])
        p_contra = np.array([rows[i].get("_p_contra", 1.0) for i in family])
        adjusted, code = stats.verdicts(p_hold, p_contra, design.alpha)
        for i, a, v in zip(family, adjusted, code):
            if i in tested:
                rows[i]["p Holm"] = _sig(float(a))
            if rows[i].get("verdict") != "not built":
                rows[i]["verdict"] = {1: "holds", -1: "contradicted", 0: "inconclusive"}[int(v)]
                rows[i]["verdict from"] = "own"
        left = len(family) - int((code != 0).sum())
        _condition(rows, family)
    for r in rows:
        r.setdefault("verdict", "inconclusive")
        r.setdefault("verdict from", "own" if r.get("_member") and r["verdict"] != "not built" else "")
        r["_left"] = left
        if r["verdict"] != "inconclusive" or "_sds" not in r or not np.all(np.isfinite(r["_sds"])):
            continue
        nxt = next((k for k in design.looks if k > r["n seeds"]), design.looks[-1])
        level = look_level(design, max(nxt, design.looks[0]) if r["n seeds"] < design.looks[0] else r["_n_shown"],
                           left, r["_equivalence"])
        each = stats.mde_each(r["_sds"], r["_n_shown"], level, design.power, design.skew)
        r["MDE"] = _round(float(each[r["_b"]]))  # the binding comparison's, in its own units
        if len(each) > 1:
            r["note"] = "; ".join(x for x in (r.get("note"), "MDE per comparison (its own units): " + ", ".join(
                f"{k} {v:.3g} ({m})" for k, v, m in zip(r["_labels"], each, r["_metrics"]))) if x)
        if r["n seeds"] < design.looks[-1]:  # the planner's chance that the next look decides (mor.claims.seeding)
            to = next(k for k in design.looks if k > r["n seeds"])
            r["chance next look"] = _round(stats.chance_decides(
                r["_m"], to, look_level(design, to, left, r["_equivalence"]), r["_margin"], r["_floor"],
                skew=design.skew))
        if r.get("paper effect") is not None:
            r["seeds needed"] = stats.seeds_needed(  # the paper's effect is in the binding comparison's units
                r["paper effect"], r["_sds"][r["_b"]], lambda n: look_level(design, n, left, r["_equivalence"]), design.power,
                skew=design.skew)


def _condition(rows: list[dict], family: list[int]) -> None:
    """A claim that requires others (``Claim.requires``) takes their verdicts into its own:
    holds only if it and each of them hold; contradicted if it or one of them is. Every one
    stays a single member of Holm's family, so a test two claims share is counted once, and a
    wrong conditioned verdict needs a wrong verdict of one member: the family-wise bound holds."""
    by_id = {rows[i]["claim"]: rows[i] for i in family}
    for i in family:
        r = rows[i]
        needs = [by_id.get(x) for x in r.get("_requires", ())]
        if not needs or r.get("verdict") == "not built":
            continue
        if any(n is None for n in needs):
            raise ValueError(f"{r['claim']} requires {r['_requires']}, which are not all in the family")
        own, theirs = r["verdict"], [n["verdict"] for n in needs]
        if own == "contradicted" or "contradicted" in theirs:
            r["verdict"] = "contradicted"
            through = [n["claim"] for n in needs if n["verdict"] == "contradicted"]
        elif own == "holds" and all(v == "holds" for v in theirs):
            r["verdict"], through = "holds", []
        else:
            r["verdict"] = "inconclusive"
            through = [n["claim"] for n in needs if n["verdict"] != "holds"] if own == "holds" else []
        if r["verdict"] != own:  # the table says which verdict is the claim's own test's and which it inherits
            r["verdict from"] = f"through {', '.join(through)} (own test: {own})"
            r["note"] = "; ".join(x for x in (r.get("note"), f"{r['verdict']} through {', '.join(through)}: its own "
                                              f"test says {own} (p Holm is its own test's)") if x)
