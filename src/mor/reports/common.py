"""Shared report helpers: load a grid's results, attach the paper's numbers, write atomically."""

from __future__ import annotations

import errno
import shutil
from pathlib import Path

import pandas as pd
import yaml

from mor.atomic import out_of_space, remove_stale, replace_dir, temp_sibling
from mor.results import read_frame

TYING_NAMES = {"cycle": "Cycle", "sequence": "Sequence", "middle_cycle": "Middle-Cycle",
               "middle_sequence": "Middle-Sequence"}
REF_KEYS = ("paper_scale", "variant", "tying", "num_recursions", "reduced")


# lm-eval task -> column name (our offline copies and lm-eval's standard tasks alike)
TASK_NAMES = {"lambada": "LAMBADA", "hellaswag": "HellaSwag", "piqa": "PIQA", "winogrande": "WinoGrande",
              "arc_easy": "ARC-e", "arc_challenge": "ARC-c"}
SE = " stderr"  # suffix of a stderr column (.csv); the .md and .tex show "value ± stderr" in one cell
ACC_NOTE = ("Accuracies: lm-eval's acc ± stderr per task and their mean ('Avg acc'); in mode 'local' on the "
            "offline mor_* copies (OLMES prompts, a random subset per task), comparable between our runs only, "
            "not with lm-eval's published numbers; near chance at CPU scale.")  # suffix of a stderr column; the .md shows "value ± stderr" in one cell


# The two evaluation protocols (issue 56; mor.lm_eval.adapter, mor.eval.nll), as the tables label them.
# The authors' is the one the paper's numbers were measured with: a 'Paper ...' column sits beside it.
TOPK = "top-k, sees future"
CAUSAL = "causal"
PROTOCOL_COLUMNS = {TOPK: ("val_nll", "accuracy_topk", "avg_accuracy_topk"),
                    CAUSAL: ("val_nll_causal", "accuracy", "avg_accuracy")}
PROTOCOL_NOTE = (f"Two evaluation protocols side by side, for NLL and accuracy. '({TOPK})': the authors' protocol, the "
                 "training forward (expert-choice top-k over the whole right-padded request, so the router sees tokens "
                 "after the one scored and the padding), the one the paper's numbers were measured with: each 'Paper' "
                 f"column stands beside it. '({CAUSAL})': each token routed on its past alone, as decoding does. A model "
                 "without a router (Vanilla, Recursive) runs one causal forward under both, so its two columns agree.")


def paper_theme() -> None:
    """The figures' look: a white background with a light grid and paper-sized text, from
    matplotlib's own style sheets (seaborn was a dependency for its ``set_theme`` alone; issue 60)."""
    import matplotlib.pyplot as plt

    plt.style.use(["seaborn-v0_8-whitegrid", "seaborn-v0_8-paper"])


def task_name(task: str) -> str:
    base = task.removeprefix("mor_").removesuffix("_openai")
    return TASK_NAMES.get(base, task)


def accuracy_cells(row: pd.Series, tasks: list[str], acc_col: str = "accuracy", avg_col: str = "avg_accuracy") -> dict:
    """'Avg acc' (the mean over tasks of lm-eval's acc) and each task's acc, each followed by
    its stderr column; None where a run has no accuracy (lm-eval not run). ``acc_col`` /
    ``avg_col``: the protocol's columns (``PROTOCOL_COLUMNS``; the causal one by default)."""
    acc, se = _as_map(row.get(acc_col)), _as_map(row.get(f"{acc_col}_stderr"))
    avg, avg_se = row.get(avg_col), row.get(f"{avg_col}_stderr")
    out = {"Avg acc": _round(avg), f"Avg acc{SE}": _round(avg_se)}
    for t in tasks:
        out[task_name(t)] = _round(acc.get(t))
        out[f"{task_name(t)}{SE}"] = _round(se.get(t))
    return out


def protocol_name(name: str, protocol: str) -> str:
    """A column's name under a protocol: 'NLL (causal)', 'PIQA (top-k, sees future)'."""
    return f"{name} ({protocol})"


def protocol_nll_cells(row: pd.Series, paper: float | None = None, with_paper: bool = True, digits: int = 4) -> dict:
    """The NLL under each protocol (with its seed sd where folded), the paper's number
    (``paper``, blank when None) right after the authors' one; ``with_paper`` False: no such column."""
    out = metric_cells(row, "val_nll", protocol_name("NLL", TOPK), digits)
    if with_paper:
        out["Paper NLL"] = paper
    out.update(metric_cells(row, "val_nll_causal", protocol_name("NLL", CAUSAL), digits))
    return out


def protocol_accuracy_cells(row: pd.Series, tasks: list[str], paper_avg: float | None = None,
                            with_paper: bool = True) -> dict:
    """``accuracy_cells`` under each protocol, labelled, the authors' first and the paper's
    average accuracy (``paper_avg``, blank when None) right after theirs; ``with_paper`` False:
    no such column."""
    out = {}
    for protocol, (_, acc, avg) in PROTOCOL_COLUMNS.items():
        cells = accuracy_cells(row, tasks, acc, avg)
        out.update({(protocol_name(k, protocol) if not k.endswith(SE) else protocol_name(k[:-len(SE)], protocol) + SE): v
                    for k, v in cells.items()})
        if protocol == TOPK and with_paper:
            out["Paper Avg acc"] = paper_avg
    return out


def _as_map(v) -> dict:
    """A task -> value map cell (a dict, pyarrow's list of pairs, or null) as a dict."""
    if v is None or (isinstance(v, float) and pd.isna(v)):
        return {}
    return dict(v)


def result_tasks(df: pd.DataFrame) -> list[str]:
    """The lm-eval tasks any run of the frame has (under either protocol): the paper's six in
    its order, then others."""
    cols = [c for c in ("accuracy", "accuracy_topk") if c in df.columns]
    seen = list(dict.fromkeys(t for c in cols for acc in df[c] for t in _as_map(acc)))
    order = list(TASK_NAMES)
    key = lambda t: (order.index(b) if (b := t.removeprefix("mor_").removesuffix("_openai")) in order else len(order))  # noqa: E731
    return sorted(seen, key=key)


def _round(v, digits: int = 4):
    return None if v is None or (isinstance(v, float) and pd.isna(v)) else round(float(v), digits)


def metric_cells(row: pd.Series, metric: str, name: str, digits: int = 4) -> dict:
    """A metric's cell and, where seeds were folded (mor.reports.seeds), its sd cell."""
    out = {name: _round(row.get(metric), digits)}
    if f"{metric} sd" in row.index:
        out[f"{name} sd"] = _round(row.get(f"{metric} sd"), digits)
    return out


def run_count(df: pd.DataFrame) -> int:
    """Runs behind a (possibly seed-folded) frame."""
    return int(df["n_seeds"].sum()) if "n_seeds" in df.columns else len(df)


def seeds_in(df: pd.DataFrame) -> list[int]:
    """Every seed behind a (possibly seed-folded) frame."""
    if "seeds" in df.columns:
        return sorted({int(s) for seeds in df["seeds"] for s in seeds})
    return sorted(int(s) for s in df["seed"].unique())


def seed_count(row: pd.Series) -> dict:
    """The 'n' (seeds) cell of a folded row, nothing for an unfolded one."""
    return {"n": int(row["n_seeds"])} if "n_seeds" in row.index else {}


LOWER_IS_BETTER = ("NLL", "Dead token ratio", "MaxVio")  # a column whose name contains one: lower is better
HIGHER_IS_BETTER = ("Avg acc", "Sampling acc", *TASK_NAMES.values())


def direction_header(col: str) -> str:
    """A printed column's name with its direction (↓ lower is better, ↑ higher) and 'n (seeds)'."""
    if col == "n":
        return "n (seeds)"
    if any(k in col for k in LOWER_IS_BETTER):
        return f"{col} ↓"
    if any(col == k or col == f"Paper {k}" or col.startswith(f"{k} (") for k in HIGHER_IS_BETTER):
        return f"{col} ↑"
    return col


def reading_note(table: pd.DataFrame) -> str:
    """How to read a printed table (the note above it): the arrows, n, what ± is, and why a
    task's accuracy is 0 in every row where it is."""
    note = ("↓: lower is better, ↑: higher is better; n (seeds): the runs averaged in a row, which differ only in "
            "their seed; ± after an NLL: the sd over those seeds (none for n = 1), after an accuracy: lm-eval's stderr.")
    for task in TASK_NAMES.values():
        cols = [c for c in table.columns if (c == task or c.startswith(f"{task} (")) and not c.endswith(SE)]
        if not cols:
            continue
        values = pd.concat([pd.to_numeric(table[c], errors="coerce") for c in cols]).dropna()
        if len(values) and (values == 0).all():
            note += (f" {task} reads 0.000 ± 0.000 in every row: its acc counts a passage only when the greedy "
                     "continuation is exactly the passage's last word, which no model this small gets right on any "
                     "passage scored (so its stderr is 0 too); not a bug, and no information: compare NLLs.")
    return note


def shown(table: pd.DataFrame) -> pd.DataFrame:
    """The table as printed (.md, .tex, .html): blanks for nulls, each stderr and seed sd folded
    into its value's cell ('v ± e'), each column's direction in its name (``direction_header``)."""
    out = table.astype(object).where(table.notna(), "")
    for col in [c for c in table.columns if c.endswith(" sd")]:
        base = col[: -len(" sd")]
        if base in out.columns:
            out[base] = [f"{v:.4f} ± {e:.4f}" if v != "" and e != "" else (f"{v:.4f}" if v != "" else "")
                         for v, e in zip(out[base], out[col])]
        out = out.drop(columns=col)
    for col in [c for c in table.columns if c.endswith(SE)]:
        base = col[: -len(SE)]
        if base in out.columns:
            out[base] = [f"{v:.3f} ± {e:.3f}" if v != "" and e != "" else (f"{v:.3f}" if v != "" else "")
                         for v, e in zip(out[base], out[col])]
        out = out.drop(columns=col)
    return out.rename(columns=direction_header)


def latex(printed: pd.DataFrame) -> str:
    """A printed table (``shown``) as LaTeX, its arrows as math."""
    text = printed.to_latex(index=False, escape=True)
    return text.replace("↓", "$\\downarrow$").replace("↑", "$\\uparrow$").replace("±", "$\\pm$")


def scale_key(s: str) -> float:
    """Sort key of a paper scale name ('135M' < '1.7B'); unknown names last."""
    mult = {"M": 1e6, "B": 1e9}
    try:
        return float(s[:-1]) * mult.get(s[-1], 1)
    except ValueError:
        return float("inf")


def has_mor(df: pd.DataFrame) -> bool:
    return bool((df["variant"] == "mor").any())


def load_results(results: Path, grid: Path, fold: bool = False) -> tuple[pd.DataFrame, list[dict]]:
    """Results frame plus the grid's reference rows (the paper's published numbers).

    ``fold``: one row per config, its seeds' metrics as mean, '<metric> sd' and n_seeds
    (mor.reports.seeds); tables fold, figures draw every seed."""
    df = read_frame(results)
    if df.empty:
        raise ValueError(f"{results} holds no runs")
    if fold:
        from mor.reports.seeds import FOLDED, fold_seeds

        df = fold_seeds(df, FOLDED)
    ref = yaml.safe_load(Path(grid).read_text()).get("reference", [])
    return df, ref


EVIDENCE_NOTES = {
    "deciding": ("Evidence: deciding. grids/{grid}.yaml chose this mode's budget and seeds ({seeds}) to decide the "
                 "claims of tables/claims that read it; its comments say why."),
    "demonstration": ("Evidence: demonstration. At this budget and {seeds} seed(s) the numbers show that the pipeline "
                      "runs end to end, not the paper's ordering (a local NLL's seed spread, 0.04-0.10 at 262K tokens, "
                      "exceeds the effects the paper reports, 0.01-0.03); a claim that reads only this grid stays "
                      "inconclusive with one seed (tables/claims)."),
}


def evidence_note(grid: Path, mode: str) -> str:
    """What a table's numbers are good for, from the grid's ``modes.<mode>.evidence`` (''
    where the mode does not say): every table note and report caption prints it."""
    from mor.grids import mode_settings

    spec = mode_settings(grid, mode)  # seeds may come from the mode's base file
    kind = spec.get("evidence")
    if kind is None:
        return ""
    return EVIDENCE_NOTES[kind].format(grid=Path(grid).stem, seeds=spec.get("seeds", 1))


def table_note(grid: Path, mode: str, *parts: str) -> str:
    """A table's note with its evidence level as the first sentence (issue 57: Table 10's was the
    last of ~290 words), then ``parts``. Where the mode states none, it says so."""
    evidence = evidence_note(grid, mode) or f"Evidence: not stated by the grid (grids/{Path(grid).stem}.yaml, mode {mode})."
    return " ".join(p.strip() for p in (evidence, *parts) if p and p.strip())


# A difference of two NLLs inside the seed spread is marked, not printed as 4 bare decimals.
SPREAD_MARK = "≈"


def spread_of(sds: list, n_seeds: int, mode: str) -> float | None:
    """The seed spread a difference between rows is read against: the larger seed sd of the rows
    compared where they have seeds (n > 1), LOCAL_NLL_SEED_SPREAD for one seed in mode local (the
    stated 0.04-0.10, docs/paper.md), None where nothing says how large it is."""
    known = [float(s) for s in sds if s is not None and not pd.isna(s)]
    if n_seeds > 1 and known:
        return max(known)
    return LOCAL_NLL_SEED_SPREAD if mode == "local" else None


def inside_spread(delta: float | None, spread: float | None) -> bool | None:
    """|delta| < spread (True: no evidence of a difference); None where either is unknown."""
    if delta is None or spread is None or pd.isna(delta):
        return None
    return abs(float(delta)) < spread


def marked(delta, inside) -> str:
    """A difference as printed: 3 decimals, SPREAD_MARK after it when inside the seed spread."""
    if delta is None or pd.isna(delta):
        return ""
    return f"{float(delta):+.3f}" + (f" {SPREAD_MARK}" if inside is True else "")


def reference_value(ref: list[dict], row: pd.Series, metric: str) -> float | None:
    for r in ref:
        if metric in r and all(r.get(k, _default(k)) == _norm(row.get(k), k) for k in REF_KEYS):
            return float(r[metric])
    return None


def _default(key):
    return False if key == "reduced" else None


def _norm(value, key):
    if key == "reduced":
        return bool(value)
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return None
    return int(value) if key == "num_recursions" else value


def write_html_table(csv: Path) -> Path:
    """``<name>.html`` beside ``<name>.csv``: the table as HTML, under the title and note of
    ``<name>.md`` when there is one. Snakemake's report shows HTML in place (a CSV is only a
    download), so every table folder carries one for ``--report``."""
    import html

    md = csv.with_suffix(".md")
    head = ""
    if md.exists():
        text = md.read_text().split("\n|", 1)[0]  # the prose before the markdown table
        paras = [p.strip() for p in text.split("\n\n") if p.strip()]
        head = "".join(f"<h2>{html.escape(p.lstrip('# '))}</h2>" if p.startswith("#") else f"<p>{html.escape(p)}</p>"
                       for p in paras)
    table = pd.read_csv(csv).rename(columns=direction_header).to_html(index=False, na_rep="", border=0,
                                                                      classes="mor-table")
    style = ("<style>body{font-family:sans-serif;font-size:13px;margin:1em}table{border-collapse:collapse}"
             "td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}th{background:#eee}</style>")
    out = csv.with_suffix(".html")
    out.write_text(f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(csv.stem)}</title>{style}"
                   f"</head><body>{head}{table}</body></html>\n")
    return out


# A local validation NLL's seed spread (sd over seeds, `small` scale, 262K tokens): 0.04-0.10
# (docs/paper.md, "Why these sizes"). A figure of NLLs with one seed per point is drawn on a
# y-axis at least SPAN_PER_SPREAD times this tall, so a gap inside it cannot look decisive.
LOCAL_NLL_SEED_SPREAD = 0.10
SPAN_PER_SPREAD = 5


def figure_note(df: pd.DataFrame, grid: Path, mode: str, per: str = "point", spread: bool = True) -> str:
    """The line every figure carries in its image (``save_figure``): the evidence level of the
    grid's mode, seeds per ``per`` (point, bar, panel) and which they are, and what the error
    bars are (±1 sd over seeds where n > 1; for n = 1 none, and ``spread``: the stated spread)."""
    from mor.grids import mode_settings
    from mor.reports.seeds import fold_seeds

    kind = mode_settings(grid, mode).get("evidence") if Path(grid).exists() else None
    ns = sorted(set(fold_seeds(df, ())["n_seeds"])) if len(df) else [0]
    n = f"{ns[0]}" if len(ns) == 1 else f"{ns[0]}-{ns[-1]}"
    seeds = ", ".join(str(s) for s in seeds_in(df))
    text = (f"Evidence: {kind or 'not stated by the grid'} (grids/{Path(grid).stem}.yaml, mode {mode}). "
            f"n = {n} seed{'s' if ns[-1] != 1 else ''} per {per} (seed{'s' if len(seeds_in(df)) != 1 else ''} {seeds}); ")
    if ns[-1] > 1:
        return text + "error bars: ±1 sd over seeds."
    return text + ("no error bars" + (f"; a local NLL's seed spread is 0.04-{LOCAL_NLL_SEED_SPREAD:.2f} "
                                      "(docs/paper.md), more than most gaps shown." if spread and mode == "local" else "."))


def honest_ylim(ax, values, sds=(), mode: str = "local") -> tuple[float, float]:
    """Y limits around ``values`` (their error bars ``sds`` included) spanning at least
    SPAN_PER_SPREAD x the seed spread (the largest sd shown; LOCAL_NLL_SEED_SPREAD where no
    point has an sd and the mode is local), so a gap smaller than the spread fills at most
    1 / SPAN_PER_SPREAD of the axis. Sets and returns them."""
    import math

    vals = [float(v) for v in values]
    sds = list(sds) + [None] * (len(vals) - len(list(sds)))  # aligned with values; None/NaN: no bar
    errs = [0.0 if s is None or math.isnan(float(s)) else float(s) for s in sds]
    lo = min(v - e for v, e in zip(vals, errs))
    hi = max(v + e for v, e in zip(vals, errs))
    spread = max(errs) if any(errs) else (LOCAL_NLL_SEED_SPREAD if mode == "local" else 0.0)
    span = max(hi - lo, SPAN_PER_SPREAD * spread) * 1.15 + 1e-3
    mid = (lo + hi) / 2
    ax.set_ylim(mid - span / 2, mid + span / 2)
    return mid - span / 2, mid + span / 2


def stamp(fig, note: str) -> None:
    """Add ``note`` in small type under everything the (laid out) figure shows: the figure
    grows by the note's height and every axes, figure legend, suptitle and figure text keeps
    its size and place above it."""
    import textwrap

    w, h = fig.get_size_inches()
    lines = textwrap.wrap(note, width=max(40, int(w * 19)))
    extra = 0.08 + 0.115 * len(lines)
    total = h + extra
    lift = lambda y: (y * h + extra) / total  # noqa: E731  figure fraction, old height -> new
    boxes = [(ax, ax.get_position()) for ax in fig.axes]
    fig.set_size_inches(w, total)
    for ax, pos in boxes:
        ax.set_position([pos.x0, lift(pos.y0), pos.width, pos.height * h / total])
    for legend in fig.legends:
        legend.set_bbox_to_anchor((0, extra / total, 1, h / total), transform=fig.transFigure)
    for t in fig.texts + ([fig._suptitle] if fig._suptitle is not None else []):
        x, y = t.get_position()
        t.set_position((x, lift(y)))
    fig.text(0.01, 0.04 / total, "\n".join(lines), ha="left", va="bottom", fontsize=6.5, color="0.25",
             gid="mor-note")


def save_figure(fig, out: Path, name: str, drawn: pd.DataFrame | None = None, dpi: int = 150, *,
                note: str) -> list[Path]:
    """A figure folder: <name>.png, <name>.pdf and (the numbers drawn) <name>.csv, written
    atomically (OutputDir); the matplotlib figure is closed. ``note`` (``figure_note``; required,
    so no figure leaves without it): the evidence level and seeds, stamped in the image under
    the laid-out figure."""
    import matplotlib.pyplot as plt

    if not note:
        raise ValueError(f"{out}: a figure states its evidence level and seeds (figure_note)")
    stamp(fig, note)
    od = OutputDir(out)
    try:
        with od as d:
            fig.savefig(d / f"{name}.png", dpi=dpi)
            fig.savefig(d / f"{name}.pdf")
            if drawn is not None:
                drawn.to_csv(d / f"{name}.csv", index=False)
    finally:
        plt.close(fig)
    return od.files()


class OutputDir:
    """Write into a hidden temporary folder and swap it in on success: readers see the old
    artifact or the whole new one, never half of one (``mor.atomic.replace_dir``)."""

    def __init__(self, final: Path):
        self.final = Path(final)
        self.tmp = temp_sibling(self.final)

    def __enter__(self) -> Path:
        self.final.parent.mkdir(parents=True, exist_ok=True)
        remove_stale(self.final.parent)
        self.tmp.mkdir()
        return self.tmp

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if exc_type is None:
                if self.final.parent.name == "tables":  # the report shows a table's HTML (write_html_table)
                    for csv in sorted(self.tmp.glob("*.csv")):
                        write_html_table(csv)
                replace_dir(self.tmp, self.final)
        except OSError as e:
            exc = e
        finally:
            shutil.rmtree(self.tmp, ignore_errors=True)
        if exc is not None and out_of_space(exc):  # matplotlib and pandas name only the temporary file
            raise OSError(errno.ENOSPC, f"No space left on device while writing {self.final}; the previous "
                                        f"{self.final.name} (if any) is unchanged: free space and run again") from exc
        if exc is not None and exc_type is None:
            raise exc

    def files(self) -> list[Path]:
        return sorted(self.final.iterdir())
