"""``python -m mor <command>``: the user-facing verbs (layer: the top; it may import anything below).

    runs     list a grid's runs (ids, labels) for a mode; --check validates every grid
    collect  merge per-run parquet             report   render a table or figure from parquet
    row      a grid's result row of a run, from the run's eval measurement (mor.eval.row)
    claims   check the paper's claims against the results (tables/claims)
    status   where every run the targets need stands (--watch refreshes)
    export-hf  a finished run as a transformers folder (AutoModelForCausalLM, trust_remote_code)
    import-authors  a checkpoint the authors' trainer saved, as one of our run folders

Job kinds and the launcher's verbs are one code path: ``python -m mor train ...`` (likewise
eval, lmeval, analysis, throughput, data and plan) is ``python -m mor.launch train ...``,
which the Snakemake rules run (see ``python -m mor.launch --help``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mor.errors import is_domain_error, one_line
from mor.grids import all_grids, load_grid
from mor.jobs import KINDS

LAUNCH_VERBS = (*(k for k in KINDS if k != "import"), "plan")  # handed to mor.launch whole (import: run by train)
def _runs(a) -> int:
    if a.check:
        for p in all_grids():
            for mode in load_grid(p, "local").raw["modes"]:
                g = load_grid(p, mode)
                print(f"{p}: {mode}: {len(g.runs)} runs ok")
        return 0
    g = load_grid(a.grid, a.mode)
    for r in g.select(a.tags):
        print(f"{r.run_id}\t{r.block}\t{r.config.label}")
    return 0


def _collect(a) -> int:
    from mor.results import collect

    n = collect(a.inputs, a.out, a.grid)
    print(f"collected {n} runs -> {a.out}")
    return 0


def _row(a) -> int:
    from mor.eval.row import grid_row, summary

    print(summary(grid_row(a.grid, a.run_id, a.mode, a.run_dir, a.out)))
    return 0


def _report(a) -> int:
    from mor.reports import render
    from mor.results import check_drawn_from

    # drawn only from exactly the runs the grid lists in this mode under the tags in force
    grid = load_grid(a.grid, a.mode)
    check_drawn_from(a.results, [r.run_id for r in grid.select(a.tags)], grid.name, a.mode, a.tags)

    for path in render(a.artifact, a.results, a.grid, a.mode, a.data_root):
        print(f"wrote {path}")
    return 0


def _claims(a) -> int:
    import json

    from mor.claims import render_claims

    rounds = [json.loads(Path(f).read_text()) for f in a.round or []]
    for path in render_claims(a.results, a.out, a.mode, a.analyses, rounds, spec=a.spec, skew=a.skew):
        print(f"wrote {path}")
    return 0


def _migrate_runs(a) -> int:
    from mor.migrate import MigrateError, main as migrate_main

    try:
        return migrate_main(a.root, a.dry_run)
    except MigrateError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def _status(a) -> int:
    from mor.status import main as status_main

    return status_main(a)


def _export_hf(a) -> int:
    from mor.export_hf import export_run

    run_dir = _run_folder(Path(a.run_dir))
    out = export_run(run_dir, a.out_dir, a.data_root, a.results, a.routing, force=a.force)
    print(f"exported {run_dir} -> {out}")
    return 0


def _is_run(d: Path) -> bool:
    from mor.layout import RunPaths

    files = RunPaths.of(d)
    return files.config.exists() or files.checkpoints.is_dir() or files.train_log.exists() or files.final.is_dir()


def _run_folder(path: Path) -> Path:
    """The run folder ``export-hf`` was given: ``runs/<run id>``, where the id may be any
    prefix of one run's (what ``mor status`` shows), or a bare id prefix looked up in
    ``runs/``. A path that is no run says what it found there (a grid folder, a file, an
    unfinished run, nothing)."""
    from mor.export_hf import ExportError
    from mor.layout import RUNS, RunPaths

    if path.is_file():
        raise ExportError(f"{path}: a file, not a run folder; give runs/<run id>")
    if path.is_dir():
        files = RunPaths.of(path)
        if _is_run(path):
            if not files.weights.exists():  # a run still training (or stopped) is not corrupt
                raise ExportError(f"{path}: unfinished run: no final weights ({files.weights} does not exist yet); let "
                                  "the workflow finish its training (it resumes from the last checkpoint), then export")
            return path
        runs = sorted(d.name for d in path.iterdir() if d.is_dir() and _is_run(d))
        if runs:
            raise ExportError(f"{path}: a folder holding {len(runs)} run(s), not a run; export one of them, "
                              f"e.g. {path / runs[0]} (`python -m mor status` lists them with their states)")
        grids = sorted(d.name for d in path.iterdir() if d.is_dir() and any(_is_run(r) for r in d.iterdir() if r.is_dir()))
        if grids:
            raise ExportError(f"{path}: a folder of grids ({', '.join(grids[:6])}), not a run: runs of the layout before "
                              "one home per run (runs/<grid>/<run id>); move them once with `python -m mor migrate-runs`, "
                              "then give runs/<run id>")
        raise ExportError(f"{path}: no run here (no {files.config.name}, checkpoints or final weights); a run "
                          "folder is runs/<run id>")
    parents = [path.parent]
    if path.parent == Path(".") and Path(RUNS).is_dir():  # a bare run id (prefix): the runs' one home
        parents = [Path(RUNS)]
    near = sorted(d for parent in parents if parent.is_dir() for d in parent.iterdir()
                  if d.is_dir() and d.name.startswith(path.name) and not d.name.startswith("."))
    if len(near) == 1:
        return _run_folder(near[0])
    if len(near) > 1:
        raise ExportError(f"{path}: run id prefix {path.name!r} is ambiguous: {len(near)} run folders start with it: "
                          + ", ".join(str(d) for d in near[:8]) + (" ..." if len(near) > 8 else ""))
    where = ", ".join(str(p) for p in parents if p.is_dir())
    raise ExportError(f"{path}: no such run folder" + (f", and no run in {where} starts with {path.name!r}" if where
                                                        else f" ({path.parent} does not exist)"))


def _import_authors(a) -> int:
    from mor.checkpoints.authors import import_checkpoint
    from mor.checkpoints.native import CheckpointError

    out = Path(a.run_dir)
    if out.exists() and any(out.iterdir()) and not a.force:
        raise CheckpointError(f"{out} is not empty; pass --force to import over it")
    meta = import_checkpoint(a.checkpoint, out, config=a.config, commit=a.commit)
    m = meta["model"]
    print(f"{out}: {m['router']['type']} {m['tying']} Nr={m['num_recursions']} kv={m['kv']} "
          f"attention={m['recursion_attention']}, {len(meta['provenance']['files_sha256'])} files hashed")
    return 0


def _recipe(a) -> int:
    """Print the recipe (mor.recipe); exit 1 when a setting differs from the authors' released
    config without a recorded reason."""
    from mor.grids import grid_path, load_grid
    from mor.recipe import format_recipe, recipe, unexplained

    path = Path(a.grid) if a.grid.endswith(".yaml") else grid_path(a.grid)
    settings = recipe(load_grid(path, a.mode))
    sys.stdout.write(format_recipe(settings, a.format))
    return 1 if unexplained(settings) else 0


def main(argv: list[str] | None = None) -> int:
    """Exit 0 on success; a domain error or a file system error (full disk, no permission) is one
    line on stderr and exit 2 (1 for a failed Slurm job); a closed pipe (``| head``) ends quietly."""
    try:
        return _main(sys.argv[1:] if argv is None else list(argv))
    except BrokenPipeError:  # the reader went away: stdout's last flush at exit must not fail again
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - only the suite's own errors and OSErrors are turned into one line
        if not (is_domain_error(e) or isinstance(e, OSError)):
            raise
        print(one_line(e), file=sys.stderr)
        launch = sys.modules.get("mor.launch.slurm_submit")
        return 1 if launch and isinstance(e, launch.LaunchError) else 2


def _main(args: list[str]) -> int:
    if args and args[0] in LAUNCH_VERBS:
        from mor.launch.__main__ import main as launch_main

        return launch_main(args)
    a = build_parser().parse_args(args)
    return a.fn(a)


def _prog() -> str:
    """The name the user typed: ``mor`` (the console script) or ``python -m mor``."""
    return "mor" if Path(sys.argv[0]).name == "mor" else "python -m mor"


def build_parser() -> argparse.ArgumentParser:
    """The parser of every verb but the launcher's (those are parsed by mor.launch): one place,
    so ``--help`` and the tests see the same verbs and help lines."""
    ap = argparse.ArgumentParser(prog=_prog(), description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    p = sub.add_parser("runs", help="list or check grid runs")
    p.add_argument("--grid", help="grid file or name whose runs to list")
    p.add_argument("--mode", default="local", help="the grid's mode (local, cluster, ...)")
    p.add_argument("--tags", nargs="*", help="the grid blocks in force; none given = all")
    p.add_argument("--check", action="store_true", help="validate every shipped grid in every mode")
    p.set_defaults(fn=_runs)

    for verb in LAUNCH_VERBS:  # listed in --help; parsed by mor.launch (see main)
        sub.add_parser(verb, help=f"= python -m mor.launch {verb} ...", add_help=False)

    p = sub.add_parser("recipe", help="every training setting of a grid's runs with its source (paper, authors, ours)")
    p.add_argument("--grid", required=True, help="grid file or name")
    p.add_argument("--mode", default="cluster", help="the grid's mode")
    p.add_argument("--format", default="text", choices=("text", "csv"), help="a text table or CSV")
    p.set_defaults(fn=_recipe)

    p = sub.add_parser("collect", help="merge a grid's per-run parquet rows into results/<grid>.parquet")
    p.add_argument("--grid", required=True, help="grid name")
    p.add_argument("--out", required=True, help="the merged parquet to write")
    p.add_argument("inputs", nargs="+", help="the per-run parquet files (results/runs/<grid>/<run_id>.parquet)")
    p.set_defaults(fn=_collect)

    p = sub.add_parser("row", help="a grid's result row of a run, from the run's eval measurement")
    p.add_argument("--grid", required=True, help="the grid file that lists the run")
    p.add_argument("--run-id", required=True, help="the run's id (its folder runs/<run_id>)")
    p.add_argument("--mode", default="local", help="the grid's mode")
    p.add_argument("--run-dir", required=True, help="the run's folder (runs/<run_id>)")
    p.add_argument("--out", required=True, help="results/runs/<grid>/<run_id>.parquet")
    p.set_defaults(fn=_row)

    p = sub.add_parser("report", help="draw one table or figure from a grid's merged parquet")
    p.add_argument("--artifact", required=True, help="e.g. tables/table10 or figures/fig6")
    p.add_argument("--results", required=True, help="the grid's merged parquet (results/<grid>.parquet)")
    p.add_argument("--grid", required=True, help="grid file (for reference numbers)")
    p.add_argument("--mode", default="local", help="the grid's mode the results hold")
    p.add_argument("--tags", nargs="*", default=[], help="the grid blocks in force (as the workflow's `tags`); [] = all")
    p.add_argument("--data-root", default="data", help="where the tokenizer is (tables/figures that decode tokens)")
    p.set_defaults(fn=_report)

    p = sub.add_parser("claims", help="check the paper's claims against the results (tables/claims)")
    p.add_argument("--results", default="results", help="folder of the grids' <grid>.parquet")
    p.add_argument("--out", default="tables/claims", help="folder for claims.md/.csv and the forest plot")
    p.add_argument("--spec", default=None, type=Path,
                   help="the claims' pre-registered design (default: the shipped grids/claims/claims.yaml)")
    p.add_argument("--mode", default="local", help="the mode the results hold")
    p.add_argument("--analyses", default=None, help="folder holding runs/<run>.depth_cap.npz (default: --results)")
    p.add_argument("--round", action="append", help="the adaptive design's round files (plan.json), in order")
    p.add_argument("--skew", action="store_true",
                   help="also skew.md / skew.csv: each tested comparison's skewness with a bootstrap interval (issue 47)")
    p.set_defaults(fn=_claims)

    from mor.status import add_arguments as status_arguments

    p = sub.add_parser("status", help="where every run the targets need stands (read only)")
    status_arguments(p)
    p.set_defaults(fn=_status)

    p = sub.add_parser("migrate-runs", help="move runs/<grid>/<run_id> (the layout before) to runs/<run_id>, once "
                       "(docs/crash-recovery.md); refuses two different copies of one run, deletes nothing")
    p.add_argument("--root", default=".", help="the folder holding runs/, results/ and logs/")
    p.add_argument("-n", "--dry-run", action="store_true", help="print what would move, move nothing")
    p.set_defaults(fn=_migrate_runs)

    p = sub.add_parser("export-hf", help="a finished run as a transformers folder")
    p.add_argument("run_dir", help="a run folder, runs/<run id>; the id may be any unique prefix (as `status` shows it)")
    p.add_argument("out_dir", help="the transformers folder to write")
    p.add_argument("--data-root", default="data", help="where the run's tokenizer is")
    p.add_argument("--results", default="results", help="results folder (the model card's validation NLL)")
    p.add_argument("--routing", default="causal", choices=("causal", "topk"),
                   help="expert-choice routing the exported forward uses by default (causal: generation)")
    p.add_argument("--force", action="store_true",
                   help="replace OUT_DIR when it is an earlier export (its .mor-export.json lists what it wrote); any "
                   "other non-empty folder, a run, runs/, results/ and the repository are refused, --force or not")
    p.set_defaults(fn=_export_hf)

    p = sub.add_parser("import-authors", help="a checkpoint the authors' trainer saved, as one of our run folders")
    p.add_argument("checkpoint", help="their save_pretrained folder (config.json, pytorch_model.bin)")
    p.add_argument("run_dir", help="the run folder to write (config.json, final/model.safetensors)")
    p.add_argument("--config", type=Path, default=None,
                   help="their resolved training config (recursive / mor sections); default: the checkpoint's "
                   "authors_config.yaml or .hydra/config.yaml")
    p.add_argument("--commit", default="", help="their repository's commit that trained it (provenance)")
    p.add_argument("--force", action="store_true", help="write into a non-empty RUN_DIR")
    p.set_defaults(fn=_import_authors)
    return ap


if __name__ == "__main__":
    sys.exit(main())
