"""``python -m mor.rehearsal --grid grids/table10.yaml``: rehearse a grid's cluster jobs, write the table.

Run it with the rehearsal venv's python (``scripts/setup_rehearsal.sh``) for the fake-CUDA part;
with a CPU build of torch only the fake-CPU step runs (``--device cpu``). Exit status 1 when a
job failed (the table names it and why).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from mor.grids import load_grid
from mor.jobs import KINDS
from mor.launch.presets import load_presets
from mor.rehearsal.jobs import rehearse
from mor.rehearsal.table import write


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--grid", required=True)
    ap.add_argument("--mode", default="cluster")
    ap.add_argument("--presets", default="slurm/presets.yaml")
    ap.add_argument("--site", default=None, help="slurm/sites/<name>.yaml (default: the presets file's)")
    ap.add_argument("--jobs", default="train,eval,lmeval,throughput",
                    help="comma-separated job kinds (mor.jobs.KINDS; docs/rehearsal.md says what each rehearses)")
    ap.add_argument("--runs", default="", help="comma-separated run ids (default: every run of the grid)")
    ap.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto",
                    help="auto: fake CUDA where this torch is a CUDA build, else fake CPU only")
    ap.add_argument("--data-root", default="rehearsal/data", help="real token files are used where present")
    ap.add_argument("--out", required=True, help="output stem: writes <out>.csv and <out>.md")
    ap.add_argument("--exit-zero", action="store_true", help="exit 0 even when a job failed (the table says so)")
    args = ap.parse_args(argv)
    device = args.device if args.device != "auto" else ("cuda" if torch.version.cuda else "cpu")
    grid = load_grid(args.grid, args.mode)
    presets = load_presets(args.presets, site=args.site)
    wanted = [r for r in args.runs.split(",") if r]
    runs = [r.config for r in grid.select(None) if not wanted or r.config.run_id in wanted]
    missing = set(wanted) - {r.run_id for r in runs}
    if missing:
        ap.error(f"no run(s) {sorted(missing)} in {args.grid} ({args.mode})")
    rows, t0 = [], time.perf_counter()
    for run in runs:
        for kind in [k for k in args.jobs.split(",") if k]:
            preset = presets.get(run.model.scale, KINDS[kind].preset)
            start = time.perf_counter()
            row = rehearse(kind, args.grid, run.run_id, args.mode, preset, device, Path(args.data_root))
            rows.append(row)
            print(f"{run.run_id} {kind}: {row.status} ({time.perf_counter() - start:.0f} s)", flush=True)
    csv_path, md_path = write(rows, Path(args.out), f"{grid.name} ({args.mode}), {device} rehearsal")
    print(f"wrote {csv_path} and {md_path} in {time.perf_counter() - t0:.0f} s")
    return 1 if any(r.status.startswith("FAILED") for r in rows) and not args.exit_zero else 0


if __name__ == "__main__":
    sys.exit(main())
