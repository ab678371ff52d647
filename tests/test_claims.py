"""Claim predicates and verdicts on hand-built results: one claim that holds, one that is
contradicted, one inconclusive, and a claim whose grid is not built."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from mor.claims import CLAIMS, evaluate, interval, load_frames, verdict
from mor.config import ModelConfig, RunConfig, TrainConfig
from mor.results import write_rows

SCHEMES = ("cycle", "sequence", "middle_cycle", "middle_sequence")


def test_interval_by_hand():
    """Effects 1, 2, 3: mean 2, sd 1, t(2 dof) = 4.303: 2 -+ 4.303 / sqrt(3)."""
    mean, lo, hi, n = interval([1.0, 2.0, 3.0])
    half = 4.303 / math.sqrt(3)
    assert (mean, n) == (2.0, 3) and lo == pytest.approx(2 - half) and hi == pytest.approx(2 + half)
    assert verdict(lo, hi, n) == "inconclusive"
    assert verdict(*interval([1.0, 1.1, 0.9])[1:]) == "holds"
    assert verdict(*interval([-1.0, -1.1, -0.9])[1:]) == "contradicted"
    assert verdict(*interval([5.0])[1:]) == "inconclusive"  # one seed: no interval


def _run(seed: int, grid: str = "table10", **model) -> RunConfig:
    return RunConfig(grid=grid, paper_scale="135M", model=ModelConfig(scale="small", **model),
                     train=TrainConfig(seed=seed))


def _row(run: RunConfig, nll: float) -> dict:
    m = run.model
    return {"run_id": run.run_id, "grid": run.grid, "config_hash": run.config_hash, "git_commit": "abc", "mode": "local",
            "scale": m.scale, "paper_scale": run.paper_scale, "seed": run.train.seed, "variant": m.variant,
            "tying": None if m.variant == "vanilla" else m.tying, "num_recursions": m.num_recursions,
            "reduced": m.reduced, "n_params": 1, "unique_layers": 1, "effective_layers": 1, "val_nll": nll,
            "config_json": json.dumps(run.to_dict())}


def _schemes(tmp_path, grid: str):
    """3 seeds. Vanilla 5.0; every scheme 0.1 + a seed offset above it (sharing costs NLL, all
    seeds agree); Sequence best by 0.05 in every seed (the paper says worst: contradicted);
    Middle-Cycle against Cycle and Middle-Sequence flips sign between seeds (inconclusive).
    Written as ``grid`` (table10 holds middle-cycle-safest, deciding the sharing and Sequence
    claims)."""
    noise = {0: 0.00, 1: 0.02, 2: -0.02}
    mc = {0: -0.02, 1: 0.02, 2: 0.0}
    rows = []
    for s in (0, 1, 2):
        rows.append(_row(_run(s, grid), 5.0 + noise[s]))
        for t in SCHEMES:
            nll = 5.1 + noise[s] + (-0.05 if t == "sequence" else 0) + (mc[s] if t == "middle_cycle" else 0)
            rows.append(_row(_run(s, grid, variant="recursive", tying=t, num_recursions=2), nll))
    write_rows(tmp_path / f"{grid}.parquet", rows)


def test_verdicts_on_hand_built_parquet(tmp_path):
    _schemes(tmp_path, "table10")
    _schemes(tmp_path, "deciding")
    frames = load_frames(tmp_path, {c for cl in CLAIMS for c in cl.grids})
    assert set(frames) == {"table10", "deciding"}
    out = evaluate(frames).set_index("claim")
    # sharing costs: recursive - vanilla = mean over schemes of 0.1 - 0.05/4 + mc/4 per seed
    per_seed = [0.1 - 0.0125 + m / 4 for m in (-0.02, 0.02, 0.0)]
    mean, lo, hi, _ = interval(per_seed)
    assert out.loc["sharing-costs", "verdict"] == "holds"
    assert out.loc["sharing-costs", "mean effect"] == pytest.approx(mean, abs=1e-4)
    assert out.loc["sharing-costs", "95% lo"] == pytest.approx(lo, abs=1e-4)
    assert out.loc["sequence-worst", "verdict"] == "contradicted"
    assert out.loc["middle-cycle-safest", "verdict"] == "inconclusive"
    assert out.loc["sequence-worst", "n seeds"] == 3
    # grids that were never built say so instead of failing
    assert out.loc["compute", "verdict"] == "not built" and "table9" in out.loc["compute", "note"]
    assert out.loc["decodes-faster", "verdict"] == "not built"


def test_equivalence_claim_uses_its_margin():
    """KV sharing 'changes NLL little': |difference| of 0.01 in every seed is within the 0.05
    margin (holds); 0.2 in every seed is outside it (contradicted)."""
    claim = next(c for c in CLAIMS if c.id == "kv-sharing-little")

    def frames(diff):
        rows = []
        for s in (0, 1, 2):
            for kv, nll in (("recursion_wise", 5.0), ("shared", 5.0 + diff + 0.001 * s)):
                rows.append({"seed": s, "kv": kv, "variant": "recursive", "paper_scale": "135M", "num_recursions": 3,
                             "tying": "cycle", "val_nll": nll, "config_json": "{}"})
        return {"table15": pd.DataFrame(rows)}

    assert evaluate(frames(0.01), (claim,)).loc[0, "verdict"] == "holds"
    assert evaluate(frames(0.2), (claim,)).loc[0, "verdict"] == "contradicted"


def test_kv_pairs_match_vanilla_by_scale_and_keep_each_pairs_size():
    """A vanilla's num_recursions under kv: shared is its group size (3), its baseline the
    plain vanilla (1); +0.1 and -0.1 do not cancel in the claim's effect."""
    from mor.claims import KV_MARGIN, kv_pairs

    claim = next(c for c in CLAIMS if c.id == "kv-sharing-little")
    rows = [{"seed": 0, "kv": "recursion_wise", "variant": "vanilla", "paper_scale": "135M", "num_recursions": 1,
             "tying": None, "reduced": False, "val_nll": 5.0},
            {"seed": 0, "kv": "shared", "variant": "vanilla", "paper_scale": "135M", "num_recursions": 3,
             "tying": "cycle", "reduced": False, "val_nll": 5.1},
            {"seed": 0, "kv": "recursion_wise", "variant": "recursive", "paper_scale": "135M", "num_recursions": 3,
             "tying": "cycle", "reduced": False, "val_nll": 5.2},
            {"seed": 0, "kv": "shared", "variant": "recursive", "paper_scale": "135M", "num_recursions": 3,
             "tying": "cycle", "reduced": False, "val_nll": 5.1}]
    df = pd.DataFrame(rows)
    assert kv_pairs(df) == pytest.approx([0.1, -0.1])
    assert claim.effect({"table15": df}) == pytest.approx(KV_MARGIN - 0.1)


def test_aux_router_dead_tokens_pairs_by_architecture():
    """Aux router 0.5 / 0.7 dead tokens against aux loss 0.1 / 0.2 (linear / mlp): effect per
    seed = mean(0.4, 0.5) + the seed's offset; the non-base router (alpha 1.0) is ignored."""
    claim = next(c for c in CLAIMS if c.id == "aux-router-dead-tokens")

    def row(seed, aux, arch, dead, alpha=0.1):
        router = {"type": "expert_choice", "func": "sigmoid", "alpha": alpha, "arch": arch, "aux": aux,
                  "aux_coeff": 0.001, "z_loss_coeff": 0.0}
        return {"seed": seed, "dead_token_ratio": dead, "config_json": json.dumps({"model": {"router": router}})}

    offset = {0: 0.0, 1: 0.01, 2: -0.01}
    rows = [r for s in (0, 1, 2) for r in (
        row(s, "aux_router", "linear", 0.5 + offset[s]), row(s, "aux_loss", "linear", 0.1),
        row(s, "aux_router", "mlp", 0.7), row(s, "aux_loss", "mlp", 0.2), row(s, "aux_router", "linear", 0.0, alpha=1.0))]
    out = evaluate({"table13": pd.DataFrame(rows)}, (claim,)).iloc[0]
    mean, lo, hi, _ = interval([0.45 + offset[s] / 2 for s in (0, 1, 2)])
    assert out["verdict"] == "holds" and out["mean effect"] == pytest.approx(mean, abs=1e-4)
    assert out["95% lo"] == pytest.approx(lo, abs=1e-4)


def test_uptraining_middle_best_needs_both_middle_schemes_ahead():
    """Nr=2: Middle-Cycle 5.0 and Middle-Sequence 5.1 against Cycle 5.3, Sequence 5.4 and the
    reduced vanilla 5.2: effect = 5.2 - 5.1 = 0.1. With Middle-Sequence at 5.25 (behind the
    reduced vanilla) the effect turns negative: -0.05."""
    claim = next(c for c in CLAIMS if c.id == "uptraining-middle-best")

    def frame(ms):
        rows = [{"seed": 0, "paper_scale": "135M", "variant": "recursive", "reduced": False, "num_recursions": 2,
                 "tying": t, "val_nll": v}
                for t, v in (("middle_cycle", 5.0), ("middle_sequence", ms), ("cycle", 5.3), ("sequence", 5.4))]
        rows.append({"seed": 0, "paper_scale": "135M", "variant": "vanilla", "reduced": True, "num_recursions": 2,
                     "tying": None, "val_nll": 5.2})
        return {"table12": pd.DataFrame(rows)}

    assert claim.effect(frame(5.1)) == pytest.approx(0.1)
    assert claim.effect(frame(5.25)) == pytest.approx(-0.05)


def test_claims_on_the_deciding_grids_own_runs(tmp_path):
    """Results for every run grids/deciding.yaml expands to (3 seeds), with hand-set effects:
    Recursive Middle-Cycle 0.1 above Vanilla and Sequence 0.05 below it (sharing costs
    (0.1 - 0.05) / 2 = 0.025 > 0 in every seed: holds; Sequence best: contradicted); MoR
    0.08 below Middle-Cycle (holds, effect 0.08); MaxVio 0.5 loss-free vs 0.1 with the loss
    (holds, 0.4); entropy flips sign between seeds (inconclusive). The Vanilla / Recursive rows
    carry router defaults and must not be taken for the balancing pair."""
    from mor.grids import load_grid
    from test_workflow import REPO

    grid = load_grid(REPO / "grids" / "deciding.yaml", "local")
    noise = {0: 0.0, 1: 0.03, 2: -0.02}
    entropy_flip = {0: 0.1, 1: -0.1, 2: 0.05}
    rows = []
    for run in grid.runs:
        c, s = run.config, run.config.train.seed
        m = c.model
        nll = {"vanilla": 5.0, "recursive": 5.1 if m.tying == "middle_cycle" else 4.95, "mor": 5.02}[m.variant] + noise[s]
        extra = {}
        if m.variant == "mor" and m.router.type == "token_choice":
            free = m.router.balancing == "loss_free"
            extra = {"max_vio": 0.5 if free else 0.1, "entropy": 1.0 + (0.0 if free else entropy_flip[s])}
        elif m.variant in ("vanilla", "recursive"):
            extra = {"max_vio": 9.0, "entropy": 9.0}  # would wreck the balancing claims if matched
        rows.append({**_row(c, nll), "router_type": m.router.type if m.variant == "mor" else None, **extra})
    write_rows(tmp_path / "deciding.parquet", rows)
    out = evaluate(load_frames(tmp_path, {"deciding"})).set_index("claim")
    assert out.loc["sharing-costs", "verdict"] == "holds"
    assert out.loc["sharing-costs", "mean effect"] == pytest.approx(0.025, abs=1e-4)
    assert out.loc["sequence-worst", "verdict"] == "contradicted"
    assert out.loc["sequence-worst", "mean effect"] == pytest.approx(-0.15, abs=1e-4)
    assert out.loc["mor-beats-recursive-tokens", "verdict"] == "holds"
    assert out.loc["mor-beats-recursive-tokens", "mean effect"] == pytest.approx(0.08, abs=1e-4)
    assert out.loc["balancing-maxvio", "mean effect"] == pytest.approx(0.4, abs=1e-4)
    assert out.loc["balancing-maxvio", "verdict"] == "holds"
    assert out.loc["balancing-entropy", "verdict"] == "inconclusive"
    assert (out.loc[["sharing-costs", "balancing-maxvio"], "n seeds"] == 3).all()
