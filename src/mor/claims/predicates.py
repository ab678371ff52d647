"""Each claim's comparisons in ONE seed: the frames of that seed's runs -> ``Seed``.

A comparison is one number oriented so that > 0 is what the paper says (superiority
claims), or a signed difference that should lie inside +-margin (equivalence claims). A
claim of "A is best" has one comparison per competitor and per cell, never their mean: it
holds only if every one of them holds (``mor.stats.superiority_p``). A comparison whose run
is missing is nan (the seed is then dropped and counted, ``mor.claims.verdict``); a
comparison a predicate leaves out on purpose is named in ``Seed.dropped``.

Protocol: the NLL comparisons read ``val_nll``, the authors' evaluation protocol (the training
forward, expert-choice top-k over the whole sequence, the router seeing future tokens), the
one the paper's NLL sentences were measured with; never ``val_nll_causal`` (the decoding
decision). No claim reads an lm-eval accuracy (docs/accuracy.md, "Which one a table and a
claim read").
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from mor.claims.select import cfg, one, pick, rows, scale_key
from mor.metrics.isoflop import optima_by_budget, path_slope

DECIDING = "deciding"  # grids/deciding.yaml: the runs trained long enough, with seeds, to decide NLL claims
SCHEMES = ("cycle", "sequence", "middle_cycle", "middle_sequence")


@dataclass
class Seed:
    """One seed's comparisons (label -> value) and what the predicate left out, and why."""

    values: dict[str, float] = field(default_factory=dict)
    dropped: list[str] = field(default_factory=list)
    metrics: dict[str, str] = field(default_factory=dict)  # label -> its metric, where not the claim's own
    # what the table describes beside the test, never tested (mor.claims.verdict: its mean over
    # the seeds read, in the note): name -> this seed's value
    described: dict[str, float] = field(default_factory=dict)


def _records(df: pd.DataFrame, **where) -> list[dict]:
    """The rows matching ``where`` (``pick``'s rule) as dicts (column -> value), with the values
    ``iterrows`` gives (both read ``df.values``): the per-seed predicates read a few rows each,
    and a Series per row (or pandas' ``to_dict``, or a masked copy of the frame) was a third of a
    verdict's time (benchmarks/bench_claims_null.py)."""
    columns, keep = list(df.columns), rows(df, **where)
    values = df.values
    return [dict(zip(columns, values[i])) for i in keep]


def _cell(scale, nr) -> str:
    return f"{scale} Nr={int(nr)}"


def compute_gain(f, spec) -> Seed:
    """table9, per variant and each consecutive pair of budgets: NLL of the best model (any
    scale) at the smaller budget - NLL of the best at the larger ("more compute consistently
    leads to better models": the model a budget buys, its isoFLOP optimum). At one fixed size
    a larger budget is only more tokens, so the earlier per-scale comparison was true almost by
    construction, and it missed a budget whose best model is no better than the last one's."""
    df, out = f["table9"], Seed()
    budgets = sorted(df["budget_flops"].dropna().unique())
    for v in sorted(df["variant"].dropna().unique()):
        best = {b: df[(df["variant"] == v) & (df["budget_flops"] == b)]["val_nll"].min() for b in budgets}
        for lo, hi in zip(budgets, budgets[1:]):
            out.values[f"{v} {lo:.3g}->{hi:.3g}"] = float(best[lo] - best[hi])
    return out


def sharing_cost(f, spec) -> Seed:
    """deciding, per Recursive run (scale, tying, Nr): NLL(Recursive) - NLL(Vanilla, same scale)."""
    df, out = f[DECIDING], Seed()
    for r in _records(df, variant="recursive"):
        out.values[f"{r['tying']} {_cell(r['paper_scale'], r['num_recursions'])}"] = (
            float(r["val_nll"]) - one(df, variant="vanilla", reduced=False, paper_scale=r["paper_scale"]))
    return out


def mor_vs_recursive(f, spec) -> Seed:
    """table9, per (scale, budget): NLL(Recursive) - NLL(MoR) at equal FLOPs."""
    df, out = f["table9"], Seed()
    for s, b in sorted(df[["paper_scale", "budget_flops"]].drop_duplicates().itertuples(index=False)):
        out.values[f"{s} {b:.3g}"] = (one(df, variant="recursive", paper_scale=s, budget_flops=b)
                                      - one(df, variant="mor", paper_scale=s, budget_flops=b))
    return out


def mor_vs_recursive_tokens(f, spec) -> Seed:
    """deciding, per MoR expert-choice run: NLL(Recursive, same scale, tying, Nr) - NLL(MoR)
    at equal tokens (MoR then spends fewer FLOPs)."""
    df, out = f[DECIDING], Seed()
    for r in _records(df, variant="mor", router_type="expert_choice"):
        out.values[f"{r['tying']} {_cell(r['paper_scale'], r['num_recursions'])}"] = (
            one(df, variant="recursive", paper_scale=r["paper_scale"], tying=r["tying"],
                num_recursions=int(r["num_recursions"])) - float(r["val_nll"]))
    return out


def _scales(df) -> list[str]:
    return sorted(df["paper_scale"].unique(), key=scale_key)


def mor_catches_up(f, spec) -> Seed:
    """table9, per budget: the MoR - Vanilla NLL gap at the smallest scale minus at the
    largest (> 0: the gap closes as scale grows)."""
    df, out = f["table9"], Seed()
    scales = _scales(df)
    for b in sorted(df["budget_flops"].dropna().unique()):
        gap = [one(df, variant="mor", paper_scale=s, budget_flops=b) - one(df, variant="vanilla", paper_scale=s, budget_flops=b)
               for s in (scales[0], scales[-1])]
        out.values[f"{b:.3g}"] = gap[0] - gap[1]
    return out


def mor_beats_vanilla(f, spec) -> Seed:
    """table9, per (scale, budget) at every scale of the ladder but its smallest: NLL(Vanilla)
    - NLL(MoR). The paper's "from 360M upward" is every scale of its ladder (135M, 360M, 730M,
    1.7B) above the smallest; the same rank, not a size, is used on any ladder (the CPU
    stand-ins of 360M are a few hundred thousand parameters, where 360M means nothing)."""
    df, out = f["table9"], Seed()
    scales = _scales(df)
    out.dropped += [f"{scales[0]} (the smallest scale: the paper's 135M, before MoR catches up)"] if scales else []
    for s in scales[1:]:
        for b in sorted(df[df["paper_scale"] == s]["budget_flops"].dropna().unique()):
            out.values[f"{s} {b:.3g}"] = (one(df, variant="vanilla", paper_scale=s, budget_flops=b)
                                          - one(df, variant="mor", paper_scale=s, budget_flops=b))
    return out


def _scheme_cells(df) -> list[tuple[str, int]]:
    rec = df[df["variant"] == "recursive"]
    return sorted((s, int(nr)) for s, nr in rec[["paper_scale", "num_recursions"]].drop_duplicates().itertuples(index=False))


def _scheme_nll(df, scale, nr, tying) -> float:
    return one(df, variant="recursive", paper_scale=scale, num_recursions=nr, tying=tying)


def _rival(out: Seed, label: str, df, metric: str = "val_nll", **where) -> float:
    """A competitor's metric (nan when it cannot be compared). A competitor the grid does not
    train is simply absent; one whose run exists but whose metric is nan (a diverged or
    unscored run) is named in ``out.dropped``, so "A is best" never silently loses a rival."""
    value = one(df, metric, **where)
    if not math.isfinite(value) and len(pick(df, **where)):
        out.dropped.append(f"{label} (its run's {metric} is nan)")
    return value


def sequence_worst(f, spec) -> Seed:
    """table10, in every (scale, Nr) setting it trains (the paper's "all four settings") and
    against each of the three other schemes: NLL(Sequence) - NLL(other). The deciding grid's
    one cell (Sequence vs Middle-Cycle at 135M Nr=2) was a quarter of one setting's claim."""
    df, out = f["table10"], Seed()
    for scale, nr in _scheme_cells(df):
        seq = _scheme_nll(df, scale, nr, "sequence")
        for t in SCHEMES:
            if t == "sequence":
                continue
            other = _rival(out, f"{t} {_cell(scale, nr)}", df, variant="recursive", paper_scale=scale,
                           num_recursions=nr, tying=t)
            if math.isfinite(other):
                out.values[f"{t} {_cell(scale, nr)}"] = seq - other
    return out


def middle_cycle_safest(f, spec) -> Seed:
    """table10, per (scale, Nr) and every other scheme trained: NLL(other) - NLL(Middle-Cycle),
    except the comparisons the paper itself reports the other way (``spec.exclude``: Cycle at
    135M Nr=2), which are named in the note."""
    df, out = f["table10"], Seed()
    skip = {(e["paper_scale"], int(e["num_recursions"]), e["competitor"]) for e in spec.exclude}
    for scale, nr in _scheme_cells(df):
        mc = _scheme_nll(df, scale, nr, "middle_cycle")
        for t in SCHEMES:
            if t == "middle_cycle":
                continue
            other = _rival(out, f"{t} {_cell(scale, nr)}", df, variant="recursive", paper_scale=scale,
                           num_recursions=nr, tying=t)
            if not math.isfinite(other):
                continue
            if (scale, nr, t) in skip:
                out.dropped.append(f"{t} {_cell(scale, nr)} (the paper reports it ahead there)")
                continue
            out.values[f"{t} {_cell(scale, nr)}"] = other - mc
    return out


def middle_cycle_equal_unique(f, spec) -> Seed:
    """table11: NLL(Cycle, 10x3) - NLL(Middle-Cycle, 1+8x3+1)."""
    df = f["table11"]
    return Seed({"cycle": one(df, tying="cycle") - one(df, tying="middle_cycle")})


def uptraining_middle_best(f, spec) -> Seed:
    """table12, per Nr: NLL(competitor) - NLL(Middle scheme) for both Middle schemes against
    Cycle, Sequence and the reduced vanilla of that Nr."""
    df, out = f["table12"], Seed()
    for scale, nr in _scheme_cells(df):
        where = {t: dict(variant="recursive", tying=t) for t in ("cycle", "sequence")}
        where["reduced vanilla"] = dict(variant="vanilla", reduced=True)
        rivals = {name: _rival(out, f"{name} {_cell(scale, nr)}", df, paper_scale=scale, num_recursions=nr, **w)
                  for name, w in where.items()}
        for middle in ("middle_cycle", "middle_sequence"):
            m = _scheme_nll(df, scale, nr, middle)
            for name, v in rivals.items():
                if math.isfinite(v):
                    out.values[f"{middle} vs {name} {_cell(scale, nr)}"] = v - m
    return out


BASE_EXPERT_CHOICE = dict(model__router__func="sigmoid", model__router__alpha=0.1, model__router__aux_coeff=0.001,
                          model__router__z_loss_coeff=0.0)


def linear_aux_loss_fewest_dead(f, spec) -> Seed:
    """table13, base router otherwise, per auxiliary-router architecture: dead-token
    ratio(aux router, arch) - dead-token ratio(linear router, aux loss) ("employing a linear
    router ... with auxiliary loss effectively reduces the dead token ratio", against the
    aux-router variants the paragraph names), and "without compromising sampling accuracy":
    sampling accuracy(linear, aux loss) - sampling accuracy(aux router, arch) + ``spec.ni_margin``
    (> 0: no worse by the margin or more; a non-inferiority test). The other aux-loss
    architectures are not rivals: the paper does not say linear beats them."""
    df, out = f["table13"], Seed()
    base = dict(model__router__aux="aux_loss", model__router__arch="linear", **BASE_EXPERT_CHOICE)
    best = one(df, "dead_token_ratio", **base)
    acc = one(df, "sampling_accuracy", **base) if "sampling_accuracy" in df.columns else math.nan
    archs = sorted({cfg(r, "model.router.arch") for _, r in df.iterrows()} - {None})
    for a in archs:
        where = dict(model__router__aux="aux_router", model__router__arch=a, **BASE_EXPERT_CHOICE)
        v = _rival(out, f"aux_router {a}", df, "dead_token_ratio", **where)
        if not math.isfinite(v):
            continue
        out.values[f"aux_router {a}"] = v - best
        if spec.ni_margin:
            label = f"sampling accuracy vs aux_router {a}"
            rival = _rival(out, label, df, "sampling_accuracy", **where) if "sampling_accuracy" in df.columns else math.nan
            out.values[label] = acc - rival + spec.ni_margin
            out.metrics[label] = "sampling_accuracy"
    return out


BASE_TOKEN_CHOICE = dict(model__variant="mor", model__router__type="token_choice", model__router__func="softmax",
                         model__router__arch="linear", model__router__z_loss_coeff=0.0, model__router__balance_coeff=0.1)


def assignment_entropy(loads) -> float:
    """Entropy (nats) of the share of tokens each depth is assigned: H = -sum_i q_i log q_i with
    q_i = Load_i / N. App. G.2's "average probability of selecting the i-th expert over all
    tokens" for the selection the router makes: top-1 of probs + bias (``TokenChoiceRouter.choose``),
    so loss-free balancing's bias is in it, as in MaxVio's Load_i. ``loads``: tokens per depth, the
    eval's ``depth_histogram`` (a token-choice token's depth is its assignment + 1, mor.eval.nll);
    nan when absent or empty."""
    if loads is None or (isinstance(loads, float) and math.isnan(loads)):
        return math.nan
    q = np.asarray(loads, dtype=np.float64)
    if q.size == 0 or q.sum() <= 0:
        return math.nan
    q = q[q > 0] / q.sum()
    return float(-(q * np.log(q)).sum())


def _balancing_metric(df: pd.DataFrame, metric: str, balancing: str) -> float:
    if metric != "assignment_entropy":
        return one(df, metric, model__router__balancing=balancing, **BASE_TOKEN_CHOICE)
    at = rows(df, model__router__balancing=balancing, **BASE_TOKEN_CHOICE)
    if len(at) > 1:
        raise ValueError(f"{len(at)} runs of the {balancing} balancing pair in one seed")
    return assignment_entropy(df["depth_histogram"].iloc[at[0]]) if len(at) and "depth_histogram" in df else math.nan


def balancing(metric: str, sign: float):
    """deciding's `balancing` pair (table14's base router): sign x (metric(loss-free) -
    metric(balancing loss)). The sentence's "without sacrificing overall model performance" is
    its own claim, ``balancing-nll`` (``balancing_nll``), decided once and required by both
    balancing claims (``Claim.requires``): one NLL test, counted once in Holm's family."""
    def compare(f, spec) -> Seed:
        df = f[DECIDING]
        loss, free = (_balancing_metric(df, metric, b) for b in ("loss", "loss_free"))
        return Seed({"loss-free vs loss": sign * (free - loss)})
    return compare


def balancing_nll(f, spec) -> Seed:
    """"without sacrificing overall model performance" (App. G.3), the two balancing claims'
    shared part: NLL(loss-free) - NLL(loss) + ``spec.ni_margin`` (> 0: the balancing loss costs
    less NLL than the margin; a non-inferiority test)."""
    df = f[DECIDING]
    nll = {b: one(df, "val_nll", model__router__balancing=b, **BASE_TOKEN_CHOICE) for b in ("loss", "loss_free")}
    return Seed({"NLL no worse (loss vs loss-free)": nll["loss_free"] - nll["loss"] + spec.ni_margin})


def normalised(centres: np.ndarray, func: str, alpha: float) -> np.ndarray | None:
    """Router outputs g = alpha f(.) mapped onto [0, 1], the scale of Fig. 5b: sigmoid
    g / alpha; tanh (g / alpha + 1) / 2; None for an unbounded function."""
    if func == "sigmoid":
        return centres / alpha
    if func == "tanh":
        return (centres / alpha + 1) / 2
    return None


def separation(f, spec) -> Seed:
    """fig5c's aux-loss runs, per run and recursion with both groups: mean normalised router
    output of selected minus unselected tokens, minus ``spec.threshold`` (> 0: the two groups
    sit further apart than the threshold on [0, 1]; the paper's "near 1.0 vs near 0.0" is a
    separation near 1)."""
    df, out, shared = f["fig5c"], Seed(), []
    for r in _records(df, model__router__aux="aux_loss"):
        if r["router_output_hist"] is None or pd.isna(r["router_output_hist"]):  # no eval histogram: the seed drops
            out.values[f"Nr={int(r['num_recursions'])}"] = math.nan
            continue
        router = json.loads(r["config_json"])["model"]["router"]
        for i, rec in enumerate(json.loads(r["router_output_hist"])):
            label = f"Nr={int(r['num_recursions'])} r{i + 1}"
            if not rec["n_unselected"] or not rec["n_selected"]:
                out.dropped.append(f"{label} (no unselected tokens)")
                continue
            edges = np.asarray(rec["bin_edges"])
            centre = normalised((edges[:-1] + edges[1:]) / 2, router["func"], float(router["alpha"]))
            if centre is None:
                out.dropped.append(f"{label} (router function {router['func']} has no [0, 1] scale)")
                continue
            sel, unsel = np.asarray(rec["selected"]), np.asarray(rec["unselected"])
            sep = float(centre @ sel - centre @ unsel)
            out.values[label] = sep - spec.threshold
            shared.append(overlap(sel, unsel))
    if shared:
        out.described[OVERLAP] = float(np.mean(shared))
    return out


OVERLAP = ("overlap of the selected and unselected groups' router output histograms (0 = perfect separation), mean "
           "over runs and recursions")


def overlap(selected, unselected) -> float:
    """The share of mass two normalised histograms on shared edges have in common,
    sum_b min(p_b, q_b): 0 when the groups never share a bin ("a perfect separation"), 1 when
    they are the same distribution. Described beside aux-separates, not tested (the claim tests
    the groups' locations against a threshold)."""
    return float(np.minimum(np.asarray(selected, dtype=np.float64), np.asarray(unselected, dtype=np.float64)).sum())


def depth_caps(r) -> dict[int, float]:
    """A fig5c row's NLL at each depth cap it has (``depth_cap_nll_<d>``, from the run's
    depth_cap analysis, mor.claims.render.load_frames); the trained depth Nr from the
    analysis where it has it, else the run's own val_nll (the same windows at full depth)."""
    nr = int(r["num_recursions"])
    caps = {d: float(r[f"depth_cap_nll_{d}"]) for d in range(1, nr + 1)
            if f"depth_cap_nll_{d}" in r and r[f"depth_cap_nll_{d}"] is not None and not pd.isna(r[f"depth_cap_nll_{d}"])}
    caps.setdefault(nr, float(r["val_nll"]))
    return dict(sorted(caps.items()))


def _missing_caps(caps: dict[int, float], nr: int) -> list[int]:
    return [d for d in range(1, nr + 1) if d not in caps]


def deeper_is_better(f, spec) -> Seed:
    """fig5c, per MoR model and each step of the depth cap: NLL(cap d) - NLL(cap d + 1), d = 1..Nr-1
    (> 0: one more recursion step at inference lowers NLL). Issue 48's reading, every step of
    Fig. 5c's curve; since issue 61 the claim tests the curve's trend (``deeper_trend``) and this
    step-wise form is kept for the record (its power at the pilot's effect was 0.01). A cap its
    run's depth_cap file lacks leaves the two steps that touch it nan in that seed, under their
    own labels, so that seed alone is dropped (``mor.claims.verdict``): merging them into a step
    "cap 1->3" made a label no other seed has, and every seed was dropped (issue 61)."""
    df, out = f["fig5c"], Seed()
    if not any(c.startswith("depth_cap_nll_") for c in df.columns):
        return Seed({"depth cap": math.nan}, ["no depth_cap analysis files"])
    for r in _records(df):
        caps, nr = depth_caps(r), int(r["num_recursions"])
        for d in range(1, nr):
            out.values[f"Nr={nr} cap {d}->{d + 1}"] = caps.get(d, math.nan) - caps.get(d + 1, math.nan)
    return out


def trend(caps: dict[int, float], nr: int) -> float:
    """Minus the least-squares slope of NLL on the depth cap over caps 1..Nr, in nats per
    recursion step (> 0: NLL falls as the cap grows); nan unless every cap is there. Nr = 2:
    NLL(cap 1) - NLL(cap 2); Nr = 3: (NLL(cap 1) - NLL(cap 3)) / 2; Nr = 4: the contrast
    (3, 1, -1, -3) / 10 of caps 1..4."""
    if _missing_caps(caps, nr) or nr < 2:
        return math.nan
    d = np.arange(1, nr + 1, dtype=np.float64)
    y = np.array([caps[k] for k in range(1, nr + 1)], dtype=np.float64)
    w = d - d.mean()
    return float(-(w @ y) / (w @ w))


def deeper_trend(f, spec) -> Seed:
    """fig5c, per MoR model: the trend of NLL over its depth caps 1..Nr (``trend``, nats per step,
    > 0: deeper recursion at inference lowers NLL); the claim pools them (``Claim.pool``: their
    mean is its one comparison). Pre-registered by issue 61 before any seed it decides
    (grids/claims/claims.yaml ``redesigns``): "allocating more recursion steps at inference can
    improve generation quality" (§ 5.3) is the curve of Fig. 5c falling on the whole, which its
    trend tests with power at the pilot's effect; requiring every step to fall (issue 48) had
    power 0.01 there. A model whose depth_cap file lacks a cap (or the file) has no trend in that
    seed: nan under its own label, so that seed alone is dropped and named."""
    df, out = f["fig5c"], Seed()
    if not any(c.startswith("depth_cap_nll_") for c in df.columns):
        return Seed({"depth cap": math.nan}, ["no depth_cap analysis files"])
    for r in _records(df):
        caps, nr = depth_caps(r), int(r["num_recursions"])
        gone = _missing_caps(caps, nr)
        if gone:
            out.dropped.append(f"Nr={nr} cap {', '.join(map(str, gone))} (not in its depth_cap file: no trend, "
                               "the seed is dropped)")
        out.values[f"Nr={nr} trend"] = trend(caps, nr)
    return out


def deeper_last_step(f, spec) -> Seed:
    """fig5c, per MoR model: NLL(cap Nr - 1) - NLL(cap Nr), the last trained step (> 0: the last
    recursion step lowers NLL). A candidate issue 61 simulated beside ``deeper_trend``
    (benchmarks/bench_claims_null.py ``--deeper last-step``), pooled the same way; not the
    registered predicate."""
    df, out = f["fig5c"], Seed()
    if not any(c.startswith("depth_cap_nll_") for c in df.columns):
        return Seed({"depth cap": math.nan}, ["no depth_cap analysis files"])
    for r in _records(df):
        caps, nr = depth_caps(r), int(r["num_recursions"])
        out.values[f"Nr={nr} cap {nr - 1}->{nr}"] = caps.get(nr - 1, math.nan) - caps.get(nr, math.nan)
    return out


def kv_pairs(df: pd.DataFrame) -> dict[str, float]:
    """table15: NLL(kv shared) - NLL(recursion-wise) for each shared-KV run and its baseline:
    the same variant and scale; Recursive / MoR also the same tying and Nr (a vanilla's
    num_recursions is its KV-sharing group size, and its baseline is the plain vanilla)."""
    out = {}
    for _, r in df[df["kv"] == "shared"].iterrows():
        base = df[(df["kv"] == "recursion_wise") & (df["variant"] == r["variant"]) & (df["paper_scale"] == r["paper_scale"])]
        if r["variant"] == "vanilla":
            base = base[~base["reduced"].astype(bool)] if "reduced" in base.columns else base
        else:
            base = base[(base["num_recursions"] == r["num_recursions"]) & (base["tying"] == r["tying"])]
        label = f"{r['variant']} {r['tying'] or ''} {_cell(r['paper_scale'], r['num_recursions'])}".replace("  ", " ")
        out[label] = float(r["val_nll"]) - float(base["val_nll"].iloc[0]) if len(base) == 1 else math.nan
    return out


def kv_little(f, spec) -> Seed:
    """table15, per matched pair: the signed NLL(kv shared) - NLL(recursion-wise), each to lie
    inside +-margin (TOST; +0.1 and -0.1 do not cancel: each pair is its own comparison)."""
    return Seed(kv_pairs(f["table15"]))


def flatter_path(f, spec) -> Seed:
    """table9: |slope of Vanilla's optimal path| - |slope of MoR's| (dNLL per decade of
    parameters through the stars, the line of Fig. 5a; > 0: MoR's path is flatter). A seed
    whose stars of one variant all sit at one size has no slope: nan, and the note says so."""
    df = f["table9"]
    slopes, why = {}, []
    for v in ("mor", "vanilla"):
        optima = optima_by_budget(df[df["variant"] == v])
        slopes[v] = path_slope(optima)
        if not math.isfinite(slopes[v]):
            why.append(f"{v}'s optima all at one size ({', '.join(o.kind for o in optima)})")
    return Seed({"path slope": abs(slopes["vanilla"]) - abs(slopes["mor"])}, why)


def decodes_faster(f, spec) -> Seed:
    """fig4a, per MoR model: decoding tokens/s at batch 32 over that of the Vanilla with the
    same effective depth (App. E: MoR-4's 1+4x8+1 = 34 layers against a 34-layer Vanilla),
    minus 1. The depth is the throughput job's ``decode_baseline_layers`` where the row has
    it, else the MoR's ``effective_layers``. A MoR model without such a Vanilla is left out
    and named."""
    df, out = f["fig4a"], Seed()
    col = "decode_tokens_per_s_fixed"
    if col not in df.columns:
        return Seed({"decode": math.nan}, ["no throughput results"])
    vanilla = df[df["variant"] == "vanilla"]
    for _, r in df[df["variant"] == "mor"].iterrows():
        depth = r.get("decode_baseline_layers")  # the throughput job's own baseline depth, where it wrote one
        depth = int(r["effective_layers"]) if depth is None or pd.isna(depth) else int(depth)
        base = vanilla[vanilla["effective_layers"] == depth]
        label = f"MoR-{int(r['num_recursions'])} vs Vanilla {depth} layers"
        if len(base) != 1:
            out.dropped.append(f"{label} ({len(base)} Vanilla runs of that depth)")
            continue
        out.values[label] = float(r[col]) / float(base[col].iloc[0]) - 1
    return out
