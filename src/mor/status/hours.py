"""The launcher's plan priced per run (``mor.launch.cost.plan_grid`` over the Slurm presets): the
hours ``mor status`` counts as done and left. Assumed speeds, not a measurement.
"""

from __future__ import annotations

from pathlib import Path

from mor.grids import Grid


def plan_hours(grids: list[Grid], presets_file: Path | None) -> tuple[dict, str, dict[str, str]]:
    """(grid, run id) -> {job kind: (wall hours, device-hours)} from the launcher's plan, the
    device word ("GPU", or "CPU" when no planned job has a GPU), and grid -> why the presets
    give it no plan. A grid the presets cannot price (a scale without an entry) loses its own
    hours, not every other grid's."""
    from mor.launch.cost import plan_grid
    from mor.launch.presets import load_presets

    presets = load_presets(presets_file) if presets_file else load_presets()
    out: dict[tuple[str, str], dict[str, float]] = {}
    failed: dict[str, str] = {}
    gpus = False
    for g in grids:
        try:
            jobs = plan_grid(g, presets)
        except Exception as e:  # noqa: BLE001 - named in the grid's summary line instead
            failed[g.name] = str(e)
            continue
        for j in jobs:
            gpus |= j.gpus > 0
            out.setdefault((g.name, j.run_id), {})[j.kind] = (j.hours, j.device_hours)
    return out, "GPU" if gpus else "CPU", failed
