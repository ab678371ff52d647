"""Choosing the claims' sequential design by simulation (issue 31), before the new design's data.

A stand-in of the local `paper` target's adaptive design: the local family (grids/claims/
claims.yaml ``design.family.local``), each claim's comparisons drawn normal with the effect
sizes and per-seed sds measured in the last local tables (README "Measured with issue 20's
design"; the table below, ``OBSERVED``), the grids' own 3 seeds, then rounds that raise the
undecided claims to their next look, cheapest expected decision first (CPU-min to the next
look / the chance that look decides, ``mor.stats.chance_decides``), within the 30 CPU-minute
budget, shared blocks paid once, and Holm over the family after every round. The balancing
claims' shared NLL non-inferiority test is one member, balancing-nll, which both require
(``REQUIRES``, as ``mor.claims.registry.Claim.requires``): a balancing claim holds only if it and
balancing-nll hold, is contradicted if either is (``mor.claims.verdict``), and Holm counts the
shared test once. The planner and
the tests are the real ``mor.stats`` functions; only the rounds are re-written here, as arrays,
so that thousands of families per design run in seconds (the real ``next_round`` on simulated
parquet is benchmarks/bench_claims_null.py).

For each candidate design it prints: the null family-wise rate (every effect 0), the power
per claim at the observed effects, the expected seeds and CPU-minutes added.

    .venv/bin/python benchmarks/bench_claims_design.py --reps 2000
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np

from mor import stats

# claim -> (comparison means, comparison sds, blocks it raises); observed at 2.6M tokens (deciding)
# and fig5c's runs, README issue-20 table (n = 3, and n = 6 where round 1 ran)
OBSERVED = {
    "sharing-costs": ([0.032, -0.007], [0.018, 0.0035], ("vanilla", "recursive")),
    "mor-beats-recursive-tokens": ([-0.042], [0.038], ("recursive", "mor")),
    # every one of its 9 (run, recursion) comparisons near the n = 6 binding one: -0.201, sd ~0.046
    "aux-separates": ([-0.20] * 9, [0.046] * 9, ("fig5c",)),
    "deeper-recursion": ([0.005] * 3, [0.0055] * 3, ("fig5c",)),
    # MaxVio / entropy as measured at n = 6
    "balancing-maxvio": ([1.05], [0.45], ("balancing",)),
    "balancing-entropy": ([0.33], [0.19], ("balancing",)),
    # the NLL non-inferiority both balancing claims require (loss within +0.05 of loss-free),
    # assumed at a true difference 0 with sd 0.02 (no measurement of the pair's NLL)
    "balancing-nll": ([0.05], [0.02], ("balancing",)),
}
# claim -> the claims it requires (mor.claims.registry's Claim.requires)
REQUIRES = {"balancing-maxvio": ("balancing-nll",), "balancing-entropy": ("balancing-nll",)}
# CPU-minutes of one more seed of each block (grids/claims/claims.yaml minutes_per_run x runs a seed)
BLOCK_COST = {"vanilla": 4.4, "recursive": 8.8, "mor": 4.4, "fig5c": 2.7, "balancing": 1.8}
OWN_SEEDS, BUDGET, ALPHA = 3, 30.0, 0.05

# Issue 31's second design (--pilot): the first design's 9 seeds of fig5c's MoR block and the
# balancing pair are its pilot (tables/claims of the local family, 2026-12-03: every comparison's
# mean and seed sd at n = 9, from mor.claims.verdict's comparisons); the new design reads fresh
# seeds only (none at its start), over the family those blocks decide cheaply.
PILOT = {
    "aux-separates": ([-0.2802, -0.2149, -0.2177, -0.1214, -0.2420, -0.2291],
                      [0.0715, 0.0799, 0.0615, 0.0585, 0.0758, 0.1308], ("fig5c",)),
    "deeper-recursion": ([0.00147, 0.00475, 0.00810], [0.00187, 0.00266, 0.00911], ("fig5c",)),
    "balancing-maxvio": ([0.9450], [0.5276], ("balancing",)),
    "balancing-entropy": ([0.3100], [0.1887], ("balancing",)),
    "balancing-nll": ([0.0840], [0.0837], ("balancing",)),
}


def condition(code: np.ndarray, claims: list[str]) -> np.ndarray:
    """Holm's verdict codes (+1 holds, -1 contradicted, 0 undecided) with each claim's
    requirements taken in (``REQUIRES``; ``mor.claims.verdict``'s rule): holds only if it and
    every claim it requires hold, contradicted if it or one of them is."""
    out = code.copy()
    at = {c: j for j, c in enumerate(claims)}
    for j, c in enumerate(claims):
        needs = [code[at[x]] for x in REQUIRES.get(c, ()) if x in at]
        if len(needs) != len(REQUIRES.get(c, ())):
            raise ValueError(f"{c} requires {REQUIRES[c]}, which are not all in the family {claims}")
        if needs:
            out[j] = -1 if code[j] == -1 or -1 in needs else (1 if code[j] == 1 and all(x == 1 for x in needs) else 0)
    return out


def _run(rng, design: stats.Design, truth: dict, reps: int, holm: bool = True, own: int = OWN_SEEDS,
         budget: float = BUDGET):
    """(claims, verdict codes, seeds, CPU-min added) of ``reps`` families; ``holm=False``
    tests each claim at alpha alone (a broken design, for the test that the bound can fail)."""
    claims = list(truth)
    n_max = design.looks[-1]
    data = {c: np.asarray(m)[:, None] + np.asarray(s)[:, None] * rng.standard_normal((reps, len(m), n_max))
            for c, (m, s, _) in truth.items()}
    codes = np.zeros((reps, len(claims)), int)
    seeds = np.zeros((reps, len(claims)), int)
    spent = np.zeros(reps)
    w = design.weights()
    for r in range(reps):
        n = {c: own for c in claims}
        blocks = {b: own for b in BLOCK_COST}
        left = budget
        p_h, p_c = np.ones(len(claims)), np.ones(len(claims))
        while True:
            for j, c in enumerate(claims):
                if design.looks_within(n[c]):
                    h, k = stats.claim_p(data[c][r, :, :n[c]], design)
                    p_h[j], p_c[j] = float(h), float(k)
            if holm:
                _, code = stats.verdicts(p_h, p_c, design.alpha)
            else:
                code = np.where(np.minimum(p_h, p_c) <= design.alpha, np.where(p_h < p_c, 1, -1), 0)
            code = condition(code, claims)
            undecided = [c for j, c in enumerate(claims) if code[j] == 0]
            ranked = []
            for c in undecided:
                to = next((k for k in design.looks if k > n[c]), None)
                if to is None:
                    continue
                cost = sum(max(0, to - blocks[b]) * BLOCK_COST[b] for b in truth[c][2])
                k = design.looks.index(to)
                chance = stats.chance_decides(data[c][r, :, :n[c]], to, design.alpha * w[k] / max(len(undecided), 1),
                                              draws=128, skew=design.skew)
                ranked.append((cost / max(chance, 1e-9), c, to))
            raised = False
            for _, c, to in sorted(ranked):
                cost = sum(max(0, to - blocks[b]) * BLOCK_COST[b] for b in truth[c][2])
                if cost <= left + 1e-9:
                    left -= cost
                    for b in truth[c][2]:
                        blocks[b] = max(blocks[b], to)
                    raised = True
            if not raised:
                break
            for c in claims:
                n[c] = min(blocks[b] for b in truth[c][2])
        codes[r], seeds[r], spent[r] = code, [n[c] for c in claims], budget - left
    return claims, codes, seeds, spent


DESIGNS = {
    "looks 3, 6, 9 (issue 20)": stats.Design(alpha=ALPHA, looks=(3, 6, 9), rho=1.0),
    "looks 6, 9, rho 1": stats.Design(alpha=ALPHA, looks=(6, 9), rho=1.0),
    "looks 6, 9, rho 2": stats.Design(alpha=ALPHA, looks=(6, 9), rho=2.0),
    "fixed n = 6": stats.Design(alpha=ALPHA, looks=(6,), rho=1.0),
    "fixed n = 9": stats.Design(alpha=ALPHA, looks=(9,), rho=1.0),
}
# candidates of the second design (fresh seeds from 0, sized on the pilot)
PILOT_DESIGNS = {
    **{f"fixed n = {n}": stats.Design(alpha=ALPHA, looks=(n,), rho=1.0) for n in (10, 12, 14, 16, 18, 20)},
    "looks 8, 14, rho 1": stats.Design(alpha=ALPHA, looks=(8, 14), rho=1.0),
    "looks 8, 14, rho 2": stats.Design(alpha=ALPHA, looks=(8, 14), rho=2.0),
    "looks 10, 16, rho 2": stats.Design(alpha=ALPHA, looks=(10, 16), rho=2.0),
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=1000)
    ap.add_argument("--designs", nargs="*", default=None)
    ap.add_argument("--pilot", action="store_true", help="the second design: effects from the first design's 9 seeds "
                    "(PILOT), fresh seeds only, the pilot's family")
    ap.add_argument("--budget", type=float, default=None, help="CPU-min the design may add (default: 30; 80 --pilot)")
    a = ap.parse_args()
    truth, designs, own = (PILOT, PILOT_DESIGNS, 0) if a.pilot else (OBSERVED, DESIGNS, OWN_SEEDS)
    budget = a.budget if a.budget is not None else (80.0 if a.pilot else BUDGET)
    null = {c: ([0.0] * len(m), s, b) for c, (m, s, b) in truth.items()}
    for name in a.designs or list(designs):
        d, t = designs[name], time.time()
        claims, code0, _, spent0 = _run(np.random.default_rng(1), d, null, a.reps, own=own, budget=budget)
        fwer = (code0 != 0).any(axis=1).mean()
        claims, code, seeds, spent = _run(np.random.default_rng(2), d, truth, a.reps, own=own, budget=budget)
        own_way = np.array([1 if all(x > 0 for x in truth[c][0]) else -1 for c in claims])
        expect = dict(zip(claims, condition(own_way, claims).tolist()))  # a requirement's direction counts too
        power = {c: float((code[:, j] == expect[c]).mean()) for j, c in enumerate(claims)}
        se = math.sqrt(max(fwer * (1 - fwer), 1e-12) / a.reps)
        print(f"{name}: null FWER {fwer:.4f} (se {se:.4f}, {a.reps} families); observed effects: "
              f"decided {float((code != 0).sum(axis=1).mean()):.2f} claims on average; power "
              + ", ".join(f"{c} {p:.2f}" for c, p in power.items())
              + f"; mean seeds {dict(zip(claims, seeds.mean(axis=0).round(1).tolist()))}; CPU-min added {spent.mean():.1f} "
              f"(null {spent0.mean():.1f}); {time.time() - t:.0f} s", flush=True)


if __name__ == "__main__":
    main()
