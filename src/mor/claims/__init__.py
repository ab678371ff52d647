"""The paper's qualitative claims, each decided from the parquet of the grids it needs.

A claim quotes the paper's sentence it encodes and turns it into comparisons, one number per
seed each, oriented so that > 0 is what the paper says (``predicates``). How a verdict is
reached (``verdict``, formulas in ``mor.stats``, numbers pre-registered in
``grids/claims/claims.yaml``):

    holds         every comparison points the paper's way (intersection-union), or, for a
                  claim of "little change", every comparison's 90% interval is inside
                  +-margin (TOST) -- after Holm across the claims tested with seeds
    contradicted  some comparison points the other way (or lies outside the margin)
    inconclusive  neither after Holm, or too few seeds for the first look
    not built     the grid's results are missing

Seeds come in pre-registered looks with alpha spent across them, so adding seeds to an
undecided claim keeps the error rate. This package reads parquet and pure functions only:
it imports nothing from ``mor.reports`` (the reports import it).

    registry    CLAIMS, the pre-registered spec (margins, paper effects, deciding runs)
    select      picking runs by column or config key
    predicates  each claim's comparisons in one seed
    verdict     evaluate(): the table's rows
    seeding     the adaptive design's rule: where the next round's seeds go (pure)
    rounds      one round from the files: results/claims/round<r>/plan.json (python -m mor.claims.rounds)
    plan_inputs what a round plans with, as the digest that replans rounds (workflows/rules/claims.smk)
    render      load_frames(), render_claims(): tables/claims/
    skew        the skewness of each comparison's per-seed differences (skew.md with --skew)
"""

from mor.claims.predicates import Seed, kv_pairs
from mor.claims.registry import CLAIMS, DECIDING, SPEC_FILE, Claim, Spec, load_specs
from mor.claims.render import load_frames, render_claims
from mor.claims.select import one, pick, seeds_of
from mor.claims.verdict import evaluate, verdict_note

__all__ = ["CLAIMS", "DECIDING", "SPEC_FILE", "Claim", "Seed", "Spec", "evaluate", "kv_pairs", "load_frames", "load_specs",
           "one", "pick", "render_claims", "seeds_of", "verdict_note"]
