"""The paper's qualitative claims, each a predicate over the parquet of the grids it needs.

A claim computes one number per seed, its *effect*, oriented so that a positive effect is
what the paper says (e.g. NLL(Recursive) - NLL(Vanilla) for "weight sharing costs NLL").
Seeds are matched across a grid by ``train.seed``: for seed s the effect uses only the runs
of seed s, so each seed gives one independent replicate of the whole comparison. The
verdict comes from a two-sided 95% t interval of the mean effect over seeds (Student t with
n - 1 degrees of freedom; ``interval``):

    holds         the interval lies above 0 (above ``-margin`` for claims of "little change")
    contradicted  the interval lies below 0 (outside ``[-margin, margin]`` for "little change")
    inconclusive  otherwise, or fewer than 2 seeds (no interval), or the data is not built

Claims of "little change" (KV sharing) use an equivalence margin: the effect is
``margin - |difference|`` per seed, stated with the claim. Every claim names the table or
figure the paper gives as evidence and, where the seeds state one, the paper's number.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd

from mor.metrics.isoflop import optima_by_budget, path_slope

# two-sided 95% Student t quantiles, by degrees of freedom (scipy-free)
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
        12: 2.179, 15: 2.131, 20: 2.086, 30: 2.042, 40: 2.021, 60: 2.000, 120: 1.980}


def t_quantile(dof: int) -> float:
    """The tabulated quantile at the largest tabulated dof <= ``dof`` (never narrower than the
    exact one), the normal 1.960 beyond 120."""
    if dof < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {dof}")
    known = [d for d in sorted(T975) if d <= dof]
    return T975[known[-1]] if dof <= 120 else 1.960


def interval(effects: list[float]) -> tuple[float, float, float, int]:
    """Mean and 95% t interval (lo, hi) of the per-seed effects, and n (nan interval for n < 2)."""
    e = [float(x) for x in effects if x is not None and math.isfinite(x)]
    n = len(e)
    if n == 0:
        return math.nan, math.nan, math.nan, 0
    mean = sum(e) / n
    if n < 2:
        return mean, math.nan, math.nan, n
    sd = math.sqrt(sum((x - mean) ** 2 for x in e) / (n - 1))
    half = t_quantile(n - 1) * sd / math.sqrt(n)
    return mean, mean - half, mean + half, n


def verdict(lo: float, hi: float, n: int) -> str:
    if n < 2 or math.isnan(lo):
        return "inconclusive"
    if lo > 0:
        return "holds"
    if hi < 0:
        return "contradicted"
    return "inconclusive"


# --------------------------------------------------------------------------------------
# Selecting runs
# --------------------------------------------------------------------------------------
def seeds_of(frames: dict[str, pd.DataFrame], grids: tuple[str, ...]) -> list[int]:
    """Seeds present in every grid a claim needs."""
    sets = [set(int(s) for s in frames[g]["seed"]) for g in grids]
    return sorted(set.intersection(*sets)) if sets else []


def _cfg(row, dotted: str):
    node = json.loads(row["config_json"])
    for k in dotted.split("."):
        node = node.get(k) if isinstance(node, dict) else None
    return node


def pick(df: pd.DataFrame, **where) -> pd.DataFrame:
    """Rows matching every column == value (a column of the frame or a dotted config key)."""
    mask = pd.Series(True, index=df.index)
    for key, value in where.items():
        key = key.replace("__", ".")
        if key in df.columns:
            col = df[key]
        else:
            col = df.apply(lambda r: _cfg(r, key), axis=1)
        mask &= col.map(lambda v: v == value)
    return df[mask]


def one(df: pd.DataFrame, metric: str = "val_nll", **where) -> float:
    """The metric of the single run matching ``where`` (nan when none)."""
    rows = pick(df, **where)
    if len(rows) == 0:
        return math.nan
    if len(rows) > 1:
        raise ValueError(f"{len(rows)} runs match {where}; a claim must name one run per seed")
    return float(rows[metric].iloc[0])


def scale_key(s: str) -> float:
    """Parameters a paper scale name stands for ('135M' < '1.7B'); unknown names last."""
    try:
        return float(s[:-1]) * {"M": 1e6, "B": 1e9}.get(s[-1], 1)
    except ValueError:
        return float("inf")


def _nanmean(values: list[float]) -> float:
    v = [x for x in values if math.isfinite(x)]
    return float(np.mean(v)) if v else math.nan


# --------------------------------------------------------------------------------------
# The claims
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Claim:
    id: str
    statement: str
    evidence: str  # the paper's table / figure and, where stated, its number
    grids: tuple[str, ...]
    effect: Callable[[dict[str, pd.DataFrame]], float]  # frames of ONE seed -> effect (> 0 = as the paper says)
    effect_doc: str  # what the effect is, in words
    margin: float = 0.0  # equivalence claims: effect = margin - |difference|
    extra: tuple[str, ...] = field(default=())  # files beside the parquet it reads (analysis npz)


def _compute_gain(f) -> float:
    """table9: NLL at the smallest budget - at the largest, mean over variant x scale."""
    df = f["table9"]
    lo, hi = df["budget_flops"].min(), df["budget_flops"].max()
    cells = df[["variant", "paper_scale"]].drop_duplicates().itertuples(index=False)
    return _nanmean([one(df, variant=v, paper_scale=s, budget_flops=lo) - one(df, variant=v, paper_scale=s, budget_flops=hi)
                     for v, s in cells])


DECIDING = "deciding"  # grids/deciding.yaml: the runs trained long enough, with seeds, to decide NLL claims


def _sharing_cost(f) -> float:
    """deciding: NLL(Recursive) - NLL(Vanilla, same scale), mean over scale x Nr x scheme."""
    df = f[DECIDING]
    rec = df[df["variant"] == "recursive"]
    return _nanmean([r["val_nll"] - one(df, variant="vanilla", reduced=False, paper_scale=r["paper_scale"])
                     for _, r in rec.iterrows()])


def _mor_vs_recursive(f) -> float:
    """table9: NLL(Recursive) - NLL(MoR), mean over scale x budget (equal FLOPs)."""
    df = f["table9"]
    cells = df[["paper_scale", "budget_flops"]].drop_duplicates().itertuples(index=False)
    return _nanmean([one(df, variant="recursive", paper_scale=s, budget_flops=b) - one(df, variant="mor", paper_scale=s, budget_flops=b)
                     for s, b in cells])


def _mor_catches_up(f) -> float:
    """table9: the MoR - Vanilla NLL gap at the smallest scale minus at the largest (> 0: the gap
    closes as scale grows), mean over budgets."""
    df = f["table9"]
    scales = sorted(df["paper_scale"].unique(), key=scale_key)
    gaps = []
    for b in sorted(df["budget_flops"].unique()):
        gap = [one(df, variant="mor", paper_scale=s, budget_flops=b) - one(df, variant="vanilla", paper_scale=s, budget_flops=b)
               for s in (scales[0], scales[-1])]
        gaps.append(gap[0] - gap[1])
    return _nanmean(gaps)


def _mor_vs_recursive_tokens(f) -> float:
    """deciding: NLL(Recursive) - NLL(MoR expert-choice), same scale, tying and Nr, equal tokens
    (MoR then spends fewer FLOPs), mean over the matched pairs."""
    df = f[DECIDING]
    mor = df[(df["variant"] == "mor") & (df["router_type"] == "expert_choice")]
    return _nanmean([one(df, variant="recursive", paper_scale=r["paper_scale"], tying=r["tying"],
                         num_recursions=int(r["num_recursions"])) - float(r["val_nll"]) for _, r in mor.iterrows()])


def _mor_beats_vanilla(f) -> float:
    """table9: NLL(Vanilla) - NLL(MoR) at every scale from 360M up, mean over scale x budget."""
    df = f["table9"]
    cells = df[["paper_scale", "budget_flops"]].drop_duplicates().itertuples(index=False)
    return _nanmean([one(df, variant="vanilla", paper_scale=s, budget_flops=b) - one(df, variant="mor", paper_scale=s, budget_flops=b)
                     for s, b in cells if scale_key(s) >= 360e6])


def _scheme_nlls(df, with_cells: bool = False) -> list:
    """Per (scale, Nr) cell of the Recursive runs, each tying scheme's NLL (nan where not
    trained); ``with_cells``: ((scale, Nr), NLLs) pairs."""
    rec = df[df["variant"] == "recursive"]
    cells = [(s, int(nr)) for s, nr in rec[["paper_scale", "num_recursions"]].drop_duplicates().itertuples(index=False)]
    nlls = [{t: one(df, variant="recursive", paper_scale=s, num_recursions=nr, tying=t)
             for t in ("cycle", "sequence", "middle_cycle", "middle_sequence")} for s, nr in cells]
    return list(zip(cells, nlls)) if with_cells else nlls


def _sequence_worst(f) -> float:
    """deciding: NLL(Sequence) - the highest NLL of the other schemes the grid trained (> 0:
    Sequence is the worst), mean over scale x Nr."""
    out = []
    for nll in _scheme_nlls(f[DECIDING]):
        others = [v for t, v in nll.items() if t != "sequence" and math.isfinite(v)]
        out.append(nll["sequence"] - max(others) if others else math.nan)
    return _nanmean(out)


def _middle_cycle_safest(f) -> float:
    """table10: mean NLL(Cycle, Middle-Sequence) - NLL(Middle-Cycle), mean over scale x Nr:
    Middle-Cycle against the schemes it competes with (Sequence, the worst, left out)."""
    return _nanmean([_nanmean([nll["cycle"], nll["middle_sequence"]]) - nll["middle_cycle"]
                     for nll in _scheme_nlls(f["table10"])])


def _middle_cycle_equal_unique(f) -> float:
    df = f["table11"]
    return one(df, tying="cycle") - one(df, tying="middle_cycle")


def _uptraining_middle_best(f) -> float:
    """table12: the lowest NLL among Cycle, Sequence and the reduced vanilla minus the higher
    of Middle-Cycle and Middle-Sequence (> 0: both Middle schemes beat every other), mean over Nr."""
    df = f["table12"]
    out = []
    for (scale, nr), nll in _scheme_nlls(df, with_cells=True):
        middle = [nll["middle_cycle"], nll["middle_sequence"]]
        others = [nll["cycle"], nll["sequence"], one(df, variant="vanilla", reduced=True, paper_scale=scale, num_recursions=nr)]
        others = [v for v in others if math.isfinite(v)]
        out.append(min(others) - max(middle) if others and all(math.isfinite(v) for v in middle) else math.nan)
    return _nanmean(out)


def _aux_router_dead_tokens(f) -> float:
    """table13: dead-token ratio(aux router) - dead-token ratio(aux loss), same router
    architecture and otherwise the base router, mean over architectures."""
    df = f["table13"]
    base = dict(model__router__func="sigmoid", model__router__alpha=0.1, model__router__aux_coeff=0.001,
                model__router__z_loss_coeff=0.0)
    archs = sorted({_cfg(r, "model.router.arch") for _, r in df.iterrows()} - {None})
    return _nanmean([one(df, "dead_token_ratio", model__router__aux="aux_router", model__router__arch=a, **base)
                     - one(df, "dead_token_ratio", model__router__aux="aux_loss", model__router__arch=a, **base)
                     for a in archs])


BASE_TOKEN_CHOICE = dict(model__variant="mor", model__router__type="token_choice", model__router__func="softmax", model__router__arch="linear",
                         model__router__z_loss_coeff=0.0, model__router__balance_coeff=0.1)


def _balancing(metric: str, sign: float):
    """deciding's `balancing` pair (table14's base router: linear, softmax, coefficient 0.1, no
    z-loss): sign x (metric(loss-free) - metric(balancing loss))."""
    def effect(f) -> float:
        df = f[DECIDING]
        loss = one(df, metric, model__router__balancing="loss", **BASE_TOKEN_CHOICE)
        free = one(df, metric, model__router__balancing="loss_free", **BASE_TOKEN_CHOICE)
        return sign * (free - loss)
    return effect


def _separation(f) -> float:
    """fig5b's runs (grids/fig5c.yaml: MoR, expert-choice with the aux loss): mean router output
    of selected minus unselected tokens, averaged over the recursions that have unselected tokens."""
    df = f["fig5c"]
    rows = pick(df, model__router__aux="aux_loss")
    out = []
    for h in rows["router_output_hist"].dropna():
        for rec in json.loads(h):
            if not rec["n_unselected"] or not rec["n_selected"]:
                continue
            edges = np.asarray(rec["bin_edges"])
            centre = (edges[:-1] + edges[1:]) / 2
            out.append(float(centre @ np.asarray(rec["selected"]) - centre @ np.asarray(rec["unselected"])))
    return _nanmean(out)


def _deeper_is_better(f) -> float:
    """fig5c: NLL with the depth capped at 1 minus NLL at full depth, mean over models."""
    df = f["fig5c"]
    if "depth_cap_nll_1" not in df.columns:
        return math.nan
    return _nanmean(list(df["depth_cap_nll_1"] - df["val_nll"]))


KV_MARGIN = 0.05


def kv_pairs(df: pd.DataFrame) -> list[float]:
    """table15: NLL(kv shared) - NLL(recursion-wise) for each shared-KV run and its baseline:
    the same variant and scale; Recursive / MoR also the same tying and Nr (a vanilla's
    num_recursions is its KV-sharing group size, and its baseline is the plain vanilla)."""
    out = []
    for _, r in df[df["kv"] == "shared"].iterrows():
        base = df[(df["kv"] == "recursion_wise") & (df["variant"] == r["variant"]) & (df["paper_scale"] == r["paper_scale"])]
        if r["variant"] == "vanilla":
            base = base[~base["reduced"].astype(bool)] if "reduced" in base.columns else base
        else:
            base = base[(base["num_recursions"] == r["num_recursions"]) & (base["tying"] == r["tying"])]
        if len(base) == 1:
            out.append(float(r["val_nll"]) - float(base["val_nll"].iloc[0]))
    return out


def _kv_little(f) -> float:
    """table15: margin - mean |NLL(kv shared) - NLL(recursion-wise)| over matched pairs (each
    pair's size counts: +0.1 and -0.1 do not cancel)."""
    d = [abs(x) for x in kv_pairs(f["table15"])]
    return KV_MARGIN - _nanmean(d) if d else math.nan


def _flatter_path(f) -> float:
    """table9: |slope of Vanilla's optimal path| - |slope of MoR's| (dNLL per decade of
    parameters through the stars, the line of Fig. 5a; > 0: MoR's path is flatter, § 5.1's
    reading: it benefits more from parameters). The size exponent a (N* ~ C^a) is in
    tables/table9/optimal_path.csv beside it."""
    slopes = {v: path_slope(optima_by_budget(f["table9"][f["table9"]["variant"] == v])) for v in ("mor", "vanilla")}
    return abs(slopes["vanilla"]) - abs(slopes["mor"])


def _decodes_faster(f) -> float:
    """fig4a: MoR's decoding tokens/s at batch 32 over Vanilla's, minus 1, mean over MoR models."""
    df = f["fig4a"]
    col = "decode_tokens_per_s_fixed"
    if col not in df.columns:
        return math.nan
    van = _nanmean(list(df[df["variant"] == "vanilla"][col]))
    return _nanmean([v / van - 1 for v in df[df["variant"] == "mor"][col]])


CLAIMS: tuple[Claim, ...] = (
    Claim("compute", "More compute gives lower NLL", "Table 9 text", ("table9",), _compute_gain,
          "NLL at the smallest budget - at the largest, mean over variant x scale"),
    Claim("sharing-costs", "Weight sharing alone (Recursive) costs NLL against Vanilla", "Table 9 text; Table 10",
          (DECIDING,), _sharing_cost, "NLL(Recursive) - NLL(Vanilla, same scale), mean over scale x Nr x scheme"),
    Claim("mor-beats-recursive", "MoR beats Recursive at equal compute", "Table 9", ("table9",), _mor_vs_recursive,
          "NLL(Recursive) - NLL(MoR) at equal budget and scale, mean over cells"),
    Claim("mor-beats-recursive-tokens", "MoR beats Recursive at equal tokens, i.e. with fewer FLOPs",
          "Table 3 / Table 9 (at equal compute MoR trains more tokens)", (DECIDING,), _mor_vs_recursive_tokens,
          "NLL(Recursive) - NLL(MoR expert-choice), same scale, tying, Nr and tokens"),
    Claim("mor-catches-up", "MoR catches up with Vanilla as scale grows", "Table 9 text",
          ("table9",), _mor_catches_up, "(MoR - Vanilla NLL) at the smallest scale minus at the largest, mean over budgets"),
    Claim("mor-beats-vanilla", "MoR beats Vanilla from 360M upward, with about a third of the parameters",
          "Table 9 text", ("table9",), _mor_beats_vanilla,
          "NLL(Vanilla) - NLL(MoR) at equal budget, scales >= 360M, mean over scale x budget"),
    Claim("sequence-worst", "Sequence is the worst tying scheme (checked against the schemes the deciding grid "
          "trains: Middle-Cycle, 135M Nr=2)", "App. F, Table 10 (worst in all four settings)",
          (DECIDING,), _sequence_worst, "NLL(Sequence) - the highest NLL of the other schemes trained, mean over scale x Nr"),
    Claim("middle-cycle-safest", "Middle-Cycle is the safest tying scheme", "App. F, Table 10 (135M Nr=2: Cycle "
          "3.0071 < Middle-Cycle 3.0330; Nr=3: Middle-Cycle 3.1048 < Cycle 3.1154)", ("table10",), _middle_cycle_safest,
          "mean NLL(Cycle, Middle-Sequence) - NLL(Middle-Cycle), mean over scale x Nr"),
    Claim("middle-cycle-equal-unique", "At equal unique layers Middle-Cycle beats Cycle", "Table 11 (730M: NLL "
          "2.7552 vs 2.7573, acc 42.32 vs 41.90)", ("table11",), _middle_cycle_equal_unique,
          "NLL(Cycle, 10x3) - NLL(Middle-Cycle, 1+8x3+1)"),
    Claim("uptraining-middle-best", "Under up-training both Middle schemes beat the other schemes and the reduced "
          "baselines", "App. F, Table 12", ("table12",), _uptraining_middle_best,
          "min NLL(Cycle, Sequence, reduced vanilla) - max NLL(Middle-Cycle, Middle-Sequence), mean over Nr"),
    Claim("aux-separates", "The expert-choice router with aux loss separates selected from unselected tokens",
          "§ 5.2, Fig. 5b (scores near 1.0 vs 0.0)", ("fig5c",), _separation,
          "mean router output of selected - unselected tokens, aux-loss runs, mean over recursions"),
    Claim("deeper-recursion", "Deeper recursion at inference lowers NLL", "§ 5.3, Fig. 5c", ("fig5c",), _deeper_is_better,
          "NLL with depth capped at 1 - NLL at full depth, mean over MoR models"),
    Claim("aux-router-dead-tokens", "An auxiliary router gives more dead tokens than the auxiliary loss",
          "App. G.3, Table 13 (dead-token ratio up to 66.7% in some aux-router variants)", ("table13",),
          _aux_router_dead_tokens, "dead-token ratio(aux router) - (aux loss), same architecture, mean over architectures"),
    Claim("balancing-maxvio", "The balancing loss lowers MaxVio against loss-free balancing", "App. G.3, Table 14",
          (DECIDING,), _balancing("max_vio", 1.0), "MaxVio(loss-free) - MaxVio(balancing loss), table14's base router"),
    Claim("balancing-entropy", "The balancing loss raises the routing entropy against loss-free balancing",
          "App. G.3, Table 14", (DECIDING,), _balancing("entropy", -1.0),
          "entropy(balancing loss) - entropy(loss-free), table14's base router"),
    Claim("kv-sharing-little", "KV sharing changes NLL little", "App. H.2, Table 15", ("table15",), _kv_little,
          f"{KV_MARGIN} - mean |NLL(shared) - NLL(recursion-wise)| over matched pairs (margin {KV_MARGIN} NLL)",
          margin=KV_MARGIN),
    Claim("flatter-path", "MoR's compute-optimal path is flatter (it benefits more from parameters)",
          "§ 5.1, Fig. 5a", ("table9",), _flatter_path,
          "|path slope(Vanilla)| - |path slope(MoR)|, dNLL per decade of parameters through the stars"),
    Claim("decodes-faster", "MoR decodes faster than Vanilla", "App. E, Fig. 4a (up to ~2x)", ("fig4a",),
          _decodes_faster, "tokens/s(MoR) / tokens/s(Vanilla) - 1 at batch 32, mean over MoR models"),
)


def load_frames(results_dir: Path, grids: set[str]) -> dict[str, pd.DataFrame]:
    """The grids' results that exist (a missing one makes its claims 'not built')."""
    from mor.results import read_frame

    out = {}
    for g in sorted(grids):
        p = Path(results_dir) / f"{g}.parquet"
        if p.exists():
            out[g] = read_frame(p)
    if "fig5c" in out:  # fig5c's capped NLLs live in the depth_cap analysis files
        out["fig5c"] = _with_depth_cap(Path(results_dir), out["fig5c"])
    return out


def _with_depth_cap(results_dir: Path, df: pd.DataFrame) -> pd.DataFrame:
    df = df.copy()
    vals = []
    for _, r in df.iterrows():
        p = results_dir / "runs" / r["grid"] / f"{r['run_id']}.depth_cap.npz"
        if p.exists():
            a = np.load(p)
            vals.append(float(a["val_nll"][list(a["max_depth"]).index(1)]))
        else:
            vals.append(math.nan)
    df["depth_cap_nll_1"] = vals
    return df


def evaluate(frames: dict[str, pd.DataFrame], claims: tuple[Claim, ...] = CLAIMS) -> pd.DataFrame:
    """One row per claim: the effect per seed, its mean and 95% interval, n, the verdict."""
    rows = []
    for c in claims:
        row = {"claim": c.id, "statement": c.statement, "paper evidence": c.evidence, "effect": c.effect_doc,
               "grids": ", ".join(c.grids)}
        missing = [g for g in c.grids if g not in frames]
        if missing:
            rows.append({**row, "verdict": "not built", "n seeds": 0,
                         "note": f"results/{missing[0]}.parquet is not built; run its grid to decide this claim"})
            continue
        seeds = seeds_of(frames, c.grids)
        per_seed = []
        for s in seeds:
            per_seed.append(c.effect({g: frames[g][frames[g]["seed"] == s] for g in c.grids}))
        mean, lo, hi, n = interval(per_seed)
        v = verdict(lo, hi, n)
        note = "one seed: no interval" if n == 1 else ("no matching runs" if n == 0 else "")
        if c.margin and v == "holds":
            note = f"|difference| < {c.margin} with 95% confidence"
        if c.margin and v == "contradicted":
            note = f"|difference| > {c.margin} with 95% confidence"
        rows.append({**row, "verdict": v, "n seeds": n, "mean effect": _round(mean), "95% lo": _round(lo),
                     "95% hi": _round(hi), "per seed": ", ".join(f"{e:.4g}" for e in per_seed), "note": note})
    return pd.DataFrame(rows)


def _round(v: float):
    return None if v is None or not math.isfinite(v) else round(float(v), 4)


VERDICT_NOTE = ("Verdicts: a two-sided 95% Student t interval of the mean per-seed effect (n - 1 degrees of freedom; "
                "each seed's effect uses only that seed's runs). holds = interval above 0; contradicted = below 0; "
                "inconclusive = it contains 0, or fewer than 2 seeds; not built = the grid's results are missing. "
                "The effect is oriented so that > 0 is what the paper says.")


def render_claims(results_dir: Path, out: Path, mode: str) -> list[Path]:
    """``tables/claims/``: claims.md (the table and how verdicts are decided), claims.csv and
    claims.html (the report shows HTML in place), swapped in whole (``mor.atomic.replace_dir``).
    Written here, not through ``mor.reports``: claims read parquet and pure functions only."""
    import html

    from mor.atomic import remove_stale, replace_dir, temp_sibling

    frames = load_frames(Path(results_dir), {g for c in CLAIMS for g in c.grids})
    table = evaluate(frames)
    counts = table["verdict"].value_counts().to_dict()
    summary = ", ".join(f"{counts.get(v, 0)} {v}" for v in ("holds", "contradicted", "inconclusive", "not built"))
    commits = sorted({c[:12] for df in frames.values() for c in df["git_commit"].unique()})
    shown = table.drop(columns=["effect", "grids"]).astype(object).where(table.drop(columns=["effect", "grids"]).notna(), "")
    title = f"The paper's claims, checked (mode '{mode}')"
    intro = (f"{summary}. From {results_dir} (grids {', '.join(sorted(frames)) or 'none'}; "
             f"commit(s) {', '.join(commits) or '-'}).")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    remove_stale(out.parent)
    tmp = temp_sibling(out)
    tmp.mkdir()
    try:
        (tmp / "claims.md").write_text(
            f"# {title}\n\n{intro}\n\n{VERDICT_NOTE}\n\n" + shown.to_markdown(index=False) + "\n\n## Effects\n\n"
            + "\n".join(f"- **{r['claim']}** ({r['grids']}): {r['effect']}" for _, r in table.iterrows()) + "\n")
        table.to_csv(tmp / "claims.csv", index=False)
        body = "".join(f"<p>{html.escape(p)}</p>" for p in (intro, VERDICT_NOTE))
        (tmp / "claims.html").write_text(
            f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>claims</title></head><body>"
            f"<h2>{html.escape(title)}</h2>{body}{table.to_html(index=False, na_rep='', border=0, classes='mor-table')}"
            f"</body></html>\n")
        replace_dir(tmp, out)
    finally:
        if tmp.exists():
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)
    return sorted(out.iterdir())
