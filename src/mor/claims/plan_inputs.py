"""What the claims' planning reads of grids/claims/claims.yaml, as one digest that changes only
when that does (the checkpoint ``seeding``'s ``params:`` trigger, workflows/rules/claims.smk).

Snakemake replans a round when an input is newer than its plan or its params changed. With
claims.yaml itself as the input, any edit (a ``reanalyses`` record, a comment, a margin's
source, the other mode's design) replanned every round and redrew everything after them, with
the same plans. ``mor.claims.rounds`` reads the mode's design (``load_specs``), the claims'
specs, the mode's budget and Holm family; ``plan_inputs`` is those, less the texts that reach
only the table (the ``*_source`` of a number, ``decided_by.why``: a plan.json records verdicts,
never their notes, mor.claims.seeding.next_round). ``plan_digest`` is the sha256 of it as
canonical JSON: it moves with a margin, a look, a budget or a deciding block and with nothing
else, and computing it writes nothing (the workflow's files parse without side effects). The
table (rule ``claims``) still reads claims.yaml itself: it draws the sources and the re-analyses.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path


def plan_inputs(spec: Path, mode: str) -> dict:
    """The parts of ``spec`` a round of ``mode`` plans with, JSON-able (errors as ``load_specs``'s)."""
    from mor.claims.registry import load_family, load_specs
    from mor.claims.rounds import load_budget

    design, specs = load_specs(spec, mode=mode)

    def planned(s) -> dict:
        d = {k: v for k, v in dataclasses.asdict(s).items() if not k.endswith("_source")}
        d["decided_by"] = {k: v for k, v in s.decided_by.items() if k != "why"}
        return d

    return {"mode": mode, "design": dataclasses.asdict(design), "budget": dataclasses.asdict(load_budget(spec, mode)),
            "family": load_family(mode, spec), "claims": {c: planned(s) for c, s in sorted(specs.items())}}


def plan_digest(spec: Path, mode: str) -> str:
    """sha256 of ``plan_inputs`` as canonical JSON (sorted keys): equal plans' inputs, equal digests."""
    text = json.dumps(plan_inputs(spec, mode), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()
