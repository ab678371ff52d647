"""``python -m mor status``'s arguments and its loop: resolve the targets, collect, draw (and redraw
with ``--watch``).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from mor import layout
from mor.status.read import Paths
from mor.status.render import render
from mor.status.state import collect
from mor.status.targets import resolve_targets, with_design_seeds


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("targets", nargs="*", help="Snakemake targets (tables/table10, figures/fig6, paper), grid names, "
                                              "grid files or runs (runs/<id>, any unique prefix of the id); "
                                              "default: every grid with artifacts")
    p.add_argument("--mode", default="local", help="grid mode: local (CPU scales) or cluster")
    p.add_argument("--tags", default="", help="comma-separated block tags, as --config tags=... (default: all runs)")
    p.add_argument("--grids-dir", default="grids", help="folder of the grid YAML files")
    p.add_argument("--presets", default=None, help="Slurm presets for the plan (default slurm/presets.yaml)")
    p.add_argument("--root", default=".", help="the repository root holding runs/, results/ and logs/")
    p.add_argument("--watch", nargs="?", const=10.0, type=float, default=None, metavar="SECONDS",
                   help="refresh every SECONDS (default 10) until interrupted")
    p.add_argument("--wide", action="store_true", help="full run ids, progress bars and notes in the table, "
                                                       "however wide it gets (default: fit the terminal)")


def main(a: argparse.Namespace) -> int:
    from rich.console import Console

    root = Path(a.root)
    paths = Paths(root / layout.RUNS, root / layout.RESULTS, root / layout.LOGS, root / layout.SLURM_LOGS)
    grids_dir = Path(a.grids_dir) if Path(a.grids_dir).is_absolute() else root / a.grids_dir
    tags = [t for t in a.tags.split(",") if t]
    grids = with_design_seeds(resolve_targets(a.targets, grids_dir, a.mode), paths.results)
    presets = Path(a.presets) if a.presets else None
    # the terminal's width ($COLUMNS, else 80 when piped); --wide: as wide as the rows are
    console = Console(width=100_000) if a.wide else Console()
    show = lambda: render(collect(grids, paths, presets, tags), width=console.width, wide=a.wide)  # noqa: E731
    if a.watch is None:
        console.print(show())
        return 0
    from rich.live import Live

    with Live(show(), console=console, screen=False, refresh_per_second=1) as live:
        try:
            while True:
                time.sleep(a.watch)
                live.update(show())
        except KeyboardInterrupt:
            pass
    return 0
