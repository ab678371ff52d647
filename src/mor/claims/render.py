"""``tables/claims/``: read the grids' parquet, decide every claim, write the table.

Written through ``mor.atomic`` rather than ``mor.reports`` (claims read parquet and pure
functions only; the reports import claims, never the reverse)."""

from __future__ import annotations

import html
import math
import shutil
from pathlib import Path

import numpy as np
import pandas as pd

from mor.atomic import remove_stale, replace_dir, temp_sibling
from mor.layout import sidecar_file
from mor.claims.registry import (CLAIMS, SPEC_FILE, Reanalysis, Redesign, load_family, load_reanalyses, load_redesigns,
                                 load_specs)
from mor.claims.forest import draw_forest, forest_frame
from mor.claims.verdict import evaluate, verdict_note
from mor.results import read_frame


def load_frames(results_dir: Path, grids: set[str], analyses_dir: Path | None = None) -> dict[str, pd.DataFrame]:
    """The grids' results that exist (a missing one makes its claims 'not built').
    ``analyses_dir``: where ``runs/<run_id>.depth_cap.npz`` lie (default: results_dir;
    the adaptive design's rounds keep their parquet apart from the runs' analysis files)."""
    out = {}
    for g in sorted(grids):
        p = Path(results_dir) / f"{g}.parquet"
        if p.exists():
            out[g] = read_frame(p)
    if "fig5c" in out:  # fig5c's capped NLLs live in the depth_cap analysis files
        out["fig5c"] = _with_depth_cap(Path(analyses_dir or results_dir), out["fig5c"])
    return out


def _with_depth_cap(results_dir: Path, df: pd.DataFrame) -> pd.DataFrame:
    """fig5c's rows with ``depth_cap_nll_<d>``: the NLL at every depth cap d its run's
    depth_cap file holds (nan where a run has no file or no such cap); deeper-recursion reads
    each step of that curve (mor.claims.predicates.deeper_is_better)."""
    df = df.copy()
    caps: dict[int, list[float]] = {1: [math.nan] * len(df)}
    for i, (_, r) in enumerate(df.iterrows()):
        p = sidecar_file(results_dir, r["run_id"], "depth_cap")  # the run's one home (mor.layout)
        if p.exists():
            a = np.load(p)
            for d, v in zip(a["max_depth"], a["val_nll"]):
                caps.setdefault(int(d), [math.nan] * len(df))[i] = float(v)
    for d in sorted(caps):
        df[f"depth_cap_nll_{d}"] = caps[d]
    return df


def rounds_note(rounds: list[dict]) -> str:
    """A sentence per round for the claims table: what each round added and why it stopped."""
    parts = []
    for r in rounds:
        counts: dict[str, int] = {}
        for v in r["verdicts"].values():
            counts[v["verdict"]] = counts.get(v["verdict"], 0) + 1
        state = ", ".join(f"{n} {v}" for v, n in sorted(counts.items()))
        head = "the grids' own seeds" if r["round"] == 0 else "with the seeds the last round added"
        if r["stop"]:
            parts.append(f"Round {r['round']} ({head}): {state}; the design stops: {r['why']}.")
        else:
            adds = "; ".join(f"{s['claim']}: {s['grid']} [{', '.join(s['blocks'])}] {s['seeds_from']} -> "
                             f"{s['seeds_to']} seeds (+{s['cost']:.1f} {r['unit']})" for s in r["steps"])
            parts.append(f"Round {r['round']} ({head}): {state}; next: {adds}.")
        if r.get("ranking"):
            parts.append("Ranking (CPU-min to the next look / chance it decides): " + "; ".join(
                f"{x['claim']} {x['seeds_from']} -> {x['seeds_to']}: {x['cost']:g} / "
                + (f"{x['chance']:.2f} = {x['cost_per_decision']:g}" if x["chance"] is not None else "no estimate")
                + ("" if x["funded"] else " (not funded)") for x in r["ranking"]) + ".")
    last = rounds[-1]
    return (f"Adaptive seeds (grids/claims/claims.yaml design.budget): {len(rounds)} round(s), "
            f"{last['spent']:.1f} of {last['budget']:g} {last['unit']} planned for added seeds. " + " ".join(parts))


UNDECIDED_HERE = ("not built", "not tested in this mode")  # statuses that are no verdict of this table's


def _redecided(r: Reanalysis) -> str:
    """The record's verdicts under the changed tests, each beside its first one: "c v" where it
    stayed, "c v -> w" where it moved, "c (a new member) w" for a claim the change added."""
    before, after = r.verdicts_before, r.verdicts_after or {}
    parts = []
    for c in dict.fromkeys([*before, *after]):
        if c not in before:
            parts.append(f"{c} (a new member) {after[c]}")
        elif after.get(c, before[c]) != before[c]:
            parts.append(f"{c} {before[c]} -> {after[c]}")
        else:
            parts.append(f"{c} {before[c]}")
    return "; ".join(parts)


def reanalysis_notice(reanalyses: tuple[Reanalysis, ...], verdicts: dict[str, str], first_seed: int = 0) -> list[str]:
    """One paragraph per re-analysis for the top of the claims table: what changed after its
    verdicts were seen and the verdicts recorded then (on the runs it names). Where this table
    read those runs, its own verdicts for the same claims follow: the ones that differ first,
    then the same, then the claims it does not decide (not built, not in its mode). Where the
    table's design reads seeds past the record's (``first_seed`` beyond its last offset), the
    table is a fresh test of other runs: the paragraph gives the record's own re-analysed
    verdicts (``verdicts_after``) and lists the table's as fresh, never as moves.
    Pure: the record, the design's first seed offset and the table (claim id -> verdict)."""
    out = []
    for r in reanalyses:
        fresh = r.offsets is not None and first_seed > r.offsets[1]
        now = {c: verdicts.get(c, "not built") for c in r.verdicts_before}
        text = (f"Tests changed after these verdicts were seen ({r.date}, issue{'s' if len(r.issues) > 1 else ''} "
                f"{', '.join(str(i) for i in r.issues)}): {r.why}. On {r.runs}, the claims code at {r.commit_before} "
                f"decided {len(r.verdicts_before)} claim(s). ")
        if fresh:
            out.append(text + f"Re-decided on the same runs under the changed tests: {_redecided(r)}. "
                       f"This table reads seed offsets from {first_seed} on, not those runs ({r.offsets[0]}-{r.offsets[1]}): "
                       f"its verdicts are a fresh test, not the re-analysis, and are not compared with it: "
                       + "; ".join(f"{c} {now[c]}" for c in r.verdicts_before) + ".")
            continue
        differ = [f"{c} {v} -> {now[c]}" for c, v in r.verdicts_before.items()
                  if now[c] != v and now[c] not in UNDECIDED_HERE]
        same = [f"{c} {v}" for c, v in r.verdicts_before.items() if now[c] == v]
        absent = [f"{c} ({now[c]})" for c in r.verdicts_before if now[c] in UNDECIDED_HERE]
        parts = [f"{len(differ)} differ ({'; '.join(differ)})" if differ else "none differs"]
        if same:
            parts.append(f"the same: {'; '.join(same)}")
        if absent:
            parts.append(f"not decided here: {'; '.join(absent)}")
        out.append(text + "This table's verdicts: " + ", ".join(parts) + ".")
    return out


def redesign_notice(redesigns: tuple[Redesign, ...]) -> list[str]:
    """One paragraph per redesigned test for the top of the claims table: the claim, when and
    why, the test now, how it was chosen and which seeds it is to be decided on (pure)."""
    return [f"{r.claim}'s test was redesigned on {r.date} (issue{'s' if len(r.issues) > 1 else ''} "
            f"{', '.join(map(str, r.issues))}), before any seed it decides, for \"{r.sentence}\": {r.test}. Why: {r.why}. "
            f"Chosen by simulation alone: {r.chosen_by}. Seeds: {r.fresh_seeds}." for r in redesigns]


def first_seeds_of(rounds: list[dict] | None) -> dict[tuple[str, str], int] | None:
    """(grid, block) -> the block's first train.seed, as the last round recorded it
    (``seeding.next_round``), so the table counts each pilot as the rounds did even where a
    run at a block's first seed failed; None without rounds (``verdict._comparisons`` then
    reads it off the data)."""
    if not rounds or "first_seeds" not in rounds[-1]:
        return None
    return {(g, b): int(s) for g, blocks in rounds[-1]["first_seeds"].items() for b, s in blocks.items()}


SHOWN = ["claim", "statement", "verdict", "verdict from", "n seeds", "mean effect", "raw lo", "raw hi", "interval", "p", "p Holm",
         "MDE", "chance next look", "paper effect", "seeds needed", "per seed", "note"]


def render_claims(results_dir: Path, out: Path, mode: str, analyses_dir: Path | None = None,
                  rounds: list[dict] | None = None, spec: Path | None = None, skew: bool = False) -> list[Path]:
    """claims.md (the table, how verdicts are reached, each claim's paper sentence and the
    runs that decide it), claims.csv (every column), claims.html (the report shows HTML in
    place) and claims_forest.png with claims_forest.csv (each claim's interval against 0 or its
    margin, coloured by verdict: mor.claims.forest), swapped in whole (``mor.atomic.replace_dir``). ``rounds``: the adaptive design's
    round files (``mor.claims.rounds.run_round``), summarised under the table. ``spec``: the
    pre-registered design file (default: the shipped one). ``skew``: also skew.md and skew.csv,
    the skewness of every tested comparison's per-seed differences (``mor.claims.skew``)."""
    spec = Path(spec) if spec else SPEC_FILE
    design, specs = load_specs(spec, mode=mode)
    frames = load_frames(Path(results_dir), {g for c in CLAIMS for g in c.grids}, analyses_dir)
    family = load_family(mode, spec)
    first = first_seeds_of(rounds)
    table = evaluate(frames, CLAIMS, design, specs, family=family, first_seeds=first)
    # every column of the table whatever was tested: a table where no claim reached a seed
    # (a design whose fresh seeds are not trained yet) has the same columns, empty
    table = table.reindex(columns=list(table.columns) + [c for c in SHOWN if c not in table.columns])
    counts = table["verdict"].value_counts().to_dict()
    summary = ", ".join(f"{counts.get(v, 0)} {v}" for v in ("holds", "contradicted", "inconclusive", "not tested in this mode",
                                                           "not built"))
    commits = sorted({c[:12] for df in frames.values() for c in df["git_commit"].unique()})
    shown = table[SHOWN]
    shown = shown.astype(object).where(shown.notna(), "")
    title = f"The paper's claims, checked (mode '{mode}')"
    intro = (f"{summary} (after Holm). From {results_dir} (grids {', '.join(sorted(frames)) or 'none'}; "
             f"commit(s) {', '.join(commits) or '-'}).")
    notices = reanalysis_notice(load_reanalyses(spec, mode), dict(zip(table["claim"], table["verdict"])), design.first_seed)
    designed = redesign_notice(load_redesigns(spec, mode))
    note = verdict_note(design)
    if rounds:
        note += " " + rounds_note(rounds)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    remove_stale(out.parent)
    tmp = temp_sibling(out)
    tmp.mkdir()
    try:
        (tmp / "claims.md").write_text(
            f"# {title}\n\n" + "".join(f"> **Re-analysis.** {n}\n\n" for n in notices)
            + "".join(f"> **Redesigned test.** {n}\n\n" for n in designed) + f"{intro}\n\n{note}\n\n" + shown.to_markdown(index=False) + "\n\n## Each claim\n\n"
            + "\n".join(f"- **{r['claim']}** ({r['paper evidence']}): \"{r['paper sentence']}\". Comparisons: {r['effect']}. "
                        f"Decided by {r['decided by'] or '-'}." for _, r in table.iterrows()) + "\n")
        table.to_csv(tmp / "claims.csv", index=False)
        # the forest plot (mor.claims.forest) and the numbers it draws
        forest = forest_frame(table, {c.id: specs[c.id].margin for c in CLAIMS if c.kind == "equivalence" and c.id in specs})
        forest.to_csv(tmp / "claims_forest.csv", index=False)
        draw_forest(forest, tmp / "claims_forest.png", note=intro)
        if skew:
            from mor.claims.skew import skew_markdown, skew_table

            skews = skew_table(frames, design, specs, family, first_seeds=first)
            skews.to_csv(tmp / "skew.csv", index=False)
            (tmp / "skew.md").write_text(skew_markdown(skews, design))
        body = "".join(f"<p><strong>Re-analysis.</strong> {html.escape(n)}</p>" for n in notices)
        body += "".join(f"<p><strong>Redesigned test.</strong> {html.escape(n)}</p>" for n in designed)
        body += "".join(f"<p>{html.escape(p)}</p>" for p in (intro, note))
        (tmp / "claims.html").write_text(
            f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>claims</title></head><body>"
            f"<h2>{html.escape(title)}</h2>{body}{shown.to_html(index=False, na_rep='', border=0, classes='mor-table')}"
            f"</body></html>\n")
        replace_dir(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return sorted(out.iterdir())
