"""Dry run for the cluster: jobs per kind, GPU-hours per table and the run ids, before any sbatch.

    python -m mor.launch plan --grid grids/table10.yaml --mode cluster --presets slurm/presets.yaml

Time of one training job = training FLOPs (``mor.flops.train_flops``: 6N per token plus
attention, scaled by MoR capacities) / (GPUs x the preset's assumed ``tflops_per_gpu``).
An eval job scores ``eval.nll_tokens`` tokens forward only (2N per token; lm-eval tasks are
not counted). A job longer than its preset's ``time_min`` runs as several Slurm segments
(time-out -> checkpoint -> requeue), each asking for the full time limit, so

    GPU-h estimated = hours x GPUs        GPU-h requested = segments x time_min/60 x GPUs

"requested" is what the scheduler books (and what a fair-share account is charged at most);
"estimated" is what the run should use if the throughput assumption holds. On CPU presets
(gpus_per_node 0) both GPU columns are 0 and the hours are per CPU task.

Memory (train jobs on GPU presets): the micro-batch the job will run, from the preset's
``execution`` (``micro_batch: auto`` = the largest that the memory model ``mor.memory``
fits into the site's ``gpu_memory_gib``; the train job picks the same from the GPU it gets),
and the modelled peak per GPU. A run that does not fit even at micro-batch 1 is listed
under a warning before the table.

The data job (FineWeb-Edu, one per hub tokenizer the grids use) is listed first: tokens to
prepare (train + val of workflows/fineweb.yaml), and CPU-hours = tokens / the ``data``
preset's ``tokens_per_s_per_cpu`` (measured by benchmarks/bench_fineweb.py), wall hours =
CPU-hours / its cpus_per_task. A corpus already prepared (its manifests exist) costs nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pathlib import Path

from mor.budget import run_vocab
from mor.config import RunConfig, model_shape
from mor.flops import forward_flops_per_token, train_flops
from mor.memory import GiB, pick_micro_batch, training_memory
from mor.grids import Grid
from mor.jobs import KINDS
from mor.launch.slurm import Preset, Presets

PLANNED = tuple(name for name, k in KINDS.items() if k.planned)  # the kinds with a FLOPs model (train, eval)


@dataclass(frozen=True)
class JobEstimate:
    run_id: str
    kind: str  # train | eval
    scale: str
    nodes: int
    gpus: int  # whole job
    world_size: int
    time_min: int
    flops: float
    hours: float  # estimated wall-clock hours
    segments: int  # Slurm jobs (1 + requeues after time-outs)
    tokens: int = 0  # train: the tokens it trains (derived from train.budget_flops where set)
    budget: float = 0.0  # train.budget_flops (0 = tokens set by hand)
    paper_scale: str = ""
    variant: str = ""
    micro_batch: int = 0  # train on a GPU preset: sequences per forward pass (0 = not modelled)
    memory_gib: float = 0.0  # the memory model's peak per GPU at that micro-batch
    fits: bool = True  # False: even micro-batch 1 exceeds the GPU's usable memory

    @property
    def gpu_hours(self) -> float:
        return self.hours * self.gpus

    @property
    def gpu_hours_requested(self) -> float:
        return self.segments * self.time_min / 60 * self.gpus


def job_flops(run: RunConfig, kind: str) -> float:
    shape = model_shape(run.model)
    vocab, t = run_vocab(run), run.train
    if kind == "train":
        return train_flops(run.model, shape, vocab, t.seq_len, t.steps * t.tokens_per_step)
    if kind == "eval":
        return forward_flops_per_token(run.model, shape, vocab, t.seq_len) * run.eval.nll_tokens
    raise ValueError(f"no FLOPs model for job kind {kind!r}")


def memory_fit(run: RunConfig, preset: Preset) -> tuple[int, float, bool]:
    """(micro-batch, modelled peak GiB per GPU, fits) of a train job on a GPU preset whose
    site memory is known; (0, 0.0, True) where there is nothing to model."""
    if not (preset.gpus_per_node and preset.gpu_memory_gib):
        return 0, 0.0, True
    execution, world, t = preset.exec_config, preset.world_size, run.train
    vocab = run_vocab(run)
    dtype = "fp32" if t.precision == "fp32" else "bf16"
    if execution.micro_batch == "auto":
        fit = pick_micro_batch(run, vocab, preset.gpu_memory_gib * GiB, world, preset.parallel, execution, dtype)
        return fit.micro_batch, fit.estimate.total / GiB, fit.fits
    per_rank = max(1, t.global_batch // world)
    mb = execution.micro_batch or min(t.micro_batch, per_rank)
    shape = model_shape(run.model)
    est = training_memory(run.model, shape, shape.vocab or vocab, t.seq_len, mb, dtype, world, preset.parallel,
                          execution.activation_checkpointing, execution.loss_chunk)
    from mor.memory import usable_bytes

    return mb, est.total / GiB, est.total <= usable_bytes(preset.gpu_memory_gib * GiB)


def estimate(run: RunConfig, kind: str, preset: Preset) -> JobEstimate:
    flops = job_flops(run, kind)
    devices = preset.gpus or preset.world_size  # GPUs, or CPU tasks on a CPU preset
    hours = flops / (preset.tflops_per_gpu * 1e12 * devices) / 3600
    segments = max(1, math.ceil(hours * 60 / preset.time_min))
    t = run.train
    micro, mem, fits = memory_fit(run, preset) if kind == "train" else (0, 0.0, True)
    return JobEstimate(run.run_id, kind, run.model.scale, preset.nodes, preset.gpus, preset.world_size,
                       preset.time_min, flops, hours, segments,
                       tokens=t.steps * t.tokens_per_step if kind == "train" else run.eval.nll_tokens,
                       budget=t.budget_flops, paper_scale=run.paper_scale or run.model.scale, variant=run.model.variant,
                       micro_batch=micro, memory_gib=mem, fits=fits)


def plan_grid(grid: Grid, presets: Presets, tags: list[str] | None = None,
              kinds: tuple[str, ...] = PLANNED) -> list[JobEstimate]:
    """One estimate per job the workflow would submit for this grid (each planned kind per run),
    with the resources of the kind's preset entry (``mor.jobs.KINDS``)."""
    return [estimate(r.config, kind, presets.get(r.config.model.scale, KINDS[kind].preset))
            for r in grid.select(tags) for kind in kinds]


def _hm(minutes: int) -> str:
    return f"{minutes // 60}:{minutes % 60:02d}"


def format_plan(grid: Grid, jobs: list[JobEstimate], presets: Presets) -> str:
    kinds = sorted({j.kind for j in jobs}, key=("train", "eval", "throughput").index)
    per_kind = {k: [j for j in jobs if j.kind == k] for k in kinds}
    est = sum(j.gpu_hours for j in jobs)
    req = sum(j.gpu_hours_requested for j in jobs)
    by_kind = ", ".join(f"{k} {sum(j.gpu_hours_requested for j in v):.1f}" for k, v in per_kind.items())
    artifacts = ", ".join(grid.artifacts) or "(no artifacts)"
    lines = [
        f"{grid.name} ({grid.path}, mode {grid.mode}) -> {artifacts}",
        f"  runs: {len({j.run_id for j in jobs})}; jobs: " + ", ".join(f"{k} {len(v)}" for k, v in per_kind.items()),
        f"  GPU-hours for {artifacts}: {est:.1f} estimated, {req:.1f} requested ({by_kind})",
        f"  presets: {presets.path}" + (f"; site: {_site_line(presets)}" if presets.site else ""),
    ]
    lines += format_budgets(jobs)
    misfits = [j for j in jobs if not j.fits]
    if misfits:
        lines.append(f"  WARNING: {len(misfits)} train job(s) do not fit the GPU's memory even at micro-batch 1 "
                     "(turn on execution.activation_checkpointing / loss_chunk, or parallel: fsdp, in the preset):")
        lines += [f"    {j.run_id}: {j.memory_gib:.1f} GiB per GPU" for j in misfits]
    lines.append(f"  {'run id':<44} {'kind':<5} {'scale':<6} {'nodes x GPUs':>12} {'limit':>6} {'tokens':>8} "
                 f"{'PFLOP':>10} {'est. h':>8} {'jobs':>4} {'GPU-h est':>9} {'GPU-h req':>9} {'micro':>5} {'GiB/GPU':>7}")
    for j in jobs:
        mem = f"{j.micro_batch:>5} {j.memory_gib:>7.1f}" if j.micro_batch else f"{'':>5} {'':>7}"
        lines.append(
            f"  {j.run_id:<44} {j.kind:<5} {j.scale:<6} {f'{j.nodes} x {j.gpus // j.nodes}':>12} "
            f"{_hm(j.time_min):>6} {_tokens(j.tokens):>8} {j.flops / 1e15:>10.3g} {j.hours:>8.2f} {j.segments:>4} "
            f"{j.gpu_hours:>9.1f} {j.gpu_hours_requested:>9.1f} {mem}{'' if j.fits else '  DOES NOT FIT'}")
    return "\n".join(lines)


def _site_line(presets: Presets) -> str:
    s = presets.site
    return (f"{s.name} ({s.gpu}, {s.gpu_memory_gib:g} GiB, {s.gpus_per_node} per node, peak {s.peak_tflops_per_gpu:g} "
            f"TFLOP/s bf16; throughput {s.throughput_source})")


def _tokens(n: int) -> str:
    for div, unit in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= div:
            return f"{n / div:.3g}{unit}"
    return str(n)


def format_budgets(jobs: list[JobEstimate]) -> list[str]:
    """isoFLOP grids: per budget and variant, the tokens each scale's run will train
    (mor.budget) and the GPU-hours, so a user sees what a budget buys before submitting."""
    trains = [j for j in jobs if j.kind == "train" and j.budget]
    if not trains:
        return []
    out = ["  isoFLOP budgets: tokens per run derived from train.budget_flops (mor.budget)",
           f"    {'budget':>9} {'variant':<10} {'tokens per scale':<56} {'GPU-h est':>9} {'GPU-h req':>9}"]
    for b in sorted({j.budget for j in trains}):
        for v in dict.fromkeys(j.variant for j in trains):
            js = [j for j in trains if j.budget == b and j.variant == v]
            if js:
                toks = ", ".join(f"{j.paper_scale} {_tokens(j.tokens)}" for j in js)
                out.append(f"    {b:>9.3g} {v:<10} {toks:<56} {sum(j.gpu_hours for j in js):>9.1f} "
                           f"{sum(j.gpu_hours_requested for j in js):>9.1f}")
    return out


@dataclass(frozen=True)
class DataEstimate:
    tokenizer: str
    folder: Path
    tokens: int
    cpus: int
    time_min: int
    tokens_per_s_per_cpu: float
    ready: bool  # both manifests exist: the job will not run

    @property
    def cpu_hours(self) -> float:
        return 0.0 if self.ready else self.tokens / self.tokens_per_s_per_cpu / 3600

    @property
    def hours(self) -> float:
        return self.cpu_hours / self.cpus

    @property
    def segments(self) -> int:
        return max(1, math.ceil(self.hours * 60 / self.time_min))


def plan_data(grids: list[Grid], presets: Presets, settings_path, data_root="data",
              tags: list[str] | None = None) -> list[DataEstimate]:
    """One estimate per FineWeb-Edu corpus (one per tokenizer) that the grids' runs read."""
    from mor.data.fineweb import load_settings
    from mor.data.paths import fineweb_dir

    tokenizers = sorted({r.config.data.tokenizer for g in grids for r in g.select(tags)
                         if r.config.data.source == "fineweb-edu"})
    if not tokenizers:
        return []
    settings, preset = load_settings(settings_path), presets.data
    out = []
    for tok in tokenizers:
        folder = fineweb_dir(tok, Path(data_root))
        ready = all((folder / split / "manifest.json").is_file() for split in ("train", "val"))
        out.append(DataEstimate(tok, folder, settings.total_tokens, preset.cpus_per_task, preset.time_min,
                                preset.tokens_per_s_per_cpu, ready))
    return out


def format_data_plan(grids: list[Grid], presets: Presets, settings_path, data_root="data",
                     tags: list[str] | None = None) -> str:
    jobs = plan_data(grids, presets, settings_path, data_root, tags)
    if not jobs:
        return ""
    lines = [f"data: {len(jobs)} FineWeb-Edu preparation job(s) (settings {settings_path}, preset 'data' of "
             f"{presets.path}); CPU only",
             f"  {'tokenizer':<34} {'tokens':>8} {'CPUs':>5} {'limit':>6} {'tok/s/core':>10} {'CPU-h':>8} "
             f"{'est. h':>7} {'jobs':>4}"]
    for j in jobs:
        state = "  (prepared: nothing to do)" if j.ready else ""
        lines.append(f"  {j.tokenizer:<34} {j.tokens / 1e9:>7.2f}B {j.cpus:>5} {_hm(j.time_min):>6} "
                     f"{j.tokens_per_s_per_cpu:>10,.0f} {j.cpu_hours:>8.1f} {j.hours:>7.2f} {j.segments:>4}{state}")
    return "\n".join(lines)
