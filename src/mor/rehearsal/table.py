"""The rehearsal table: one row per job, as CSV and as Markdown (``rehearsal/<grid>.{csv,md}``)."""

from __future__ import annotations

import csv
import io
from pathlib import Path

from mor.atomic import atomic_path
from mor.rehearsal.measure import CATEGORIES, GiB

COLUMNS = (["run_id", "job", "world_size", "micro_batch", "status", "route", "gpu_gib"]
           + [f"measured_{c}_gib" for c in CATEGORIES] + [f"modelled_{c}_gib" for c in CATEGORIES])


def _gib(d: dict, k: str) -> str:
    return f"{d[k] / GiB:.2f}" if k in d else ""


def records(rows) -> list[dict]:
    """The table's rows as dicts of strings, in ``COLUMNS`` order."""
    out = []
    for r in rows:
        rec = {"run_id": r.run_id, "job": r.job, "world_size": str(r.world_size), "micro_batch": str(r.micro_batch),
               "status": r.status, "route": r.route, "gpu_gib": f"{r.gpu_gib:g}"}
        rec.update({f"measured_{c}_gib": _gib(r.measured, c) for c in CATEGORIES})
        rec.update({f"modelled_{c}_gib": _gib(r.modelled, c) for c in CATEGORIES})
        out.append(rec)
    return out


def to_csv(rows) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=COLUMNS, lineterminator="\n")
    w.writeheader()
    w.writerows(records(rows))
    return buf.getvalue()


def to_markdown(rows, title: str) -> str:
    """Counts first, then one line per job: measured / modelled GiB per category."""
    rows = list(rows)
    ok = sum(r.status.startswith("ok") for r in rows)
    failed = [r for r in rows if r.status.startswith("FAILED")]
    lines = [f"# Rehearsal: {title}", "",
             f"{len(rows)} job(s): {ok} passed, {len(failed)} failed, {len(rows) - ok - len(failed)} not rehearsed. "
             "Memory per GPU in GiB, measured on fake tensors / modelled by mor.memory (docs/rehearsal.md).", "",
             "| run | job | world | micro-batch | status | GPU | " + " | ".join(CATEGORIES) + " |",
             "|---|---|---:|---:|---|---:|" + "---:|" * len(CATEGORIES)]
    for r in rows:
        cells = [f"{_gib(r.measured, c)} / {_gib(r.modelled, c) or '-'}" if r.measured else "" for c in CATEGORIES]
        lines.append(f"| {r.run_id} | {r.job} | {r.world_size} | {r.micro_batch} | {r.status} | {r.gpu_gib:g} | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write(rows, out_stem: Path, title: str) -> tuple[Path, Path]:
    """``<out_stem>.csv`` and ``<out_stem>.md``, each replaced whole."""
    out_stem = Path(out_stem)
    out_stem.parent.mkdir(parents=True, exist_ok=True)
    paths = out_stem.with_suffix(".csv"), out_stem.with_suffix(".md")
    for path, text in zip(paths, (to_csv(rows), to_markdown(rows, title))):
        with atomic_path(path) as tmp:
            Path(tmp).write_text(text)
    return paths


def check(csv_path: Path) -> int:
    """``python -m mor.rehearsal.table rehearsal/<grid>.csv``: exit 1 naming each failed row."""
    with open(csv_path, newline="") as f:
        failed = [r for r in csv.DictReader(f) if r["status"].startswith("FAILED")]
    for r in failed:
        print(f"{r['run_id']} {r['job']}: {r['status']}")
    print(f"{csv_path}: {len(failed)} failed job(s)")
    return 1 if failed else 0


if __name__ == "__main__":
    import sys

    sys.exit(check(Path(sys.argv[1])))
