"""What a local job cost: its process's CPU seconds (its own and its reaped children's) and
wall seconds, one small JSON per job in its run folder (``layout.RunPaths.usage``).

Why: the cost of a target such as ``paper`` is the sum of its jobs' CPU time. On a shared
machine a job that waits for a core takes longer, not more CPU, so CPU time moves far less
with the day's load than wall time does, and the plan's prices (assumed speeds,
``mor.launch.cost``) can be checked against it. ``mor status`` sums these records per grid.
A resumed job's attempts add up (the CPU of an attempt stopped with a checkpoint was spent);
a job run again after it finished starts a new record, since its result replaced the old one.
"""

from __future__ import annotations

import json
import resource
from pathlib import Path

from mor.atomic import write_json_atomic
from mor.layout import USAGE_DIR


def job_name(kind: str, analysis: str = "", eval_settings: str = "") -> str:
    """The name of a job's record: ``analysis-<name>`` for an analysis job (a run has one per
    analysis its grid draws), ``eval-<eval_hash>`` for an eval job under those eval settings (a
    run has one eval per settings its grids score it with, issue 58: one record each, so a second
    settings' eval never overwrites the first's cost), the job kind otherwise. The launcher writes
    it, the price check (``mor.launch.price_check``) reads it."""
    if kind == "analysis":
        return f"analysis-{analysis}"
    return f"eval-{eval_settings}" if kind == "eval" and eval_settings else kind


def cpu_seconds() -> float:
    """User + system CPU seconds of this process and of the children it has reaped."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def record(path: Path, cpu_s: float, wall_s: float, threads: int, finished: bool) -> dict:
    """Add one attempt to the job's record at ``path`` (written atomically) and return it."""
    old = read(path) or {}
    if old.get("finished"):  # a finished job run again: its new result, its new cost
        old = {}
    new = {"cpu_s": round(float(old.get("cpu_s", 0.0)) + cpu_s, 3),
           "wall_s": round(float(old.get("wall_s", 0.0)) + wall_s, 3),
           "attempts": int(old.get("attempts", 0)) + 1, "threads": int(threads), "finished": bool(finished)}
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, new)
    return new


def read(path: Path) -> dict | None:
    """A job's record, or None when it is missing or unreadable (a job that never ran here)."""
    try:
        r = json.loads(Path(path).read_text())
        return r if isinstance(r, dict) and float(r["cpu_s"]) >= 0 else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def run_cpu_s(run_dir: Path) -> dict[str, float]:
    """job -> CPU seconds of every recorded job of one run folder ({} when none ran here)."""
    out = {}
    for f in sorted((Path(run_dir) / USAGE_DIR).glob("*.json")):
        r = read(f)
        if r is not None:
            out[f.stem] = float(r["cpu_s"])
    return out
