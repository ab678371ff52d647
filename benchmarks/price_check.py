"""The plan's CPU prices against the CPU time a finished local run folder recorded.

For every job of the target's grids (the claims' added seeds included, as ``mor status`` lists
them) that left a usage record (``runs/<id>/usage/<job>.json``, the run's one home; ``eval-<eval hash>.json``
for an eval job), it prints per (scale,
preset kind) the jobs, the measured and the priced CPU-minutes, their ratio, the sustained
model TFLOP/s the jobs measured beside the presets' fixed seconds a job (`start_s`), the mean
CPU seconds a job, and where the jobs' FLOPs differ a least-squares fit of both numbers: the number ``slurm/presets.yaml`` carries for that scale, so
that the plan prices a local target at what it costs (``mor.launch.price_check``). Then the
totals, the same per grid, and the target's price before anything runs, with and without the
claims' whole look (what ``tests/unit/test_price_check.py`` holds within its budget).

    .venv/bin/python benchmarks/price_check.py                     # `paper` in this checkout
    .venv/bin/python benchmarks/price_check.py --root /path/to/a/finished/clone tables/table10

Nothing runs or trains; it reads the run folder and the grids.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("targets", nargs="*", default=["paper"])
    p.add_argument("--root", type=Path, default=REPO, help="the checkout whose runs/ and results/ are read")
    p.add_argument("--mode", default="local")
    a = p.parse_args(argv)

    from mor import usage
    from mor.jobs import KINDS
    from mor.launch.cost import plan_grid
    from mor.launch.presets import load_presets
    from mor.launch.price_check import (fit_start, job_label, priced_cpu_minutes, rates, shared_cpu_minutes,
                                         with_full_look)
    from mor.layout import RunPaths
    from mor.status.targets import resolve_targets, with_design_seeds

    targets = resolve_targets(a.targets, a.root / "grids", a.mode)
    grids = with_design_seeds(targets, a.root / "results")
    presets = load_presets()
    pairs, per_grid, points, unrecorded = [], {}, {}, 0
    for g in grids:
        for j in plan_grid(g, presets):
            settings = g.run(j.run_id).config.eval_hash if j.kind == "eval" else ""
            rec = usage.read(RunPaths.own(j.run_id, a.root).usage(job_label(j, settings)))
            if rec is None:
                unrecorded += 1
                continue
            kind = KINDS[j.kind].preset
            pairs.append((j, kind, float(rec["cpu_s"]), presets.get(j.scale, kind).start_s))
            points.setdefault((j.scale, kind), []).append((j.flops, float(rec["cpu_s"])))
            m, pr = per_grid.get(g.name, (0.0, 0.0))
            per_grid[g.name] = (m + float(rec["cpu_s"]), pr + j.device_hours * 3600)
    rs = rates(pairs)
    print(f"{'scale':<14}{'kind':<11}{'jobs':>5}{'measured':>10}{'priced':>9}{'ratio':>7}{'TFLOP/s':>9}"
          f"{'s/job':>7}   fit: start s, TFLOP/s   (CPU-min; TFLOP/s beside the presets' start_s)")
    for r in rs:
        fit = fit_start(points[(r.scale, r.kind)])
        fitted = f"{fit[0]:>6.1f} {fit[1]:.4f}" if fit else "     -"
        print(f"{r.scale:<14}{r.kind:<11}{r.jobs:>5}{r.cpu_s / 60:>10.1f}{r.priced_s / 60:>9.1f}"
              f"{r.measured_over_priced:>7.2f}{r.tflops:>9.4f}{r.cpu_s / r.jobs:>7.1f}   {fitted}")
    m, pr = sum(r.cpu_s for r in rs) / 60, sum(r.priced_s for r in rs) / 60
    print(f"{'all':<25}{sum(r.jobs for r in rs):>5}{m:>10.1f}{pr:>9.1f}{m / pr if pr else float('nan'):>7.2f}")
    print(f"\nper grid (CPU-min, measured / priced), {unrecorded} planned job(s) without a record:")
    for name, (ms, ps) in sorted(per_grid.items()):
        print(f"  {name:<14}{ms / 60:>8.1f} / {ps / 60:<8.1f}")
    own = priced_cpu_minutes(targets, presets)
    full = priced_cpu_minutes(with_full_look(targets, a.mode), presets)
    print(f"\npriced before anything runs: {sum(own.values()):.1f} CPU-min for the grids' own seeds, "
          f"{sum(full.values()):.1f} with the claims' whole look ({a.mode} design, its family's blocks "
          f"at the last look)")
    for what, gs in (("own seeds", targets), ("whole look", with_full_look(targets, a.mode))):
        shared = shared_cpu_minutes(gs, presets)
        print(f"  {what}, each distinct run's jobs once and its eval once per eval settings (issue 58): "
              f"{sum(shared.values()):.1f} CPU-min (" + ", ".join(f"{k} {v:.1f}" for k, v in shared.items()) + ")")
    return 0


if __name__ == "__main__":
    sys.exit(main())
