"""The plan's CPU prices held against what the jobs measured (pure: estimates and seconds in).

Why: a local target's price (``mor status``, the claims' budget) is each job's FLOPs over an
assumed rate from ``slurm/presets.yaml``. At the CPU scales that rate is the whole model: a
tiny model's job is bound by start-up and per-op overhead, a larger one by arithmetic, so one
rate for every scale priced the deciding runs 3x too high and table9's micro runs too low. The
jobs' own CPU records (``mor.usage``) say what each (scale, preset kind) really sustained; this
module turns a finished run folder into those rates, so the presets can carry measured numbers
and the price of ``paper`` can be held to its budget before anything trains.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from mor.launch.cost import JobEstimate
from mor.usage import job_name


@dataclass(frozen=True)
class Rate:
    """One (scale, preset kind)'s jobs: their FLOPs, measured CPU seconds, priced CPU seconds, and
    the part of those the presets' ``start_s`` prices as fixed (start-up) seconds."""

    scale: str
    kind: str  # the preset kind (an analysis job prices as `eval`, mor.jobs.KINDS)
    jobs: int
    flops: float
    cpu_s: float
    priced_s: float
    start_s: float = 0.0  # sum over the jobs of their preset's start_s

    @property
    def tflops(self) -> float:
        """The sustained model TFLOP/s per process these jobs measured beside their fixed start-up
        seconds (a ratio of sums, so a long job weighs by its length, as in
        ``mor.status.forecast``); 0 when the start-up seconds leave nothing to divide by."""
        compute = self.cpu_s - self.start_s
        return self.flops / compute / 1e12 if compute > 0 else 0.0

    @property
    def measured_over_priced(self) -> float:
        return self.cpu_s / self.priced_s if self.priced_s > 0 else float("nan")


def job_label(j: JobEstimate, eval_settings: str = "") -> str:
    """The name of the job's usage record (``mor.usage.job_name``, as the launcher writes it):
    an eval job's carries its eval settings' hash (``RunConfig.eval_hash``), which the workflow's
    eval rule always passes."""
    return job_name(j.kind, j.analysis, eval_settings)


def rates(pairs: Iterable[tuple[JobEstimate, str, float, float]]) -> list[Rate]:
    """Per (scale, preset kind), from (estimate, its preset kind, measured CPU seconds, its preset's
    start_s) of every job that ran: the FLOPs, CPU seconds, priced CPU seconds and start-up
    seconds summed. The priced seconds are the estimate's ``device_hours``, as ``mor status``
    counts them."""
    acc: dict[tuple[str, str], list[float]] = {}
    for j, kind, cpu_s, start_s in pairs:
        a = acc.setdefault((j.scale, kind), [0, 0.0, 0.0, 0.0, 0.0])
        a[0] += 1
        a[1] += j.flops
        a[2] += float(cpu_s)
        a[3] += j.device_hours * 3600
        a[4] += float(start_s)
    return [Rate(s, k, int(n), f, c, p, st) for (s, k), (n, f, c, p, st) in sorted(acc.items())]


def fit_start(points: Iterable[tuple[float, float]]) -> tuple[float, float] | None:
    """(start-up seconds, TFLOP/s) of the line cpu_s = start + flops / rate through (flops, cpu_s)
    points by least squares: jobs of one kind whose FLOPs differ (table9's budgets, a step-0 run
    beside an up-training one) separate what a job costs whatever it computes from what its
    FLOPs cost. None when the FLOPs do not spread (max < 1.5 x min) or the fit is not a cost
    (a negative slope)."""
    pts = [(float(f), float(c)) for f, c in points]
    if len(pts) < 2 or min(f for f, _ in pts) * 1.5 > max(f for f, _ in pts):
        return None
    n = len(pts)
    mf, mc = sum(f for f, _ in pts) / n, sum(c for _, c in pts) / n
    sxx = sum((f - mf) ** 2 for f, _ in pts)
    slope = sum((f - mf) * (c - mc) for f, c in pts) / sxx
    if slope <= 0:
        return None
    return max(0.0, mc - slope * mf), 1.0 / slope / 1e12


def with_full_look(grids: list, mode: str) -> list:
    """The grids as the claims' design leaves them at most: every block that decides a claim of
    the mode's pre-registered family raised to the design's last look (``Design.block_seeds``,
    the pilot's seeds skipped as ``mor.claims.seeding.seed_offsets`` skips them). What ``paper``
    trains when every look is taken, so its price is known before round 0."""
    from mor.claims.registry import load_family, load_specs, spec_for
    from mor.claims.rounds import round_grid

    out = []
    for g in grids:
        spec_file = spec_for(g.path.parent)
        design, specs = load_specs(spec_file, mode=mode)
        family = load_family(mode, spec_file)
        reach = design.block_seeds(max(design.looks))
        raised = {b: reach for cid, s in specs.items() if family is None or cid in family
                  if s.decided_by.get("grid") == g.name for b in s.decided_by["runs"]}
        out.append(round_grid(g.path, mode, raised, design.first_seed) if raised else g)
    return out


def priced_cpu_minutes(grids: list, presets) -> dict[str, float]:
    """grid -> the plan's CPU-minutes for all its jobs (``mor.launch.cost.plan_grid``;
    ``JobEstimate.device_hours``, as ``mor status`` counts them)."""
    from mor.launch.cost import plan_grid

    return {g.name: sum(j.device_hours * 60 for j in plan_grid(g, presets)) for g in grids}


def shared_cpu_minutes(grids: list, presets) -> dict[str, float]:
    """job kind -> the plan's CPU-minutes of these grids' jobs as the workflow runs them together
    (issue 58, ``mor.launch.plan.campaign_jobs``): each distinct run's train, lm-eval, throughput and
    analyses once, its eval once per distinct eval settings. ``priced_cpu_minutes`` instead counts
    each grid's listing of a run again (what the layout before one home per run ran). Priced from
    the presets' rates, not measured; the row step that copies a measurement into each grid's row
    has no price (a process start, well under a CPU-second)."""
    from mor.launch.cost import plan_grid
    from mor.launch.plan import campaign_jobs

    out: dict[str, float] = {}
    for j in campaign_jobs({g.name: (g, plan_grid(g, presets)) for g in grids}):
        out[j.kind] = out.get(j.kind, 0.0) + j.device_hours * 60
    return out
