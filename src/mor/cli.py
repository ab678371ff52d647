"""``python -m mor <command>``: the thin entry points the Snakemake rules call.

    runs     list a grid's runs (ids, labels) for a mode; --check validates every grid
    train    train / resume one run            eval     score one run, write its parquet row
    lmeval   one run's lm-eval accuracies (runs/<grid>/<id>/lm_eval.json, read by eval)
    collect  merge per-run parquet             report   render a table or figure from parquet
"""

from __future__ import annotations

import argparse
import sys

from mor.grids import GridError, all_grids, load_grid


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


def _train(a) -> int:
    from mor.jobs import train_job

    s = train_job(a.grid, a.run_id, a.mode, a.run_dir, a.data_root, a.device, threads=a.threads)
    print(f"trained {s['run_id']}: {s['steps']} steps, final loss {s['final_loss']:.4f}, "
          f"{s['tokens_per_s']:.0f} tok/s, {s['train_time_s']:.1f}s")
    return 0


def _eval(a) -> int:
    from mor.jobs import eval_job

    row = eval_job(a.grid, a.run_id, a.mode, a.run_dir, a.out, a.data_root, a.device, threads=a.threads)
    print(f"eval {row['run_id']}: val NLL {row['val_nll']:.4f} over {row['val_tokens']} tokens")
    return 0


def _lmeval(a) -> int:
    from mor.lm_eval.job import lmeval_job

    r = lmeval_job(a.grid, a.run_id, a.mode, a.run_dir, a.out, a.data_root, a.device, threads=a.threads,
                   tasks_dir=a.tasks_dir)
    print(lmeval_summary(r))
    return 0


def lmeval_summary(r: dict) -> str:
    accs = ", ".join(f"{t} {m['acc']:.3f}±{m['acc_stderr'] or 0:.3f}" for t, m in r["tasks"].items() if m["acc"] is not None)
    return f"lmeval {r['run_id']}: {accs or 'no tasks'} ({r['seconds']:.1f}s)"


def _collect(a) -> int:
    from mor.results import collect

    n = collect(a.inputs, a.out, a.grid)
    print(f"collected {n} runs -> {a.out}")
    return 0


def _report(a) -> int:
    from mor.reports import render

    for path in render(a.artifact, a.results, a.grid, a.mode, a.data_root):
        print(f"wrote {path}")
    return 0


def _claims(a) -> int:
    from mor.claims import render_claims

    for path in render_claims(a.results, a.out, a.mode):
        print(f"wrote {path}")
    return 0


def add_job_arguments(p: argparse.ArgumentParser, kind: str, threads_help: str) -> None:
    """The arguments of one train / eval job (shared by ``mor`` and ``mor.launch``)."""
    p.add_argument("--grid", required=True)
    p.add_argument("--run-id", required=True)
    p.add_argument("--mode", default="local")
    p.add_argument("--run-dir", required=True)
    p.add_argument("--data-root", default="data")
    p.add_argument("--device", default="auto")
    p.add_argument("--threads", type=int, default=0, help=threads_help)
    if kind in ("eval", "lmeval", "analysis", "throughput"):
        p.add_argument("--out", required=True)
    if kind == "analysis":
        from mor.analysis.job import ANALYSES

        p.add_argument("--analysis", required=True, choices=ANALYSES, help="what to measure (mor.analysis.job)")
    if kind == "lmeval":
        p.add_argument("--tasks-dir", help="converted offline tasks (default <data-root>/lm_eval/tasks)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mor", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)

    p = sub.add_parser("runs", help="list or check grid runs")
    p.add_argument("--grid")
    p.add_argument("--mode", default="local")
    p.add_argument("--tags", nargs="*")
    p.add_argument("--check", action="store_true")
    p.set_defaults(fn=_runs)

    for name, fn in (("train", _train), ("eval", _eval), ("lmeval", _lmeval)):
        p = sub.add_parser(name)
        add_job_arguments(p, name, threads_help="CPU threads (0 = torch default)")
        p.set_defaults(fn=fn)

    p = sub.add_parser("collect")
    p.add_argument("--grid", required=True, help="grid name")
    p.add_argument("--out", required=True)
    p.add_argument("inputs", nargs="+")
    p.set_defaults(fn=_collect)

    p = sub.add_parser("report")
    p.add_argument("--artifact", required=True, help="e.g. tables/table10 or figures/fig6")
    p.add_argument("--results", required=True)
    p.add_argument("--grid", required=True, help="grid file (for reference numbers)")
    p.add_argument("--mode", default="local")
    p.add_argument("--data-root", default="data", help="where the tokenizer is (tables/figures that decode tokens)")
    p.set_defaults(fn=_report)

    p = sub.add_parser("claims", help="check the paper's claims against the results (tables/claims)")
    p.add_argument("--results", default="results", help="folder of the grids' <grid>.parquet")
    p.add_argument("--out", default="tables/claims")
    p.add_argument("--mode", default="local")
    p.set_defaults(fn=_claims)

    a = ap.parse_args(argv)
    try:
        return a.fn(a)
    except GridError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
