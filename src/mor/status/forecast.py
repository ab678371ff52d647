"""The plan's hours left at the speed the finished runs measured (pure: numbers in, numbers out).
"""

from __future__ import annotations

from typing import Iterable, NamedTuple


class Forecast(NamedTuple):
    factor: float  # measured / planned training time of the finished runs
    runs: int  # the runs it is measured on
    hours_left: float  # the plan's hours left x factor
    wall_hours: float | None  # hours_left / cores (one job per core), None without cores
    low: float = 0.0  # hours left at the fastest speed the range allows
    high: float = 0.0  # ... and at the slowest
    measured: tuple[tuple[str, float, int], ...] = ()  # (grid, its factor, its runs) it rests on
    unmeasured: tuple[str, ...] = ()  # grids without a finished run (priced by the range below)
    guess: tuple[float, float] = (1.0, 1.0)  # the factors those grids are priced between


def forecast(pairs: Iterable[tuple[float, float]], hours_left: float, cores: int | None = None) -> Forecast | None:
    """The plan's ``hours_left`` at the speed the finished runs measured: ``pairs`` are
    (measured, planned) training seconds of those runs, and the factor is sum(measured) /
    sum(planned). The plan prices every job at an assumed FLOP rate while a shared machine's
    real speed drifts by more than 2x between days; the finished runs say by how much. A ratio
    of sums, not a mean of ratios, so that each run weighs by its length: applied to the runs
    measured, it gives back the time they took, which a mean would skew towards the short
    runs' ratios (start-up and noise weigh most there). The range (``low``, ``high``) is the
    hours left at the fastest and the slowest single run's ratio. The other jobs (eval, ...)
    are assumed off by the same factor. ``cores``: the wall hours with one job per core (the
    local mode; a lower bound when fewer jobs than cores are left). None without a measured
    run (a pair without planned seconds is none)."""
    pairs = [(m, p) for m, p in pairs if p > 0]
    if not pairs:
        return None
    factor = sum(m for m, _ in pairs) / sum(p for _, p in pairs)
    ratios = [m / p for m, p in pairs]
    left = hours_left * factor
    return Forecast(factor, len(pairs), left, left / cores if cores else None,
                    hours_left * min(ratios), hours_left * max(ratios))


def forecast_grids(grids: list[tuple[str, list[tuple[float, float]], float]], cores: int | None = None
                   ) -> Forecast | None:
    """The forecast over several grids, each given as (name, its (measured, planned) pairs, its
    plan hours left): each grid's hours left at its own measured factor, and a grid without a
    finished run at the factor pooled over every grid's runs. Why not one pooled factor: the
    plan's error depends on the model size (table9's overhead-bound tiny models train at ~1.6x
    their FLOP price, the larger CPU scales at ~0.7-0.8x), so whichever grids happen to finish
    first would set the pace of all the rest. For the same reason the range prices a grid
    without a finished run anywhere between the slowest and fastest run measured and the plan
    itself (1.0x): nothing says which of them it resembles. The factor reported is the
    effective one, the forecast's hours left over the plan's. None without a measured run."""
    all_pairs = [(m, p) for _, pairs, _ in grids for m, p in pairs if p > 0]
    pooled = forecast(all_pairs, 1.0)
    if pooled is None:
        return None
    ratios = [m / p for m, p in all_pairs]
    guess = (min(ratios + [1.0]), max(ratios + [1.0]))
    left = low = high = 0.0
    measured, unmeasured = [], []
    for name, pairs, h in grids:
        f = forecast(pairs, h)
        if f is not None:
            left, low, high = left + f.hours_left, low + f.low, high + f.high
            measured.append((name, f.factor, f.runs))
        else:
            left, low, high = left + h * pooled.factor, low + h * guess[0], high + h * guess[1]
            unmeasured.append(name)
    plan_left = sum(h for _, _, h in grids)
    factor = left / plan_left if plan_left > 0 else pooled.factor
    return Forecast(factor, pooled.runs, left, left / cores if cores else None, low, high,
                    tuple(measured), tuple(unmeasured), guess)
