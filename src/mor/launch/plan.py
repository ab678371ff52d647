"""Dry run for the cluster, as text: every job the workflow submits for a grid, per kind, with
its GPU-hours (estimated and requested), per table, and the run ids, before any sbatch.

    python -m mor.launch plan --grid grids/table10.yaml --mode cluster --presets slurm/presets.yaml

The numbers are the cost model's (``mor.launch.cost``: which jobs, their FLOPs, hours, time
limits, segments and memory, the data job); this module only lays them out: the site priced
(the first line, ``format_site``), the totals per kind,
the isoFLOP budgets, the warnings, one line per job, the data jobs and what the claims'
adaptive design could add.
"""

from __future__ import annotations

from mor.grids import Grid
from mor.jobs import KINDS
from mor.launch.cost import (RESUMABLE, TIME_FLOOR_MIN, TIME_MARGIN, JobEstimate, block_costs, lm_eval_sizes,
                             plan_data)
from mor.launch.presets import Presets


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
        lines.append(f"  lm-eval tokens scored: documents x choices x characters per request / "
                     f"{lm_eval_sizes().chars_per_token:g} characters per token (assumed until measured; task sizes: "
                     "slurm/lm_eval_tasks.yaml)")
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


def campaign_jobs(planned: dict[str, tuple[Grid, list[JobEstimate]]]) -> list[JobEstimate]:
    """The jobs the workflow submits for all these grids together: a run several grids list has
    one home (``mor.layout``), so its own jobs (train, lm-eval, throughput, analyses) are planned
    once, and its eval once per distinct eval settings (``mor.listings.PER_SETTINGS``); a job of
    ``layout.GRID_KINDS`` (the row) would be each grid's, but none is priced."""
    from mor.layout import GRID_KINDS
    from mor.listings import PER_SETTINGS

    seen: dict[tuple, JobEstimate] = {}
    for name, (grid, jobs) in planned.items():
        for j in jobs:
            if j.kind in GRID_KINDS:
                key = (name, j.kind, j.run_id, j.analysis)
            elif j.kind in PER_SETTINGS:
                key = (j.kind, j.run_id, j.analysis, grid.run(j.run_id).config.eval_hash)
            else:
                key = (j.kind, j.run_id, j.analysis)
            seen.setdefault(key, j)
    return list(seen.values())


def format_campaign(planned: dict[str, tuple[Grid, list[JobEstimate]]], presets: Presets) -> str:
    """The campaign of all these grids: each distinct run counted once, with what sharing saves
    against each grid planning its own (the layout before one home per run)."""
    every = [j for _, jobs in planned.values() for j in jobs]
    once = campaign_jobs(planned)
    listed = sum(len({j.run_id for j in jobs}) for _, jobs in planned.values())
    distinct = len({j.run_id for j in once})
    before, after = sum(j.gpu_hours for j in every), sum(j.gpu_hours for j in once)
    req_before, req_after = sum(j.gpu_hours_requested for j in every), sum(j.gpu_hours_requested for j in once)
    site = presets.site.name if presets.site else "no site profile"
    per_kind = {k: (len([j for j in every if j.kind == k]), len(v), sum(j.gpu_hours for j in v))
                for k, v in _kinds(once).items()}
    return "\n".join([
        f"all {len(planned)} grids ({site}): {listed} runs listed, {distinct} distinct (each trained once, in runs/<run_id>/)",
        f"  GPU-hours: {after:.1f} estimated, {req_after:.1f} requested; each grid its own runs: {before:.1f} estimated, "
        f"{req_before:.1f} requested; sharing saves {before - after:.1f} estimated ({req_before - req_after:.1f} requested)",
        "  jobs: " + ", ".join(f"{k} {n} ({n_all} listed) {h:.1f} GPU-h" for k, (n_all, n, h) in per_kind.items()),
    ])


def format_site(presets: Presets) -> str:
    """The plan's first line: which GPUs it prices and where that choice came from."""
    import os

    from mor.launch.presets import SITE_ENV, known_sites

    s = presets.site
    if s is None:
        return (f"pricing: no site profile ({presets.path} sets no `site:`): the entries' own tflops_per_gpu; "
                f"{SITE_ENV}=<name> prices one of {known_sites()}")
    source = f"{SITE_ENV}={os.environ[SITE_ENV]}" if os.environ.get(SITE_ENV) else f"`site:` of {presets.path}"
    others = [k for k in known_sites() if k != s.name]
    return (f"pricing site {s.name}: {s.gpu} ({source}); time limits = estimate x {_margins()}, at least "
            f"{TIME_FLOOR_MIN} min, at most the preset's time_min; {SITE_ENV}=<name> prices another ({', '.join(others)})")


def _margins() -> str:
    return ", ".join(f"{m:g} {k}" for k, m in TIME_MARGIN.items())


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
    (mor.budget, the budget counted in the authors' FLOP convention, mor.flops_authors) and,
    beside them, the training FLOPs those tokens really cost in our full count
    (mor.flops.train_flops: 3 x forward with embeddings and head), so a user sees both what a
    budget buys and what it spends before submitting."""
    trains = [j for j in jobs if j.kind == "train" and j.budget]
    if not trains:
        return []
    out = ["  isoFLOP budgets: tokens per run derived from train.budget_flops in the authors' FLOP convention "
           "(mor.budget, mor.flops_authors); 'FLOPs (ours)': what they cost in our full training count",
           f"    {'budget':>9} {'variant':<10} {'tokens per scale':<56} {'FLOPs (ours) per scale':<56} "
           f"{'GPU-h est':>9} {'GPU-h req':>9}"]
    for b in sorted({j.budget for j in trains}):
        for v in dict.fromkeys(j.variant for j in trains):
            js = [j for j in trains if j.budget == b and j.variant == v]
            if js:
                toks = ", ".join(f"{j.paper_scale} {_tokens(j.model_tokens or j.tokens)}" for j in js)
                spent = ", ".join(f"{j.paper_scale} {j.flops:.3g}" for j in js)
                out.append(f"    {b:>9.3g} {v:<10} {toks:<56} {spent:<56} {sum(j.gpu_hours for j in js):>9.1f} "
                           f"{sum(j.gpu_hours_requested for j in js):>9.1f}")
    return out + format_branches(trains)


def format_branches(trains: list[JobEstimate]) -> list[str]:
    """Decay branches (mor.branching): their GPU-hours against the same runs trained alone."""
    branches = [j for j in trains if j.branch_of]
    if not branches:
        return []
    gpus = lambda j: j.gpus or 0  # noqa: E731
    alone = sum(j.straight_hours * gpus(j) for j in trains)
    now = sum(j.gpu_hours for j in trains)
    return [f"  branched decays: {len(branches)} of {len(trains)} budget runs train only their decay from a "
            f"warmup-stable run's checkpoint; train GPU-h est {now:,.1f} branched against {alone:,.1f} as "
            f"separate runs ({100 * (1 - now / alone) if alone else 0:.0f} % less)"]


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


def format_design(planned: dict[str, tuple[Grid, list[JobEstimate]]]) -> str:
    """What the claims' adaptive design (grids/claims/claims.yaml, mor.claims.seeding) could add
    to these grids on a cluster: each claim's deciding blocks raised from the grids' own seeds
    to the last pre-registered look, priced by this plan, beside the design's GPU-hour budget
    (the design stops adding seeds when the budget is spent)."""
    from mor.claims.registry import load_specs
    from mor.claims.rounds import load_budget

    design, specs = load_specs(mode="cluster")
    budget = load_budget(mode="cluster")
    costs: dict[tuple[str, str], tuple[float, int]] = {}
    seeds: dict[tuple[str, str], int] = {}
    for grid, jobs in planned.values():
        costs.update(block_costs(grid, jobs))
        seeds.update({(grid.name, b): n for b, n in grid.seeds().items()})
    last = design.block_seeds(max(design.looks))
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
