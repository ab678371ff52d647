"""A grid's result row of a run: the run's eval measurement with what is the grid's (issue 58).

Why apart from the eval job: a run several grids list is scored once per distinct eval settings
(``mor.eval.job`` writes ``runs/<run_id>/eval/<eval_hash>.parquet``, the run's own), while its
row in each grid's parquet carries that grid's name, label and config. This step copies the
measurement under the grid's identity, so a grid that lists a run already scored with its
settings costs a file copy, not an evaluation. It also adds the throughput job's decoding figures
(``runs/<run_id>/throughput.json``, where the workflow made one): they are the run's own file too,
and a measurement made before they existed never has to be redone for them. Torch-free.
"""

from __future__ import annotations

import json
from pathlib import Path

from mor.grids import load_grid
from mor.identity import eval_hash_of
from mor.layout import RunPaths
from mor.results import MAPS, ResultsError, config_of, read_rows, write_rows

# What the row takes from the grid's listing of the run, not from the measurement.
GRID_COLUMNS = ("grid", "label", "config_json")


def grid_row(grid: str, run_id: str, mode: str, run_dir: str, out: str) -> dict:
    """Write ``out``, grid ``grid``'s result row of ``run_id``, from the measurement under the eval
    settings that grid lists the run with. A measurement of other settings or another run is refused."""
    g = load_grid(grid, mode)
    run = g.run(run_id).config
    files = RunPaths.of(run_dir)
    measurement = files.measurement(run.eval_hash)
    rows = read_rows(measurement).to_pylist()
    if len(rows) != 1 or rows[0]["run_id"] != run_id:
        raise ResultsError(f"{measurement}: expected the one measurement of run {run_id}, found "
                           f"{[r['run_id'] for r in rows]}")
    (m,) = rows
    if eval_hash_of(config_of(m)) != run.eval_hash:
        raise ResultsError(f"{measurement}: measured with eval settings {config_of(m).get('eval')}, not grid "
                           f"{g.name}'s {run.eval_dict()['eval']}; delete it and re-run the workflow")
    for k in MAPS:  # maps come back as lists of pairs
        if isinstance(m[k], list):
            m[k] = dict(m[k])
    row = {**m, "grid": g.name, "label": run.label, "config_json": json.dumps(run.to_dict(), sort_keys=True)}
    if files.throughput.exists():  # the throughput job's file (a fig4a grid's input); without it decode_* stay null
        from mor.engine.job import throughput_columns  # imports the engine (torch): only a row that needs it pays

        row.update(throughput_columns(files.throughput, run_id))
    write_rows(out, [row])
    return row


def summary(r: dict) -> str:
    """The one line a finished row step prints."""
    return f"row {r['grid']}/{r['run_id']}: val NLL {r['val_nll']:.4f}"
