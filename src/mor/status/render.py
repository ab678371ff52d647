"""``mor status``'s rich table: one table per grid fitted to the terminal, its summary lines
(plan, measured, forecast) and the total.
"""

from __future__ import annotations

import os
import re

from mor.status.forecast import Forecast, forecast, forecast_grids
from mor.status.state import SPEED_WINDOW, GridStatus, RunStatus

STYLE = {"done": "green", "trained": "cyan", "running": "bold yellow", "queued": "blue", "failed": "bold red",
         "stopped": "magenta", "not started": "dim"}


def _measured_pairs(runs: list[RunStatus]) -> list[tuple[float, float]]:
    return [(r.train_s, r.train_plan_s) for r in runs if r.train_s is not None]


def _local_cores(grids: list[GridStatus], cores: int) -> int | None:
    """``cores`` when every grid is in the local mode (its jobs share this machine's cores),
    None for the cluster mode, whose Slurm jobs run in parallel elsewhere."""
    return cores if grids and all(gs.grid.mode == "local" for gs in grids) else None


def _duration(s: float | None, estimated: bool = False) -> str:
    if s is None:
        return ""
    if s < 1:
        return "~<1s" if estimated else "<1s"
    s = int(round(s))
    text = f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"
    return f"~{text}" if estimated else text


def _hours(h: float) -> str:
    return f"{h:.2f}" if h >= 0.1 or h == 0 else f"{h:.2g}"


def _num(v: float | None, fmt: str) -> str:
    return "" if v is None else format(v, fmt)


_HASH = re.compile(r"-[0-9a-f]{8}$")


def short_ids(run_ids: list[str], others: tuple[str, ...] = ()) -> dict[str, str]:
    """Run id -> a shorter name that pastes: a prefix of its id that no other id of ``run_ids``
    (nor of ``others``, the grid's runs not shown) starts with, so every command that takes a run id (``export-hf``, the launcher's) finds
    this run from it. The id without its 8-hex config hash where that is such a prefix (not
    for ``135M-vanilla`` beside ``135M-vanilla-reduced2-...``, nor seed 0 beside its ``-s1``),
    else with the shortest prefix of the hash (at least 4) that is, else the whole id."""
    out: dict[str, str] = {}
    for r in run_ids:
        if not _HASH.search(r):
            out[r] = r
            continue
        stem = _HASH.sub("", r)
        rest = [o for o in (*run_ids, *others) if o != r]
        out[r] = next((c for c in [stem] + [f"{stem}-{r[-8:][:n]}" for n in (4, 5, 6, 7)]
                       if not any(o.startswith(c) for o in rest)), r)
    return out


def _hours_lines(device: str, spent: float, whole: float, measured_s: float, measured_runs: int, priced_s: float,
                 f: Forecast | None, cores: int | None) -> list[tuple[str, str]]:
    """(label, text) lines of a summary: plan, measured and forecast, each saying what it is."""
    # hours of wall time of the jobs, summed (a GPU job's times its GPUs); on the CPU that is not
    # CPU time (a job's threads use several cores): that one is the "cpu" line's, in CPU-min
    unit = "wall-h" if device == "CPU" else f"{device}-h"
    lines = [("plan", f"{_hours(spent)} of {_hours(whole)} {unit} done, {_hours(whole - spent)} left "
                      "(priced, not measured)")]
    if measured_runs:
        ratio = f", priced at {_hours(priced_s / 3600)} ({measured_s / priced_s:.2f}x)" if priced_s else ""
        lines.append(("measured", f"{_hours(measured_s / 3600)} {unit} of training in {measured_runs} run"
                                  + "s" * (measured_runs != 1) + ratio))
    else:
        lines.append(("measured", "nothing yet (no finished run with a train_summary.json)"))
    if f is not None:
        wall = f"; {_duration(f.wall_hours * 3600, estimated=True)} on {cores} cores" if f.wall_hours is not None else ""
        basis = "" if f.measured else f"; {f.runs} run" + "s" * (f.runs != 1) + ", fastest to slowest"
        lines.append(("forecast", f"~{_hours(f.hours_left)} {unit} left, {_hours(f.low)} to {_hours(f.high)} "
                                  f"({f.factor:.2f}x the plan{basis}){wall}"))
        if f.measured:
            lines.append(("", "rests on " + ", ".join(f"{g} {k:.2f}x ({n} run{'s' * (n != 1)})"
                                                      for g, k, n in f.measured)))
        if f.unmeasured:
            lines.append(("", f"not measured yet, priced at {f.guess[0]:.2f}x to {f.guess[1]:.2f}x: "
                              + ", ".join(f.unmeasured)))
    return lines


def cpu_line(runs: list[RunStatus]) -> tuple[str, str] | None:
    """("cpu", "12.3 CPU-min in 45 jobs of 15 runs (train 8.1, eval 2.0, ...)"): the CPU time
    the runs' local jobs recorded (mor.usage), by job kind; None when none recorded any."""
    by_kind: dict[str, float] = {}
    jobs = 0
    for r in runs:
        for job, s in r.cpu_s.items():
            kind = job.split("-", 1)[0]
            by_kind[kind] = by_kind.get(kind, 0.0) + s
            jobs += 1
    if not jobs:
        return None
    ran = sum(bool(r.cpu_s) for r in runs)
    parts = ", ".join(f"{k} {v / 60:.1f}" for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1]))
    return ("cpu", f"{sum(by_kind.values()) / 60:.1f} CPU-min measured in {jobs} job" + "s" * (jobs != 1)
                   + f" of {ran} run" + "s" * (ran != 1) + f" ({parts})")


def _summary(head: str, lines: list[tuple[str, str]], style: str = ""):
    """The grid's (or the total's) summary: its head line, then the labelled lines aligned,
    each folding within its own column."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    t = Table.grid(padding=(0, 2, 0, 0), pad_edge=False)
    t.add_column(no_wrap=True, min_width=10)
    t.add_column()
    for label, text in lines:
        t.add_row(f"  {label}", text)
    return Group(Text(head, style=style), t)


def _fold_id(name: str, width: int) -> str:
    """A run id cut into lines of at most ``width`` at its dashes (then anywhere)."""
    lines, cur = [], ""
    for part in name.split("-"):
        piece = part if not cur else f"-{part}"
        if cur and len(cur) + len(piece) > width:
            lines.append(cur + "-")
            cur = part
        else:
            cur += piece
    lines.append(cur)
    return "\n".join(ln[i:i + width] for ln in lines for i in range(0, max(1, len(ln)), width))


NARROW_RUN_MIN = 12  # the run column's narrowest (folded) width


# what the tok/s column averages (mor.status.state.SPEED_WINDOW): recent speed, for the ETA; the
# results parquet's train_tokens_per_s is the whole run's (tokens seen / training time)
TOKS_NOTE = (f"tok/s: mean over the last {SPEED_WINDOW} logged steps; the results' train_tokens_per_s is the whole "
             "run's (tokens / training time)")


def _table(gs: GridStatus, width: int, wide: bool):
    """One grid's table. Wide: full ids, a progress bar and the notes in a column. Narrow:
    short ids folded into what the numbers leave, notes listed under the table."""
    from rich.progress_bar import ProgressBar
    from rich.table import Table
    from rich.text import Text

    names = {r.run_id: r.run_id for r in gs.runs} if wide else short_ids([r.run_id for r in gs.runs], gs.grid.others)
    cells = [[names[r.run_id], r.state, f"{r.step}/{r.steps}", _num(r.tokens_per_s, ".0f"),
              _duration(r.eta_s, r.estimated), _num(r.loss, ".3f"), _num(r.val_nll, ".4f")] for r in gs.runs]
    heads = ["run", "state", "steps", "tok/s", "ETA", "loss", "val NLL"]  # tok/s: TOKS_NOTE
    widths = [max([len(h)] + [len(c[i]) for c in cells]) for i, h in enumerate(heads)]
    # gaps of 2 between columns, 1 where that lets every id fit on one line
    gap = 2 if wide or widths[0] <= width - sum(widths[1:]) - 2 * (len(heads) - 1) else 1
    t = Table(box=None, pad_edge=False, expand=False, padding=(0, 1, 0, gap - 1), header_style="bold underline")
    if wide:
        t.add_column("run", no_wrap=True)
    else:  # what the other columns and the gaps leave, never less than NARROW_RUN_MIN
        run_w = max(NARROW_RUN_MIN, min(widths[0], width - sum(widths[1:]) - gap * (len(heads) - 1)))
        t.add_column("run", no_wrap=True, width=run_w)
        for c in cells:
            c[0] = _fold_id(c[0], run_w)
    t.add_column("state", no_wrap=True, min_width=widths[1])
    if wide:
        t.add_column("progress", no_wrap=True, width=16)
    for i, h in enumerate(heads[2:], start=2):
        t.add_column(h, justify="right", no_wrap=True, min_width=widths[i])
    if wide:
        t.add_column("note")
    for r, c in zip(gs.runs, cells):
        row = [c[0], Text(r.state, style=STYLE[r.state])]
        if wide:
            row.append(ProgressBar(total=max(1, r.steps), completed=r.step, width=16,
                                   complete_style="green" if r.state in ("done", "trained") else "yellow"))
        row += c[2:]
        if wide:
            row.append(r.note)
        t.add_row(*row)
    parts = [t]
    if any(r.tokens_per_s for r in gs.runs):
        parts.append(Text(TOKS_NOTE, style="dim"))
    notes = [(names[r.run_id], r.note) for r in gs.runs if r.note]
    if notes and not wide:  # under the table: the id, then the note folding in its own column
        grid = Table.grid(padding=(0, 1, 0, 0), pad_edge=False)
        grid.add_column(no_wrap=True)
        grid.add_column()
        for name, note in notes:
            grid.add_row(f"  {name}", note)
        parts += [Text("notes:"), grid]
    parts.append(Text(""))
    return parts


def render(statuses: list[GridStatus], cores: int | None = None, width: int = 80, wide: bool = False):
    """A rich renderable: one table per grid, its summary lines, and the total. ``cores``: this
    machine's, over which a local-mode forecast is divided (default ``os.cpu_count()``); a
    cluster-mode grid's jobs run in parallel on Slurm, so its forecast stays in device-hours.
    ``width``: the terminal's columns the narrow table is fitted to (``wide``: none)."""
    from rich.console import Group
    from rich.text import Text

    parts = []
    total_spent = total_all = 0.0
    device = statuses[0].device if statuses else "GPU"
    cores = cores or os.cpu_count() or 1
    for gs in statuses:
        parts.append(Text(f"{gs.grid.name} ({gs.grid.mode}) -> {', '.join(gs.grid.artifacts) or 'no artifacts'}",
                          style="bold"))
        parts += _table(gs, width, wide)
        spent = sum(r.hours_spent for r in gs.runs)
        whole = sum(r.hours_total for r in gs.runs)
        total_spent, total_all = total_spent + spent, total_all + whole
        counts = ", ".join(f"{n} {s}" for s, n in gs.counts().items())
        steps = sum(r.step for r in gs.runs), sum(r.steps for r in gs.runs)
        local = _local_cores([gs], cores)
        head = f"{gs.grid.name}: {len(gs.runs)} runs: {counts}; steps {steps[0]}/{steps[1]}"
        if gs.shared:  # runs an earlier grid lists too: one run, shown once (under that grid)
            under = sorted(set(gs.shared.values()))
            head += f"; and {len(gs.shared)} shared, shown under {', '.join(under)}"
        if gs.no_plan:
            lines = [("no hours", f"no plan from the presets ({gs.no_plan})")]
        else:
            pairs = _measured_pairs(gs.runs)
            lines = _hours_lines(gs.device, spent, whole, sum(m for m, _ in pairs), len(pairs),
                                 sum(p for _, p in pairs), forecast(pairs, whole - spent, local), local)
        lines += [x for x in (cpu_line(gs.runs),) if x]
        parts += [_summary(head, lines), Text("")]
    if len(statuses) > 1:
        n = sum(len(gs.runs) for gs in statuses)
        done = sum(r.state == "done" for gs in statuses for r in gs.runs)
        unpriced = [gs.grid.name for gs in statuses if gs.no_plan]
        lines = []
        if len(unpriced) == len(statuses):
            lines.append(("no hours", "no plan from the presets"))
        else:
            priced = [gs for gs in statuses if not gs.no_plan]
            local = _local_cores(priced, cores)
            per_grid = [(gs.grid.name, _measured_pairs(gs.runs), sum(r.hours_total - r.hours_spent for r in gs.runs))
                        for gs in priced]
            pairs = [pair for _, ps, _ in per_grid for pair in ps]
            lines += _hours_lines(device, total_spent, total_all, sum(m for m, _ in pairs), len(pairs),
                                  sum(p for _, p in pairs), forecast_grids(per_grid, local), local)
            if unpriced:
                lines.append(("no hours", f"no plan from the presets: {', '.join(unpriced)}"))
        lines += [x for x in (cpu_line([r for gs in statuses for r in gs.runs]),) if x]
        parts.append(_summary(f"all: {done}/{n} runs done", lines, style="bold"))
    return Group(*parts)
