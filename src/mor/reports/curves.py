"""Training curves of a grid: ``figures/curves/<grid>/`` (curves.png, .pdf, and curves.csv,
the numbers drawn).

    top row      training loss against training tokens (log x), one line per run config,
                 one panel per paper scale: the mean over seeds of each run's loss smoothed
                 by a trailing mean of ``window`` logged steps, the band its min..max over
                 seeds; a star at the end = validation NLL (teacher-forced; mean over seeds,
                 bar min..max)
    bottom row   MoR runs only, when their logs carry router statistics: the weighted router
                 loss (aux_loss: BCE + z-loss of expert-choice, balancing of token-choice; log
                 y when it spans a decade) and any other statistic the log holds (``mor.train_log.ROUTER_KEYS``)

Drawn from the runs' train logs (``mor.train_log``, a pure reader) and the grid's results
parquet (``mor.results``: which runs, their labels, seeds and validation NLL).

    python -m mor.reports.curves --grid table10 --results results/table10.parquet --runs runs \
        --out figures/curves/table10
"""

from __future__ import annotations

import argparse
import hashlib
from pathlib import Path

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from mor.reports.common import save_figure, scale_key  # noqa: E402
from mor.reports.seeds import config_without_seed  # noqa: E402
from mor.results import read_frame  # noqa: E402
from mor.train_log import read_grid_logs, router_keys  # noqa: E402

NAME = "curves"
SMOOTH_STEPS = 25  # window = logged steps / this (at least 1)
ROUTER_NAMES = {"aux_loss": "router loss (weighted)", "max_vio": "MaxVio", "sampling_accuracy": "sampling accuracy",
                "entropy": "router entropy", "dead_token_ratio": "dead-token ratio"}


def run_label(row: pd.Series) -> str:
    """The grid's label of a run, or its variant (and router) when the grid gives none."""
    if row.get("label"):
        return str(row["label"])
    parts = [str(row["variant"])]
    if row.get("router_type"):
        parts.append(str(row["router_type"]).replace("_", "-"))
    if row["variant"] != "vanilla":
        parts.append(f"{row.get('tying')} Nr={row.get('num_recursions')}")
    return " ".join(parts)


def unique_labels(df: pd.DataFrame) -> pd.Series:
    """One label per configuration and scale. A grid's label need not say everything that
    differs (table10's "cycle" is both Nr=2 and Nr=3), and two configurations under one label
    would be drawn as one line that runs back to its start; so where a label covers several
    configurations (``group``) of a scale, Nr is added, then a short hash of the config."""
    labels = df["label"].astype(str)
    extras = (lambda r: f"Nr={r['num_recursions']}",
              lambda r: hashlib.sha256(str(r["group"]).encode()).hexdigest()[:6])
    for extra in extras:
        clash = df.assign(label=labels).groupby(["paper_scale", "label"])["group"].transform("nunique") > 1
        if not clash.any():
            break
        labels = labels.where(~clash, labels + " " + df.apply(extra, axis=1).astype(str))
    return labels


def curve_table(results: Path, runs_root: Path, grid: str) -> tuple[pd.DataFrame, pd.DataFrame, int]:
    """(per-step curves folded over seeds, val NLL per config, smoothing window).

    curves: paper_scale, label, metric, step, tokens, mean, lo, hi, n_seeds.
    val: paper_scale, label, tokens, mean, lo, hi, n_seeds.
    """
    df = read_frame(results)
    if df.empty:
        raise ValueError(f"{results}: no runs")
    df = df.assign(group=df["config_json"].map(config_without_seed), label=df.apply(run_label, axis=1))
    df = df.assign(label=unique_labels(df))
    logs = read_grid_logs(runs_root, grid, list(df["run_id"]))
    window = max(1, int(logs.groupby("run_id")["step"].count().max()) // SMOOTH_STEPS)
    metrics = ["loss", *router_keys(logs)]
    smooth = logs.sort_values(["run_id", "step"]).copy()
    for m in metrics:
        smooth[m] = smooth.groupby("run_id")[m].transform(lambda s: s.rolling(window, min_periods=1).mean())
    meta = df.set_index("run_id")[["group", "label", "paper_scale", "variant"]]
    smooth = smooth.join(meta, on="run_id")
    curves = []
    for m in metrics:
        sub = smooth if m == "loss" else smooth[smooth["variant"] == "mor"]
        g = sub.groupby(["paper_scale", "group", "label", "step"])
        folded = g.agg(tokens=("tokens_seen", "mean"), mean=(m, "mean"), lo=(m, "min"), hi=(m, "max"),
                       n_seeds=(m, "count")).reset_index()
        curves.append(folded.assign(metric=m))
    curves = pd.concat(curves, ignore_index=True)
    last = logs.groupby("run_id")["tokens_seen"].max()
    vg = df.assign(tokens=df["run_id"].map(last)).groupby(["paper_scale", "group", "label"])
    val = vg.agg(tokens=("tokens", "mean"), mean=("val_nll", "mean"), lo=("val_nll", "min"), hi=("val_nll", "max"),
                 n_seeds=("val_nll", "count")).reset_index()
    return curves.drop(columns="group"), val.drop(columns="group"), window


def render_curves(results: Path, runs_root: Path, grid: str, out: Path) -> list[Path]:
    curves, val, window = curve_table(Path(results), Path(runs_root), grid)
    scales = sorted(curves["paper_scale"].unique(), key=scale_key)
    router = [m for m in dict.fromkeys(curves["metric"]) if m != "loss"]
    rows = 1 + len(router)
    fig, axes = plt.subplots(rows, len(scales), figsize=(5.6 * len(scales), 3.9 * rows + 1.2), squeeze=False)
    labels = list(dict.fromkeys(curves.sort_values("label")["label"]))
    cmap = plt.get_cmap("tab20" if len(labels) > 10 else "tab10")
    color = {lab: cmap(i % cmap.N) for i, lab in enumerate(labels)}
    for c, scale in enumerate(scales):
        for r, metric in enumerate(["loss", *router]):
            ax = axes[r][c]
            sub = curves[(curves["paper_scale"] == scale) & (curves["metric"] == metric)]
            for lab, line in sub.groupby("label", sort=True):
                ax.plot(line["tokens"], line["mean"], lw=1.1, color=color[lab], label=lab)
                if line["n_seeds"].max() > 1:
                    ax.fill_between(line["tokens"], line["lo"], line["hi"], color=color[lab], alpha=0.2, lw=0)
            if metric == "loss":
                for _, v in val[val["paper_scale"] == scale].iterrows():
                    err = np.array([[v["mean"] - v["lo"]], [v["hi"] - v["mean"]]]) if v["n_seeds"] > 1 else None
                    ax.errorbar(v["tokens"], v["mean"], yerr=err, fmt="*", ms=8, color=color[v["label"]],
                                mec="black", mew=0.4, capsize=2)
                ax.set_ylabel(f"training loss (mean of {window} steps)" if window > 1 else "training loss")
                ax.set_title(f"{scale}: training loss; * = validation NLL")
            else:
                if (sub["lo"] > 0).all() and sub["hi"].max() > 10 * sub["lo"].min():  # spans a decade: log y
                    ax.set_yscale("log")
                ax.set_ylabel(ROUTER_NAMES.get(metric, metric))
                ax.set_title(f"{scale}: MoR {ROUTER_NAMES.get(metric, metric)}")
            ax.set_xscale("log")
            ax.xaxis.set_major_locator(matplotlib.ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
            ax.xaxis.set_major_formatter(matplotlib.ticker.EngFormatter(sep=""))  # 2k, 5k, 10M
            ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
            ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
            ax.set_xlabel("training tokens")
            ax.grid(True, which="both", lw=0.3, alpha=0.5)
    handles = [plt.Line2D([], [], color=color[lab], lw=2) for lab in labels]
    fig.legend(handles, labels, loc="lower center", ncol=min(4, len(labels)), fontsize=7, frameon=False)
    n_seeds = int(curves["n_seeds"].max())
    band = f"band = min..max over {n_seeds} seeds" if n_seeds > 1 else "one seed per run"
    fig.suptitle(f"Training curves of grid {grid} ({band})")
    legend_rows = -(-len(labels) // 4)
    fig.tight_layout(rect=(0, min(0.4, 0.035 * legend_rows + 0.02), 1, 1))
    drawn = pd.concat([curves, val.assign(metric="val_nll", step=np.nan)], ignore_index=True)
    note = (f"Evidence: the training logs of grid {grid} (stars: each run's validation NLL, lower is better); "
            + (f"n = {n_seeds} seeds per curve; band and error bars: min..max over seeds." if n_seeds > 1
               else "n = 1 seed per curve: no band, no error bars."))
    return save_figure(fig, Path(out), NAME, drawn=drawn, note=note)


def caption(grid: str, root: Path = Path(".")) -> str:
    """The report's caption of ``figures/curves/<grid>``."""
    return (f"**figures/curves/{grid}**: training curves of every run of grids/{grid}.yaml. Training loss against "
            "training tokens (log x; each run's loss as a trailing mean over 1/25 of its logged steps), one line per "
            "run config and one panel per paper scale; with several seeds the line is their mean and the band their "
            "min..max. A star marks the validation NLL (teacher-forced) at the end of training. MoR runs add their "
            "router statistics as logged (the weighted router loss; log y when it spans a decade). Drawn from each run's "
            "runs/<run_id>/train_log.jsonl and the grid's results; the numbers drawn are curves.csv beside the figure.\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="training curves of a grid, from its runs' train logs")
    p.add_argument("--grid", required=True, help="grid name (its results list the runs drawn)")
    p.add_argument("--results", required=True, help="the grid's merged results parquet")
    p.add_argument("--runs", default="runs", help="the runs/ folder holding each run's runs/<run_id>/ (its one home)")
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    for path in render_curves(Path(a.results), Path(a.runs), a.grid, Path(a.out)):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
