"""The decoding-throughput protocol's definition, without torch: which grids get a
``throughput`` job, the protocol file and its keys, and the Vanilla each run is normalised to.

One home for what four readers need: the job that measures (``mor.engine.job``), the
launcher's planner that prices it before anything is submitted (``mor.launch.plan``), and the
Snakefile that builds the DAG (workflows/rules/common.smk, throughput.smk). The planner and the
Snakefile must not import torch (``mor.engine`` does), so these live here rather than in
the engine package.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from mor.layout import THROUGHPUT_FILE  # noqa: F401  runs/<run_id>/throughput.json (re-exported)
from mor.yaml_io import load_yaml

PROTOCOL_FILE = Path(__file__).resolve().parents[2] / "workflows" / "config" / "throughput.yaml"
VERSION = 5  # 3: continuous depth-wise batching engine, row fill, passes/token; 4: live sequences admitted by memory; 5: one window (while requests wait) for every figure, whole-run values beside, admission by paged blocks; bump when the job measures something else: its files are then remade
ARTIFACTS = ("figures/fig4a", "tables/fig4a")  # grids listing one of these get a throughput job per run
KEYS = ("requests", "gen_mean", "gen_std", "gen_max", "warmup_tokens", "fixed_batch", "base_batch",
        "memory_gib", "dtype", "seed")


def load_protocol(mode: str, path: str | Path = PROTOCOL_FILE) -> dict:
    """The protocol of ``mode`` (the file's section of that name); a missing key fails."""
    raw = load_yaml(path)  # parsed once per process: Snakemake asks for it once per run (job_settings)
    if mode not in raw:
        raise ValueError(f"{path}: no throughput protocol for mode {mode!r}; sections: {sorted(raw)}")
    spec = raw[mode]
    missing = [k for k in KEYS if k not in spec]
    if missing:
        raise ValueError(f"{path}: section {mode!r} lacks {missing}")
    return {k: spec[k] for k in KEYS}


def sequence_len(p: dict) -> int:
    """KV entries (tokens fed) one request of protocol ``p`` holds at most, the engine's
    ``max_len``: its one prompt token and the first gen_max - 1 generated ones (the last
    generated token is never fed back) = gen_max. The job sizes its engine and App. E's
    memory model with it, the planner prices the job with it (mor.launch.cost)."""
    return int(p["gen_max"])


def measured(artifacts, run) -> bool:
    """Whether ``run`` of a grid listing ``artifacts`` gets a throughput job: every run of a grid
    that draws fig4a, and a run that imports the authors' checkpoint (issue 62: our engine on their
    model) when the engine serves it: tied attention (``mor.engine.step.Stepper`` refuses the
    release's untied expert-choice attention, which ``mor.model.decode`` serves)."""
    if set(artifacts) & set(ARTIFACTS):
        return True
    return bool(run.model.import_checkpoint) and run.model.recursion_attention == "tied"


def job_settings(run, mode: str, wildcards: dict) -> dict:
    """The throughput kind's settings hook (``mor.jobs``; Snakemake calls it while it builds the
    DAG, so it lives here, without torch): the mode's protocol (workflows/config/throughput.yaml)."""
    return load_protocol(mode)


def baseline(cfg):
    """The Vanilla model a run's speed is normalised to: same scale, the run's effective depth."""
    from mor.config import ModelConfig, model_shape
    from mor.flops import plan_for

    depth = len(plan_for(cfg, model_shape(cfg)).order)
    base = ModelConfig(scale=cfg.scale, variant="vanilla")  # execution.attention is not part of the model
    return base if depth == model_shape(base).layers else dataclasses.replace(base, layers=depth)
