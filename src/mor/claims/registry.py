"""The claims: each quotes the paper's sentence it encodes, names the grids it reads and its
comparisons (``mor.claims.predicates``); margins, thresholds, paper effects and the runs
that decide it are pre-registered in ``grids/claims/claims.yaml`` (``Spec``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import yaml

from mor.claims import predicates as p
from mor.stats import Design

SPEC_FILE = Path(__file__).resolve().parents[3] / "grids" / "claims" / "claims.yaml"


@dataclass(frozen=True)
class Spec:
    """A claim's pre-registered numbers, each with its source (grids/claims/claims.yaml)."""

    margin: float | None = None  # equivalence claims: |difference| < margin
    margin_source: str = ""
    threshold: float = 0.0  # aux-separates: the separation the paper's sentence needs
    threshold_source: str = ""
    paper_effect: float | None = None  # the paper's own size of the effect, in the claim's units
    paper_effect_source: str = ""
    exclude: tuple[dict, ...] = ()  # comparisons the paper itself reports the other way
    exclude_source: str = ""
    decided_by: dict = field(default_factory=dict)  # {grid, runs: [block names], why}: the runs that decide it
    ni_margin: float | None = None  # non-inferiority part ("without sacrificing ..."): worse by less than this
    ni_margin_source: str = ""


@dataclass(frozen=True)
class Claim:
    id: str
    statement: str  # the claim in our words (captions, the table)
    sentence: str  # the paper's sentence it encodes, quoted
    evidence: str  # the paper's table / figure and, where stated, its number
    grids: tuple[str, ...]
    compare: Callable[[dict, Spec], p.Seed]  # frames of ONE seed -> its comparisons
    effect_doc: str  # what each comparison is, in words
    kind: str = "superiority"  # every comparison > 0 | "equivalence": every |comparison| < margin
    extra: tuple[str, ...] = field(default=())  # files beside the parquet it reads (analysis npz)
    metric: str = "val_nll"  # its comparisons' metric (design.resolution: the sd floor); a Seed may name others
    # claims whose verdict this one's needs: it holds only if they hold too, and is contradicted
    # if one of them is (a part of its sentence that another claim decides once, e.g. the two
    # balancing claims' "without sacrificing overall model performance"); each stays one member
    # of Holm's family, so a shared test is counted once (mor.claims.verdict._decide)
    requires: tuple[str, ...] = ()
    # "mean": the claim's one comparison is the mean of the comparisons its predicate gives (a
    # seed lacking one of them is dropped first, as any seed missing a comparison is); "": each
    # comparison is tested on its own (intersection-union) (mor.claims.verdict._comparisons)
    pool: str = ""


DECIDING = p.DECIDING
CLAIMS: tuple[Claim, ...] = (
    Claim("compute", "More compute gives lower NLL",
          "more compute consistently leads to better models, evidenced by lower NLL and improved accuracy with higher FLOPs",
          "Table 9 text", ("table9",), p.compute_gain,
          "NLL(best model at the smaller budget) - NLL(best at the next larger), per variant and budget step"),
    Claim("sharing-costs", "Weight sharing alone (Recursive) costs NLL against Vanilla",
          "weight-sharing alone in recursive models degraded performance compared to Vanilla",
          "Table 9 text; Table 10", (DECIDING,), p.sharing_cost,
          "NLL(Recursive) - NLL(Vanilla, same scale), per Recursive run (every scheme)"),
    Claim("mor-beats-recursive", "MoR beats Recursive at equal compute",
          "MoR lowers validation perplexity and improves average few-shot accuracy compared to both vanilla and "
          "previous recursive baselines", "Table 9; Conclusion", ("table9",), p.mor_vs_recursive,
          "NLL(Recursive) - NLL(MoR), per (scale, budget)"),
    Claim("mor-beats-recursive-tokens", "MoR beats Recursive at equal tokens, i.e. with fewer FLOPs",
          "MoR lowers validation perplexity ... compared to both vanilla and previous recursive baselines",
          "Table 3 / Table 9 (at equal compute MoR trains more tokens)", (DECIDING,), p.mor_vs_recursive_tokens,
          "NLL(Recursive) - NLL(MoR expert-choice), same scale, tying, Nr and tokens, per MoR run"),
    Claim("mor-catches-up", "MoR catches up with Vanilla as scale grows",
          "token-routed MoR models overcome this shortcoming, catching up to and then surpassing Vanilla models",
          "Table 9 text", ("table9",), p.mor_catches_up,
          "(MoR - Vanilla NLL) at the smallest scale minus at the largest, per budget"),
    Claim("mor-beats-vanilla", "MoR beats Vanilla at every scale of the ladder but the smallest",
          "surpassing Vanilla models from 360M parameters upward, all while utilizing only one-third of the parameters",
          "Table 9 text", ("table9",), p.mor_beats_vanilla,
          "NLL(Vanilla) - NLL(MoR) per (scale, budget), every scale above the ladder's smallest"),
    Claim("sequence-worst", "Sequence is the worst tying scheme in all four settings, against the three others",
          "pure Sequence sharing records the worst NLL in all four settings",
          "App. F, Table 10", ("table10",), p.sequence_worst,
          "NLL(Sequence) - NLL(other scheme), per (scale, Nr) and scheme"),
    Claim("middle-cycle-safest", "Middle-Cycle has the lowest NLL of the four schemes (but where the paper says Cycle leads)",
          "Middle-Cycle is consistently the safest choice. For the 360M models, Middle-Cycle achieves the lowest NLL at both "
          "depths ... For the 135M models, while Cycle is slightly ahead at two recursion setting (3.0071 vs. 3.0330), "
          "Middle-Cycle overtakes when recursion depth rises (3.1048 vs. 3.1154)",
          "App. F, Table 10", ("table10",), p.middle_cycle_safest,
          "NLL(other scheme) - NLL(Middle-Cycle), per (scale, Nr) and scheme, less the exclusions"),
    Claim("middle-cycle-equal-unique", "At equal unique layers Middle-Cycle beats Cycle",
          "the Middle-Cycle model achieves better performance, with a lower negative log-likelihood (2.7552 vs. 2.7573)",
          "App. F, Table 11", ("table11",), p.middle_cycle_equal_unique, "NLL(Cycle, 10x3) - NLL(Middle-Cycle, 1+8x3+1)"),
    Claim("uptraining-middle-best", "Under up-training both Middle schemes beat the other schemes and the reduced "
          "baselines", "Both Middle strategies demonstrate superior performance across all settings, and notably, they "
          "significantly outperform the reduced baseline models that are initialized in the same manner but without recursion",
          "App. F, Table 12", ("table12",), p.uptraining_middle_best,
          "NLL(competitor) - NLL(Middle scheme), both Middle schemes x {Cycle, Sequence, reduced vanilla} per Nr"),
    Claim("aux-separates", "With the auxiliary loss, selected and unselected tokens' mean router outputs (on [0, 1]) lie "
          "at least 0.8 apart: the groups' locations, our reading of 'near 1.0 ... near 0.0' (threshold: no source, our "
          "choice); not a test of their overlap",
          "auxiliary loss achieves a perfect separation in router outputs, with selected tokens sharply concentrated near a "
          "routing score of 1.0 and unselected tokens clustering near 0.0", "§ 5.2, Fig. 5b", ("fig5c",), p.separation,
          "mean normalised router output (g / alpha on [0, 1]) of selected - unselected tokens, minus the threshold, "
          "per run and recursion (recursion 1 has capacity 1, no unselected tokens: left out); the groups' overlap is "
          "described in the note, not tested", metric="router_separation"),
    Claim("deeper-recursion", "NLL falls as the inference depth cap grows (Fig. 5c's curve over caps 1..Nr, its "
          "least-squares trend averaged over the MoR models; pre-registered by issue 61)",
          "allocating more recursion steps at inference can improve generation quality", "§ 5.3, Fig. 5c", ("fig5c",),
          p.deeper_trend, "mean over the MoR models (Nr = 2, 3, 4) of minus the least-squares slope of NLL on the depth "
          "cap 1..Nr, nats per recursion step (caps beyond the trained Nr are not measured: an expert-choice MoR has no "
          "router for recursion Nr + 1)", pool="mean"),
    Claim("linear-aux-loss-fewest-dead", "A linear router with the auxiliary loss has fewer dead tokens than the "
          "auxiliary-router variants, without a worse sampling accuracy",
          "employing a linear router architecture in conjunction with auxiliary loss effectively reduces the dead token "
          "ratio without compromising sampling accuracy", "App. G.3, Table 13 (aux-router variants up to 66.7%)", ("table13",), p.linear_aux_loss_fewest_dead,
          "dead-token ratio(aux-router variant) - (linear, aux loss) per architecture, and sampling accuracy(linear, aux loss) "
          "- (aux-router variant) + the non-inferiority margin", metric="dead_token_ratio"),
    Claim("balancing-maxvio", "The balancing loss lowers MaxVio against loss-free balancing",
          "applying an explicit balancing loss significantly reduces MaxVio ... without sacrificing overall model "
          "performance", "App. G.3, Table 14",
          (DECIDING,), p.balancing("max_vio", 1.0), "MaxVio(loss-free) - MaxVio(balancing loss), table14's base router; "
          "holds only with balancing-nll (the NLL part, decided once)", metric="max_vio", requires=("balancing-nll",)),
    Claim("balancing-entropy", "The balancing loss raises the routing entropy against loss-free balancing",
          "applying an explicit balancing loss significantly reduces MaxVio and increases entropy ... without "
          "sacrificing overall model performance", "App. G.3, Table 14",
          (DECIDING,), p.balancing("assignment_entropy", -1.0), "entropy(balancing loss) - entropy(loss-free) of the "
          "share of tokens each depth is assigned (top-1 of probs + bias: the selection the router makes, as MaxVio's "
          "loads), table14's base router; holds only with balancing-nll (the NLL part, decided once)",
          metric="assignment_entropy", requires=("balancing-nll",)),
    Claim("balancing-nll", "The balancing loss costs less than 0.05 NLL against loss-free balancing (non-inferiority)",
          "applying an explicit balancing loss ... leading to improved load balance without sacrificing overall model "
          "performance", "App. G.3, Table 14", (DECIDING,), p.balancing_nll,
          "NLL(loss-free) - NLL(balancing loss) + the non-inferiority margin, table14's base router; the part both "
          "balancing claims need, one test"),
    Claim("kv-sharing-little", "KV sharing changes NLL little",
          "the Middle-Cycle strategy ... showed a slight perplexity drop, albeit not substantial ... [MoR] still introduced a "
          "small amount of degradation", "App. H.2, Table 15", ("table15",), p.kv_little,
          "signed NLL(shared) - NLL(recursion-wise), per matched pair, inside +-margin", kind="equivalence"),
    Claim("flatter-path", "MoR's compute-optimal path is flatter (it benefits more from parameters)",
          "The flatter slope of MoR's optimal path (a line connecting stars) indicates that it benefits more significantly "
          "from increases in parameter count", "§ 5.1, Fig. 5a", ("table9",), p.flatter_path,
          "|path slope(Vanilla)| - |path slope(MoR)|, dNLL per decade of parameters through the stars"),
    Claim("decodes-faster", "MoR decodes faster than the Vanilla of its effective depth",
          "The speeds of the MoR models are normalized against the speed of the Vanilla Transformer ... the speed "
          "comparison for MoR-4 is made against a modified vanilla model that includes these two extra layers "
          "(Fig. 4a: MoR faster, up to ~2x)", "App. E, Fig. 4a", ("fig4a",),
          p.decodes_faster, "tokens/s(MoR) / tokens/s(Vanilla of the same effective depth) - 1 at batch 32, per MoR model",
          metric="speed_ratio"),
)


def spec_for(grids_dir: Path) -> Path:
    """The pre-registered design a grids folder runs under: its own ``claims/claims.yaml`` where
    it has one (the shipped grids/ does), else the shipped file."""
    own = Path(grids_dir) / "claims" / "claims.yaml"
    return own if own.exists() else SPEC_FILE


def load_family(mode: str, path: Path = SPEC_FILE) -> tuple[str, ...] | None:
    """The mode's pre-registered Holm family (``design.family.<mode>``): a tuple of claim ids,
    or None for every claim ('all', or a mode the file does not name)."""
    fam = (yaml.safe_load(Path(path).read_text())["design"].get("family") or {}).get(mode, "all")
    if fam == "all":
        return None
    unknown = sorted(set(fam) - {c.id for c in CLAIMS})
    if unknown:
        raise ValueError(f"{path}: design.family.{mode} names unknown claim(s) {unknown}")
    needed = sorted({r for c in CLAIMS if c.id in fam for r in c.requires} - set(fam))
    if needed:
        raise ValueError(f"{path}: design.family.{mode} leaves out {needed}, which members of it require")
    return tuple(fam)


MODE_KEYS = {"looks", "spending", "first_seed", "spent_before", "why"}  # what design.by_mode.<mode> may set in place of design's own


def _skew(entry, path) -> float:
    """design.skew: {lognormal_sigma, why}, the noise shapes the tests stay valid under (mor.stats.p_below)."""
    if entry is None:
        return 0.0
    if not (isinstance(entry, dict) and set(entry) == {"lognormal_sigma", "why"} and entry["why"]):
        raise ValueError(f"{path}: design.skew needs lognormal_sigma and why, got {entry!r}")
    return float(entry["lognormal_sigma"])


VERDICTS = ("holds", "contradicted", "inconclusive")
REANALYSIS_KEYS = {"mode", "date", "issues", "why", "runs", "commit_before", "verdicts_before"}
# optional (issue 61): the runs' seed offsets and the re-analysis's own verdicts; a record written
# before them still loads, and without offsets a table never reads it as another design's seeds
REANALYSIS_OPTIONAL = {"offsets", "verdicts_after"}


@dataclass(frozen=True)
class Reanalysis:
    """A change of test made after the verdicts it changes had been seen (grids/claims/claims.yaml
    ``reanalyses``). It changes no test; it is the record the claims table opens with, so a
    reader learns which verdicts the change moved and that those runs were decided twice."""

    mode: str
    date: str
    issues: tuple[int, ...]
    why: str
    runs: str  # the runs first decided (which seeds, trained at which commit)
    commit_before: str  # the claims code that decided them first
    verdicts_before: dict = field(hash=False)  # claim id -> its verdict at commit_before, on those runs
    # the seed offsets of those runs, first and last (as the design counts them): a table whose
    # design reads past them (first_seed > last) decides on fresh seeds, and says so
    offsets: tuple[int, int] | None = None
    # claim id -> its verdict on those runs under the changed tests (the re-analysis itself), so
    # the record keeps it once a later design's table reads other runs
    verdicts_after: dict | None = field(default=None, hash=False)


def load_reanalyses(path: Path = SPEC_FILE, mode: str | None = None) -> tuple[Reanalysis, ...]:
    """The file's re-analyses of ``mode`` (every one with no mode), oldest first; a missing key,
    a mode the design does not name, no issue, an unknown claim id or verdict is an error
    naming the entry (``load_specs`` checks them too, so a bad record fails before any job)."""
    raw = yaml.safe_load(Path(path).read_text())
    modes = set((raw["design"].get("family") or {})) | set(raw["design"].get("by_mode") or {})
    out = []
    ids = {c.id for c in CLAIMS}
    for i, e in enumerate(raw.get("reanalyses") or []):
        where = f"{path}: reanalyses[{i}]"
        if (not isinstance(e, dict) or not REANALYSIS_KEYS <= set(e) <= REANALYSIS_KEYS | REANALYSIS_OPTIONAL
                or not e["why"]):
            raise ValueError(f"{where} needs exactly {sorted(REANALYSIS_KEYS)} (and may give "
                             f"{sorted(REANALYSIS_OPTIONAL)}), got {sorted(e) if isinstance(e, dict) else e!r}")
        if e["mode"] not in modes:
            raise ValueError(f"{where}.mode: {e['mode']!r} is no mode of design.family / design.by_mode {sorted(modes)}")
        issues = e["issues"]
        if not isinstance(issues, list) or not issues or not all(isinstance(n, int) for n in issues):
            raise ValueError(f"{where}.issues: a non-empty list of issue numbers, got {issues!r}")
        for key in ("verdicts_before", "verdicts_after"):
            if key not in e:
                continue
            got = e[key]
            bad = (sorted(set(got) - ids) + sorted(f"{k}: {v}" for k, v in got.items() if v not in VERDICTS)
                   if isinstance(got, dict) else [repr(got)])
            if not got or bad:
                raise ValueError(f"{where}.{key}: a mapping of claim id -> verdict; unknown or bad "
                                 f"{bad or 'none given'} (verdicts: {', '.join(VERDICTS)})")
        before = e["verdicts_before"]
        offsets = e.get("offsets", [0, 0])
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int and o >= 0 for o in offsets)
                and offsets[0] <= offsets[1]):
            raise ValueError(f"{where}.offsets: the runs' first and last seed offsets [first, last], got {offsets!r}")
        r = Reanalysis(mode=str(e["mode"]), date=str(e["date"]), issues=tuple(issues), why=" ".join(str(e["why"]).split()),
                       runs=" ".join(str(e["runs"]).split()), commit_before=str(e["commit_before"]),
                       verdicts_before=dict(before), offsets=(offsets[0], offsets[1]) if "offsets" in e else None,
                       verdicts_after=dict(e["verdicts_after"]) if "verdicts_after" in e else None)
        if mode is None or r.mode == mode:
            out.append(r)
    return tuple(out)


REDESIGN_KEYS = {"claim", "mode", "date", "issues", "sentence", "predicate", "pool", "test", "chosen_by", "fresh_seeds",
                 "why"}


@dataclass(frozen=True)
class Redesign:
    """A claim's test redesigned before any seed it will decide (grids/claims/claims.yaml
    ``redesigns``): the sentence, the predicate (checked against the claim's own ``compare`` and
    ``pool``, so the record and the code cannot drift apart), and how it was chosen."""

    claim: str
    mode: str
    date: str
    issues: tuple[int, ...]
    sentence: str
    predicate: str
    pool: str
    test: str
    chosen_by: str
    fresh_seeds: str
    why: str


def load_redesigns(path: Path = SPEC_FILE, mode: str | None = None) -> tuple[Redesign, ...]:
    """The file's redesigns of ``mode`` (every one with no mode), oldest first; a missing or
    unknown key, an unknown claim, a mode the design does not name, no issue, or a predicate /
    pool that is not the claim's own is an error naming the entry."""
    raw = yaml.safe_load(Path(path).read_text())
    modes = set((raw["design"].get("family") or {})) | set(raw["design"].get("by_mode") or {})
    by_id = {c.id: c for c in CLAIMS}
    out = []
    for i, e in enumerate(raw.get("redesigns") or []):
        where = f"{path}: redesigns[{i}]"
        if not isinstance(e, dict) or set(e) != REDESIGN_KEYS or not all(str(e[k]).strip() for k in REDESIGN_KEYS - {"pool"}):
            raise ValueError(f"{where} needs exactly {sorted(REDESIGN_KEYS)}, each non-empty but pool, got "
                             f"{sorted(e) if isinstance(e, dict) else e!r}")
        if e["claim"] not in by_id:
            raise ValueError(f"{where}.claim: {e['claim']!r} is no claim id")
        if e["mode"] not in modes:
            raise ValueError(f"{where}.mode: {e['mode']!r} is no mode of design.family / design.by_mode {sorted(modes)}")
        if not isinstance(e["issues"], list) or not e["issues"] or not all(isinstance(n, int) for n in e["issues"]):
            raise ValueError(f"{where}.issues: a non-empty list of issue numbers, got {e['issues']!r}")
        c = by_id[e["claim"]]
        if e["predicate"] != c.compare.__name__ or (e["pool"] or "") != c.pool:
            raise ValueError(f"{where}: predicate {e['predicate']!r} / pool {e['pool']!r} is not {c.id}'s own "
                             f"({c.compare.__name__!r} / {c.pool!r}): the record and mor.claims.registry disagree")
        r = Redesign(claim=c.id, mode=str(e["mode"]), date=str(e["date"]), issues=tuple(e["issues"]),
                     **{k: " ".join(str(e[k] or "").split()) for k in ("sentence", "predicate", "pool", "test",
                                                                       "chosen_by", "fresh_seeds", "why")})
        if mode is None or r.mode == mode:
            out.append(r)
    return tuple(out)


TOP_KEYS = {"design", "claims", "reanalyses", "redesigns"}


def load_specs(path: Path = SPEC_FILE, mode: str | None = None) -> tuple[Design, dict[str, Spec]]:
    """The design and every claim's spec; a claim id the file names that no claim has, a
    claim the file leaves out, or a margin / threshold without its source is an error.
    ``mode``: a mode's own design (``design.by_mode.<mode>``: its looks, spending and first
    fresh seed, with the reason it differs) where the file gives one; otherwise, and with no
    mode, ``design``'s."""
    raw = yaml.safe_load(Path(path).read_text())
    if set(raw) - TOP_KEYS:
        raise ValueError(f"{path}: unknown top-level key(s) {sorted(set(raw) - TOP_KEYS)} (known: {sorted(TOP_KEYS)})")
    load_reanalyses(path)  # a malformed record fails here, before any job reads the design
    load_redesigns(path)
    d = dict(raw["design"])
    by_mode = d.pop("by_mode", None) or {}
    for name, over in by_mode.items():
        if not isinstance(over, dict) or set(over) - MODE_KEYS or not over.get("why"):
            raise ValueError(f"{path}: design.by_mode.{name} may set only {sorted(MODE_KEYS - {'why'})} and needs why, "
                             f"got {sorted(over) if isinstance(over, dict) else over!r}")
    if mode in by_mode:
        d.update({k: v for k, v in by_mode[mode].items() if k != "why"})
    spending = d.get("spending", {})
    if spending.get("family", "power") != "power":
        raise ValueError(f"{path}: design.spending.family: only 'power' is implemented, got {spending.get('family')!r}")
    floors = {}
    for metric, r in (d.get("resolution") or {}).items():
        if not (isinstance(r, dict) and float(r.get("sd_floor", 0)) > 0 and r.get("why")):
            raise ValueError(f"{path}: design.resolution.{metric} needs sd_floor > 0 and why")
        floors[metric] = float(r["sd_floor"])
    spent = d.get("spent_before") or {}
    if spent and (set(spent) != {"alpha", "claims", "why"} or set(spent["claims"]) - {c.id for c in CLAIMS}):
        raise ValueError(f"{path}: spent_before needs alpha, claims (ids of CLAIMS) and why, got {spent!r}")
    try:
        design = Design(alpha=float(d["alpha"]), looks=tuple(int(n) for n in d["looks"]),
                        rho=float(spending.get("rho", 1.0)), power=float(d.get("power", 0.8)), floors=floors,
                        first_seed=d.get("first_seed", 0), spent_before=float(spent.get("alpha", 0.0)),
                        retested=tuple(spent.get("claims", ())), skew=_skew(d.get("skew"), path))
    except ValueError as e:
        where = f"design.by_mode.{mode}" if mode in by_mode else "design"
        raise ValueError(f"{path}: {where}: {e}") from None
    ids = {c.id for c in CLAIMS}
    unknown = sorted(set(raw["claims"]) - ids)
    missing = sorted(ids - set(raw["claims"]))
    if unknown or missing:
        raise ValueError(f"{path}: unknown claim id(s) {unknown}, claim(s) without an entry {missing}")
    specs = {}
    for cid, s in raw["claims"].items():
        s = dict(s or {})
        s["exclude"] = tuple(s.get("exclude", ()))
        spec = Spec(**s)
        if set(spec.decided_by) != {"grid", "runs", "why"}:
            raise ValueError(f"{path}: claims.{cid}.decided_by needs grid, runs and why, got {sorted(spec.decided_by)}")
        for key in ("margin", "threshold", "paper_effect", "ni_margin"):
            if getattr(spec, key) and not getattr(spec, f"{key}_source"):
                raise ValueError(f"{path}: claims.{cid}.{key} needs {key}_source (or 'no source: our choice')")
        specs[cid] = spec
    for c in CLAIMS:
        if c.metric not in design.floors and design.floors:
            raise ValueError(f"{path}: design.resolution has no sd floor for {c.id}'s metric {c.metric!r}")
        if c.kind == "equivalence" and not specs[c.id].margin:
            raise ValueError(f"{path}: claims.{c.id} is an equivalence claim and needs a margin")
    return design, specs
