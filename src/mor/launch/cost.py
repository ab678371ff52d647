"""The plan's cost model (pure): every job the workflow submits for a grid, per kind, with
its FLOPs, hours and GPU-hours (estimated and requested), before any sbatch. The text the
launcher prints from it (``python -m mor.launch plan``) is ``mor.launch.plan``'s.

Which jobs (mirroring workflows/rules/*.smk, ``run_jobs``): per run a ``train`` and an ``eval`` job;
an ``lmeval`` job where the run lists ``eval.lm_eval_tasks`` (common.smk ``lm_eval_result``);
a ``throughput`` job per run of a grid that draws fig4a (``throughput_result``:
``mor.throughput_protocol.ARTIFACTS``); one ``analysis`` job per analysis an artifact of the grid draws
(``mor.analysis.sidecar.ARTIFACT_ANALYSES``) on the runs it applies to (``applies``:
``artifact_analyses``). The data job is planned apart (``plan_data``, below).

Cost of each job (``job_cost``, pure, from ``mor.flops``), in model FLOPs:

    train       ``train_flops``: 6N per trained token plus attention, scaled by MoR capacities
    eval        forward FLOPs (2N per token) x ``eval.nll_tokens``
    lmeval      forward FLOPs over the tokens its tasks score: per task, documents (all, or
                ``eval.lm_eval_limit(s)``) x loglikelihood requests per document x tokens per
                request (context + continuation, x (1 + shots), at most ``train.seq_len``), at
                the attention length of one request. Documents, requests and characters per
                request come from slurm/lm_eval_tasks.yaml (``lm_eval_sizes``); tokens =
                characters / its ``chars_per_token`` (assumed until measured). A task not in
                the file is not counted (warned).
    analysis    depth_cap: the eval's windows scored once per depth cap d = 1..Nr at the capped
                forward (``mor.flops.capped_forward_flops_per_token``), twice for MoR (the
                causal routing too); kv: one forward over ``eval.batch`` windows
    throughput  decode FLOPs of the engine protocol (workflows/config/throughput.yaml, the grid's
                mode): both settings (fixed batch, relative maximum batch) generate
                requests x gen_mean tokens after warmup_tokens x batch, each token at
                ``decode_flops_per_token`` of its mean context. Decoding is memory-bound: its
                FLOPs rate is far below training's, hence the site's own ``throughput`` figure.

Time of one job = FLOPs / (GPUs x the preset's assumed ``tflops_per_gpu`` for that kind). Its
time limit on a GPU preset = that time x the kind's margin (``TIME_MARGIN``: train 1.5x, scoring
2x; at least 30 min), at most the preset's ``time_min`` (``time_limit_min``); the launcher and
the workflow's ``runtime`` resource ask for the same (``timed_preset``). A train job longer than
its limit runs as several Slurm segments (time-out -> checkpoint -> requeue), each asking for the
full time limit, so

    GPU-h estimated = hours x GPUs        GPU-h requested = segments x time_min/60 x GPUs

"requested" is what the scheduler books (and what a fair-share account is charged at most);
"estimated" is what the run should use if the throughput assumption holds. On CPU presets
(gpus_per_node 0) both GPU columns are 0 and the hours are per CPU task. Submitit requeues a
job after at most ``max_timeouts`` time-outs: a train job needing more segments than
1 + max_timeouts is listed under a warning; so is a scoring job (eval, lmeval, analysis,
throughput) longer than its time limit, which restarts from scratch when requeued and so never
finishes (it books 1 + max_timeouts segments, then fails).

Memory (train jobs on GPU presets): the micro-batch the job will run, from the preset's
``execution`` (``micro_batch: auto`` = the largest that the memory model ``mor.memory``
fits into the site's ``gpu_memory_gib``; the train job picks the same from the GPU it gets),
and the modelled peak per GPU. A run that does not fit even at micro-batch 1 is listed
under a warning before the table; so is a throughput job whose model leaves no room for one
sequence's KV cache (``mor.flops.max_batch`` 0), and a job whose kind has no preset entry for
its scale (on Slurm it fails; the plan counts no GPU-hours for it).

The data job (FineWeb-Edu, one per hub tokenizer the grids use) is listed first: tokens to
prepare (train + val of workflows/config/fineweb.yaml), and CPU-hours = tokens / the ``data``
preset's ``tokens_per_s_per_cpu`` (measured by benchmarks/bench_fineweb.py), wall hours =
CPU-hours / its cpus_per_task. A corpus already prepared (its manifests exist) costs nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Mapping

from mor import throughput_protocol
from mor.analysis.sidecar import ARTIFACT_ANALYSES, applies
from mor.branching import trained_steps
from mor.budget import run_vocab
from mor.config import ConfigError, RunConfig, model_shape
from mor.flops import (capped_forward_flops_per_token, decode_flops_per_token, forward_flops_per_token, max_batch,
                       plan_for, relative_max_batch_exact, train_flops)
from mor.memory import GiB, pick_micro_batch, training_memory, usable_bytes
from mor.grids import Grid
from mor.jobs import KINDS
from mor.launch.presets import Preset, PresetError, Presets
from mor.yaml_io import REPO, key_line, load_derived, where

PLANNED = tuple(name for name, k in KINDS.items() if k.planned)  # kinds with a cost model, in the table's order
RESUMABLE = ("train",)  # kinds that resume after a time-out; the others start again

# --------------------------------------------------------------------------------------
# lm-eval: the size of each task the grids name (data: slurm/lm_eval_tasks.yaml)
# --------------------------------------------------------------------------------------
LM_EVAL_SIZES_FILE = REPO / "slurm" / "lm_eval_tasks.yaml"


@dataclass(frozen=True)
class LmEvalTask:
    docs: int  # documents scored when no limit is set
    requests: int  # loglikelihood requests over those documents (one per answer choice)
    chars: float  # mean characters of context + continuation per request (0-shot)


@dataclass(frozen=True)
class LmEvalSizes:
    """What the file holds: the assumed characters per token and each task's size (the
    numbers' sources are the file's comments)."""

    chars_per_token: float
    tasks: Mapping[str, LmEvalTask]  # read-only: shared by every caller (mor.yaml_io.load_derived)


class _SizeError(ValueError):
    def __init__(self, keys: list, message: str):
        super().__init__(message)
        self.keys = keys


def _positive(value, keys: list, kind: type) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0
    if not ok or (kind is int and not isinstance(value, int)):
        raise _SizeError(keys, f"{'.'.join(map(str, keys))}={value!r} must be a positive "
                               f"{'integer' if kind is int else 'number'}")


def _build_sizes(doc) -> LmEvalSizes:
    if not isinstance(doc, dict) or set(doc) != {"chars_per_token", "tasks"} or not isinstance(doc["tasks"], dict):
        raise _SizeError([], "must hold chars_per_token (a number) and tasks (name -> {docs, requests, chars})")
    _positive(doc["chars_per_token"], ["chars_per_token"], float)
    tasks = {}
    for name, spec in doc["tasks"].items():
        if not isinstance(spec, dict) or set(spec) != {"docs", "requests", "chars"}:
            raise _SizeError(["tasks", name], f"tasks.{name} must have exactly docs, requests and chars")
        for key, kind in (("docs", int), ("requests", int), ("chars", float)):
            _positive(spec[key], ["tasks", name, key], kind)
        tasks[str(name)] = LmEvalTask(spec["docs"], spec["requests"], float(spec["chars"]))
    return LmEvalSizes(float(doc["chars_per_token"]), MappingProxyType(tasks))


def lm_eval_sizes(path: str | Path = LM_EVAL_SIZES_FILE) -> LmEvalSizes:
    """The lm-eval task sizes of ``path``, parsed and checked once while the file is unchanged
    (the suite's one YAML reader); an invalid entry raises ConfigError naming the file and line."""
    try:
        return load_derived(path, _build_sizes)
    except _SizeError as e:
        raise ConfigError(f"{where(path, key_line(path, e.keys))}: {e}") from None


DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


# --------------------------------------------------------------------------------------
# which jobs a run gets (workflows/rules/*.smk)
# --------------------------------------------------------------------------------------
def grid_analyses(grid: Grid) -> tuple[str, ...]:
    """The analyses the grid's artifacts draw (common.smk ``artifact_analyses``), once each."""
    return tuple(dict.fromkeys(ARTIFACT_ANALYSES[a] for a in grid.artifacts if a in ARTIFACT_ANALYSES))


def run_jobs(grid: Grid, run: RunConfig, kinds: tuple[str, ...] = PLANNED) -> list[tuple[str, str]]:
    """(kind, analysis) of each job the workflow creates for ``run`` of ``grid``: train and eval
    always (rules train, eval, collect; an imported run's train job is no GPU job), lmeval with
    lm-eval tasks, throughput where ``throughput_protocol.measured`` says (a grid that draws fig4a,
    an imported checkpoint), one analysis per analysis of the grid that applies to the run."""
    out: list[tuple[str, str]] = []
    for kind in kinds:
        if kind == "analysis":
            out += [(kind, a) for a in grid_analyses(grid) if applies(a, run)]
        elif kind == "lmeval":
            out += [(kind, "")] if run.eval.lm_eval_tasks else []
        elif kind == "throughput":
            out += [(kind, "")] if throughput_protocol.measured(grid.artifacts, run) else []
        elif kind == "train" and run.model.import_checkpoint:
            continue  # the authors' weights, imported where the workflow runs (mor.jobs import kind): no GPU job
        else:
            out.append((kind, ""))
    return out


# --------------------------------------------------------------------------------------
# cost models (pure)
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Cost:
    flops: float
    tokens: int  # train: trained; eval, analysis: read; lmeval: scored (estimated); throughput: generated
    fits: bool = True  # False: the job cannot run on the preset's GPU (memory)
    note: str = ""


def train_cost(run: RunConfig, straight: bool = False) -> Cost:
    """The train job's FLOPs and tokens: a decay branch (mor.branching) trains only the steps
    after its branch point; ``straight``: what the run would cost trained alone from step 0."""
    t = run.train
    tokens = (t.steps if straight else trained_steps(run)) * t.tokens_per_step
    return Cost(train_flops(run.model, model_shape(run.model), run_vocab(run), t.seq_len, tokens), tokens)


def eval_cost(run: RunConfig) -> Cost:
    fwd = forward_flops_per_token(run.model, model_shape(run.model), run_vocab(run), run.train.seq_len)
    return Cost(fwd * run.eval.nll_tokens, run.eval.nll_tokens)


def lmeval_cost(run: RunConfig) -> Cost:
    """Forward FLOPs over the tokens the run's lm-eval tasks score (module docstring)."""
    cfg, s, vocab, e = run.model, model_shape(run.model), run_vocab(run), run.eval
    shots = e.lm_eval_fewshot or 0  # None: the tasks' own default, 0 for every task of the sizes file
    sizes = lm_eval_sizes()
    flops, tokens, unknown = 0.0, 0.0, []
    for name in e.lm_eval_tasks:
        task = sizes.tasks.get(name)
        if task is None:
            unknown.append(name)
            continue
        limit = e.lm_eval_limit_for(name)
        requests = (min(limit, task.docs) if limit else task.docs) * task.requests / task.docs
        per_request = min(float(run.train.seq_len), (1 + shots) * task.chars / sizes.chars_per_token)
        flops += requests * per_request * forward_flops_per_token(cfg, s, vocab, max(1, round(per_request)))
        tokens += requests * per_request
    note = (f"lm-eval task(s) {unknown} have no size in LM_EVAL_TASKS: not counted (slurm/lm_eval_tasks.yaml)"
            if unknown else "")
    return Cost(flops, round(tokens), note=note)


def analysis_cost(run: RunConfig, analysis: str) -> Cost:
    """depth_cap: the eval's windows at every depth cap (x2 with the causal routing of MoR);
    kv: one forward over eval.batch windows (mor.analysis.job)."""
    cfg, s, vocab, T = run.model, model_shape(run.model), run_vocab(run), run.train.seq_len
    if analysis == "depth_cap":
        tokens = max(1, run.eval.nll_tokens // T) * T  # mor.analysis.depth_cap.validation_windows
        caps = range(1, len(plan_for(cfg, s).recursions) + 1)
        passes = 2 if cfg.variant == "mor" else 1  # routed: val_nll_causal is a second forward
        return Cost(passes * tokens * sum(capped_forward_flops_per_token(cfg, s, vocab, T, d) for d in caps), tokens)
    if analysis == "kv":
        tokens = run.eval.batch * T
        return Cost(tokens * forward_flops_per_token(cfg, s, vocab, T), tokens)
    raise ValueError(f"no cost model for analysis {analysis!r}")


def throughput_cost(run: RunConfig, protocol: dict, gpu_memory_gib: float = 0.0) -> Cost:
    """Decode FLOPs of the engine protocol on one run (mor.engine.job.throughput_job): warmup
    and the request set, at the fixed batch and at the relative maximum batch."""
    p, cfg, s, vocab = protocol, run.model, model_shape(run.model), run_vocab(run)
    elem = DTYPE_BYTES[p["dtype"]]
    memory = (gpu_memory_gib if p["memory_gib"] == "device" else float(p["memory_gib"])) * GiB
    max_len = throughput_protocol.sequence_len(p)  # the engine's: one prompt + gen_max - 1 fed tokens
    fits, note, batch = True, "", p["base_batch"]
    if not memory:
        note = "GPU memory unknown (no site): the maximum batch taken as base_batch"
    else:
        van = throughput_protocol.baseline(cfg)
        if max_batch(cfg, s, vocab, max_len, memory, elem) < 1 or max_batch(van, model_shape(van), vocab, max_len,
                                                                             memory, elem) < 1:
            fits, note = False, f"no sequence of {max_len} tokens fits {memory / GiB:.3g} GiB beside the weights"
        else:
            batch = max(1, int(relative_max_batch_exact(cfg, van, s, vocab, max_len, memory, p["base_batch"], elem)))
    timed = p["requests"] * p["gen_mean"]  # per setting: lengths ~ N(gen_mean, gen_std), clipped symmetrically
    warm = (p["fixed_batch"] + batch) * p["warmup_tokens"]
    flops = (2 * timed * decode_flops_per_token(cfg, s, vocab, p["gen_mean"] / 2)
             + warm * decode_flops_per_token(cfg, s, vocab, p["warmup_tokens"] / 2))
    return Cost(flops, 2 * timed + warm, fits, note)


def job_cost(run: RunConfig, kind: str, analysis: str = "", protocol: dict | None = None,
             gpu_memory_gib: float = 0.0) -> Cost:
    if kind == "train":
        return train_cost(run)
    if kind == "eval":
        return eval_cost(run)
    if kind == "lmeval":
        return lmeval_cost(run)
    if kind == "analysis":
        return analysis_cost(run, analysis)
    if kind == "throughput":
        if protocol is None:
            raise ValueError("a throughput job's cost needs the protocol of the grid's mode (mor.throughput_protocol.load_protocol)")
        return throughput_cost(run, protocol, gpu_memory_gib)
    raise ValueError(f"no cost model for job kind {kind!r}")


def job_flops(run: RunConfig, kind: str, analysis: str = "", protocol: dict | None = None) -> float:
    return job_cost(run, kind, analysis, protocol).flops


# --------------------------------------------------------------------------------------
# estimates
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class JobEstimate:
    run_id: str
    kind: str  # a planned kind of mor.jobs.KINDS
    scale: str
    nodes: int
    gpus: int  # whole job
    world_size: int
    time_min: int
    flops: float
    hours: float  # estimated wall-clock hours
    segments: int  # Slurm jobs (1 + requeues after time-outs)
    tokens: int = 0  # see Cost.tokens (train: derived from train.budget_flops where set)
    budget: float = 0.0  # train.budget_flops (0 = tokens set by hand)
    paper_scale: str = ""
    variant: str = ""
    micro_batch: int = 0  # train on a GPU preset: sequences per forward pass (0 = not modelled)
    memory_gib: float = 0.0  # the memory model's peak per GPU at that micro-batch
    fits: bool = True  # False: even micro-batch 1 exceeds the GPU's usable memory (throughput: no KV room)
    analysis: str = ""  # analysis jobs: which one
    note: str = ""  # what the estimate could not count, or why it does not fit
    missing_preset: str = ""  # the preset key the kind lacks at this scale ('' = found)
    max_segments: int = 0  # 1 + the preset's max_timeouts: submitit gives up after that many time-outs (0 = none)
    # train: the run's own tokens (a branch's include the stable run's share it starts from), the
    # hours it would take trained alone from step 0 (= hours unless it is a decay branch), and
    # the stable run it branches from ('' = none); mor.branching
    model_tokens: int = 0
    straight_hours: float = 0.0
    branch_of: str = ""

    @property
    def gpu_hours(self) -> float:
        return self.hours * self.gpus

    @property
    def device_hours(self) -> float:
        """Hours times the job's devices: its GPUs, or its processes on a CPU preset (one CPU
        task each): the CPU-hours ``mor status`` and the price check count."""
        return self.hours * (self.gpus or self.world_size)

    @property
    def gpu_hours_requested(self) -> float:
        return self.segments * self.time_min / 60 * self.gpus

    @property
    def label(self) -> str:
        return f"{self.kind}/{self.analysis}" if self.analysis else self.kind

    @property
    def over_limit(self) -> bool:
        """A scoring job longer than its time limit (requeued, it starts again and never ends), or a
        train job that needs more segments than its requeues allow."""
        if self.kind not in RESUMABLE:
            return self.segments > 1
        return bool(self.max_segments) and self.segments > self.max_segments

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
    return mb, est.total / GiB, est.total <= usable_bytes(preset.gpu_memory_gib * GiB)


# The time limit a GPU job asks Slurm for (``time_limit_min``): its estimated hours times the
# margin of its kind, rounded up to a quarter hour, at least TIME_FLOOR_MIN, at most the preset's
# time_min (the site's ceiling; a train job longer than that runs as segments of it). Train
# resumes after a time-out, so its margin only covers a throughput below the assumed one (1.5x:
# tflops_per_gpu is an assumption until benchmarks/device_check.py measures it); a scoring job
# starts again from scratch after one, hence 2x; every job also starts (imports, weights, data),
# hence the floor. A CPU preset (the test cluster, the local scales) keeps its own time_min.
TIME_MARGIN = MappingProxyType({"train": 1.5, "eval": 2.0, "lmeval": 2.0, "analysis": 2.0, "throughput": 2.0})
TIME_FLOOR_MIN = 30


def time_limit_min(kind: str, hours: float, preset: Preset) -> int:
    """The job's Slurm time limit in minutes (see TIME_MARGIN)."""
    if not preset.gpus_per_node:
        return preset.time_min
    wanted = math.ceil(hours * 60 * TIME_MARGIN.get(kind, 2.0) / 15) * 15
    floor = max(TIME_FLOOR_MIN, math.ceil(preset.signal_delay_s / 60) + 1)
    return min(preset.time_min, max(floor, wanted))


def timed_preset(run: RunConfig, kind: str, preset: Preset, analysis: str = "", mode: str = "cluster") -> Preset:
    """``preset`` with the job's own time limit (``time_limit_min`` of its estimate): what the
    launcher submits and the workflow's ``runtime`` resource declares, as the plan prints."""
    import dataclasses

    protocol = throughput_protocol.load_protocol(mode) if kind == "throughput" else None
    return dataclasses.replace(preset, time_min=estimate(run, kind, preset, analysis, protocol).time_min)


def estimate(run: RunConfig, kind: str, preset: Preset, analysis: str = "", protocol: dict | None = None) -> JobEstimate:
    cost = job_cost(run, kind, analysis, protocol, preset.gpu_memory_gib)
    devices = preset.gpus or preset.world_size  # GPUs, or CPU tasks on a CPU preset
    hours = (preset.start_s + cost.flops / (preset.tflops_per_gpu * 1e12 * devices)) / 3600
    limit = time_limit_min(kind, hours, preset)
    segments = max(1, math.ceil(hours * 60 / limit))
    if kind not in RESUMABLE:  # it starts again after each time-out, until submitit gives up
        segments = min(segments, 1 + preset.max_timeouts)
    micro, mem, fits = memory_fit(run, preset) if kind == "train" else (0, 0.0, cost.fits)
    straight, model_tokens = hours, 0
    if kind == "train":
        full = train_cost(run, straight=True)
        straight = (preset.start_s + full.flops / (preset.tflops_per_gpu * 1e12 * devices)) / 3600
        model_tokens = full.tokens
    return JobEstimate(run.run_id, kind, run.model.scale, preset.nodes, preset.gpus, preset.world_size,
                       limit, cost.flops, hours, segments, tokens=cost.tokens,
                       budget=run.train.budget_flops, paper_scale=run.paper_scale or run.model.scale,
                       variant=run.model.variant, micro_batch=micro, memory_gib=mem, fits=fits, analysis=analysis,
                       note=cost.note, max_segments=1 + preset.max_timeouts, model_tokens=model_tokens,
                       straight_hours=straight, branch_of=run.train.branch_run)


def _unpresetted(run: RunConfig, kind: str, key: str, analysis: str, protocol: dict | None) -> JobEstimate:
    """A job whose kind has no preset entry at the run's scale: its FLOPs, no resources, no hours."""
    cost = job_cost(run, kind, analysis, protocol)
    return JobEstimate(run.run_id, kind, run.model.scale, 0, 0, 0, 0, cost.flops, 0.0, 0, tokens=cost.tokens,
                       budget=run.train.budget_flops, paper_scale=run.paper_scale or run.model.scale,
                       variant=run.model.variant, analysis=analysis, note=cost.note, missing_preset=key)


def plan_grid(grid: Grid, presets: Presets, tags: list[str] | None = None,
              kinds: tuple[str, ...] = PLANNED) -> list[JobEstimate]:
    """One estimate per job the workflow would submit for this grid (``run_jobs``), with the
    resources of the kind's preset entry (``mor.jobs.KINDS``). A kind without an entry at a
    scale the file has is planned without resources (``missing_preset``); a scale the file
    lacks altogether is an error, as before."""
    measured = any(throughput_protocol.measured(grid.artifacts, r.config) for r in grid.select(tags))
    protocol = throughput_protocol.load_protocol(grid.mode) if "throughput" in kinds and measured else None
    out = []
    for r in grid.select(tags):
        run = r.config
        for kind, analysis in run_jobs(grid, run, kinds):
            key = KINDS[kind].preset
            try:
                preset = presets.get(run.model.scale, key)
            except PresetError:
                if not any(scale == run.model.scale for scale, _ in presets.entries):
                    raise
                out.append(_unpresetted(run, kind, f"scales.{run.model.scale}.{key}", analysis, protocol))
                continue
            out.append(estimate(run, kind, preset, analysis, protocol))
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


def block_costs(grid: Grid, jobs: list[JobEstimate]) -> dict[tuple[str, str], tuple[float, int]]:
    """(grid, block) -> (estimated GPU-h of one run of it, every job kind summed; runs per seed)."""
    block = {r.run_id: r.block for r in grid.runs}
    seed0 = {r.run_id for r in grid.runs if r.config.train.seed == min(x.config.train.seed for x in grid.runs)}
    hours: dict[str, float] = {}
    runs: dict[str, set[str]] = {}
    for j in jobs:
        b = block[j.run_id]
        hours[b] = hours.get(b, 0.0) + j.gpu_hours
        runs.setdefault(b, set()).add(j.run_id)
    return {(grid.name, b): (hours[b] / len(runs[b]), len({r for r in runs[b] if r in seed0})) for b in hours}
