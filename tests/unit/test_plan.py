"""The plan's cost models beyond training (mor.launch.plan): the capped forward of the depth_cap
analysis (mor.flops), lm-eval, analysis and throughput jobs, and which runs get them."""

from __future__ import annotations

import io
import math
import re
import json
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from helpers.paths import REPO
from mor.capacity import capacities
from mor.config import ModelConfig, RouterConfig, load_scales, model_shape
from mor.flops import (capped_forward_flops_per_token, decode_flops_per_token, forward_flops_per_token, layer_params,
                       plan_for, recursion_flops_per_token, router_params)
from mor.grids import load_grid
from mor.launch.__main__ import main as launch_main
from mor.launch.cost import lm_eval_sizes, plan_grid
from mor.launch.plan import campaign_jobs, format_plan
from mor.launch.presets import DEFAULT_PRESETS, load_presets

GRIDS = REPO / "grids"
SCALES = load_scales()


# ------------------------------------------------------------------ mor.flops: the depth-capped forward
def _unshared(cfg: ModelConfig, vocab: int, T: int) -> float:
    """The unshared first/last layers and the LM head, counted by hand (PaLM's 2P + 4CT per layer)."""
    s = SCALES[cfg.scale]
    plan = plan_for(cfg, s)
    per_layer = 2 * (layer_params(s) - 2 * s.hidden) + 4 * s.hidden * T
    return (len(plan.prefix) + len(plan.suffix)) * per_layer + 2 * s.hidden * vocab


def test_capped_forward_of_a_recursive_model_counts_the_recursions_it_runs():
    cfg = ModelConfig(scale="135M", variant="recursive", tying="middle_cycle", num_recursions=3)
    s, T, vocab = SCALES["135M"], 2048, 49152
    per_layer = 2 * (layer_params(s) - 2 * s.hidden) + 4 * s.hidden * T
    per_rec = len(plan_for(cfg, s).recursions[0]) * per_layer  # every token runs every recursion
    assert recursion_flops_per_token(cfg, s, T) == pytest.approx([per_rec] * 3)
    for d in (1, 2, 3):
        assert capped_forward_flops_per_token(cfg, s, vocab, T, d) == pytest.approx(_unshared(cfg, vocab, T) + d * per_rec)
    assert capped_forward_flops_per_token(cfg, s, vocab, T, 3) == pytest.approx(forward_flops_per_token(cfg, s, vocab, T))
    with pytest.raises(ValueError, match="max_depth must lie in 1..3"):
        capped_forward_flops_per_token(cfg, s, vocab, T, 4)


def test_capped_forward_of_expert_choice_mor_drops_deeper_recursions_and_their_routers():
    cfg = ModelConfig(scale="360M", variant="mor", tying="middle_cycle", num_recursions=4,
                      router=RouterConfig(type="expert_choice"))
    s, T, vocab = SCALES["360M"], 2048, 49152
    mm, attn = 2 * (layer_params(s) - 2 * s.hidden), 4 * s.hidden * T
    n = len(plan_for(cfg, s).recursions[0])
    router = 2 * router_params(cfg, s) / 4  # one of the Nr router heads per recursion
    want = [n * (c * mm + c * c * attn) + router for c in capacities(4)]  # recursion-wise KV: c^2 attention
    assert recursion_flops_per_token(cfg, s, T) == pytest.approx(want)
    assert _unshared(cfg, vocab, T) + sum(want) == pytest.approx(forward_flops_per_token(cfg, s, vocab, T))
    assert capped_forward_flops_per_token(cfg, s, vocab, T, 2) == pytest.approx(_unshared(cfg, vocab, T) + sum(want[:2]))


def test_token_choice_router_runs_once_before_the_recursions():
    cfg = ModelConfig(scale="135M", variant="mor", tying="middle_cycle", num_recursions=3,
                      router=RouterConfig(type="token_choice"))
    s, T, vocab = SCALES["135M"], 2048, 49152
    rest = forward_flops_per_token(cfg, s, vocab, T) - sum(recursion_flops_per_token(cfg, s, T))
    assert rest == pytest.approx(_unshared(cfg, vocab, T) + 2 * router_params(cfg, s))


# ------------------------------------------------------------------ the plan's jobs beyond train / eval

# lm-eval's six standard tasks (grids/modes/paper-10B.yaml), counted by hand: documents of the
# scored split (LAMBADA-OpenAI test, HellaSwag / PIQA / WinoGrande-xl validation, ARC test) x
# answer choices = loglikelihood requests, and the mean characters of one request (context +
# continuation, OLMES prompts of the offline copies in data/lm_eval/tasks).
STANDARD = {"lambada_openai": (5153 * 1, 321.6), "hellaswag": (10042 * 4, 362.8), "piqa": (1838 * 2, 148.6),
            "winogrande": (1267 * 2, 105.7), "arc_easy": (9501, 155.2), "arc_challenge": (4687, 179.7)}


@pytest.fixture
def presets(monkeypatch):
    monkeypatch.delenv("MOR_SITE", raising=False)  # the file's site: a100-80gb
    return load_presets(DEFAULT_PRESETS)


def _counts(jobs) -> dict[str, int]:
    kinds = [j.kind for j in jobs]
    return {k: kinds.count(k) for k in dict.fromkeys(kinds)}


def test_lmeval_jobs_cost_forward_flops_over_the_tokens_their_tasks_score(presets):
    grid = load_grid(GRIDS / "table10.yaml", "cluster")
    jobs = plan_grid(grid, presets)
    assert _counts(jobs)["lmeval"] == len(grid.runs) == 22
    run = next(r.config for r in grid.runs if r.config.model.scale == "135M")
    assert list(run.eval.lm_eval_tasks) == list(STANDARD) and run.eval.lm_eval_fewshot is None  # 0-shot, all documents
    shape = model_shape(run.model)
    flops = 0.0
    for requests, chars in STANDARD.values():
        per = chars / 4  # tokens per request at 4 characters per token
        flops += requests * per * forward_flops_per_token(run.model, shape, 49152, round(per))
    job = next(j for j in jobs if j.run_id == run.run_id and j.kind == "lmeval")
    assert job.flops == pytest.approx(flops) and 1e15 < flops < 2e15  # ~4.8M tokens x 2N (N ~ 135M) + attention
    hours = flops / 60e12 / 3600  # one GPU at the a100-80gb site's assumed 60 TFLOP/s for lmeval
    assert job.gpu_hours == pytest.approx(hours)
    # its limit: 2 x its estimate (~1 min), at least 30 min (mor.launch.cost.TIME_MARGIN), not the preset's 1 h
    assert job.gpus == 1 and job.segments == 1 and job.time_min == 30 and job.gpu_hours_requested == pytest.approx(0.5)
    assert "characters per token (assumed until measured" in format_plan(grid, jobs, presets)


def test_lmeval_limits_shots_and_unknown_tasks(tmp_path, presets):
    grid = load_grid(_mixed_grid(tmp_path), "cluster")
    run = grid.runs[0].config
    shape = model_shape(run.model)
    flops = 0.0
    for requests, chars in (500 * 4, 362.8), STANDARD["piqa"]:  # hellaswag limited to 500 documents; 2 shots
        per = 3 * chars / 4
        flops += requests * per * forward_flops_per_token(run.model, shape, 49152, round(per))
    jobs = plan_grid(grid, presets)
    job = next(j for j in jobs if j.run_id == run.run_id and j.kind == "lmeval")
    assert job.flops == pytest.approx(flops)
    assert "NOTE: lm-eval task(s) ['my_task'] have no size in LM_EVAL_TASKS: not counted" in format_plan(grid, jobs, presets)


def _requests(doc: dict) -> list[str]:
    """The texts (context + continuation) of one converted document's loglikelihood requests."""
    if "choices" in doc:  # multiple choice: the query with each choice
        return [doc["query"] + c for c in doc["choices"]]
    if "contexts" in doc:  # WinoGrande: each filled-in context with the one continuation
        return [c + doc["continuation"] for c in doc["contexts"]]
    return [doc["context"] + doc["continuation"]]


def test_lm_eval_task_sizes_are_those_of_the_offline_copies():
    """Where the converted tasks exist here (data/lm_eval/tasks), the table's documents, requests
    and characters per request are theirs: how slurm/lm_eval_tasks.yaml was measured."""
    folder = REPO / "data" / "lm_eval" / "tasks"
    if not (folder / "manifest.json").is_file():
        pytest.skip("no converted lm-eval tasks (python -m mor.lm_eval.tasks)")
    tasks = json.loads((folder / "manifest.json").read_text())["tasks"]
    for name, t in tasks.items():
        texts = [r for line in (folder / name / "test.jsonl").read_text().splitlines() for r in _requests(json.loads(line))]
        size = lm_eval_sizes().tasks[name]
        assert (size.docs, size.requests) == (t["test_docs"], len(texts)), name
        assert size.chars == pytest.approx(sum(map(len, texts)) / len(texts), abs=0.05), name
        std = lm_eval_sizes().tasks[t["standard_name"]]  # the full split: + the few-shot pool held out of it, if any
        assert std.docs in (t["test_docs"], t["test_docs"] + 100) and std.chars == size.chars, name
        assert std.requests / std.docs == pytest.approx(size.requests / size.docs, rel=1e-3), name


def test_lm_eval_sizes_file_is_checked_where_it_is_read(tmp_path):
    """slurm/lm_eval_tasks.yaml is data read at the boundary: a bad entry names the file and its line."""
    from mor.config import ConfigError

    good = tmp_path / "sizes.yaml"
    good.write_text("chars_per_token: 4\ntasks:\n  t: {docs: 2, requests: 8, chars: 10}\n")
    sizes = lm_eval_sizes(good)
    assert sizes.chars_per_token == 4.0 and sizes.tasks["t"].requests == 8 and sizes.tasks["t"].chars == 10.0
    bad = tmp_path / "bad.yaml"
    bad.write_text("chars_per_token: 4\ntasks:\n  t: {docs: 2, requests: 8, chars: 10}\n  u:\n    docs: 0.5\n"
                   "    requests: 1\n    chars: 3\n")
    with pytest.raises(ConfigError, match=rf"^{bad}, line 5: tasks.u.docs=0.5 must be a positive integer"):
        lm_eval_sizes(bad)


def _mixed_grid(tmp_path: Path) -> Path:
    """A 360M grid drawing fig5c (depth_cap), fig7 / fig8 (kv) and fig4a's table (throughput)."""
    path = tmp_path / "mixed.yaml"
    path.write_text("""\
name: mixed
artifacts: [figures/fig5c, figures/fig7, figures/fig8, tables/fig4a]
runs:
  - {name: vanilla, set: {model.variant: vanilla}, axes: {model.scale: [360M]}}
  - {name: recursive, set: {model.variant: recursive, model.tying: cycle, model.num_recursions: 3},
     axes: {model.scale: [360M]}}
  - {name: shared, set: {model.variant: recursive, model.tying: cycle, model.num_recursions: 3, model.kv: shared},
     axes: {model.scale: [360M]}}
  - {name: mor, set: {model.variant: mor, model.tying: middle_cycle, model.num_recursions: 3},
     axes: {model.scale: [360M]}}
modes:
  cluster:
    set:
      data: {source: fineweb-edu, tokenizer: HuggingFaceTB/SmolLM-135M}
      train: {tokens: 1.0e9, seq_len: 2048, global_batch: 256, micro_batch: 16}
      eval: {nll_tokens: 1000000, batch: 8, lm_eval_tasks: [hellaswag, piqa, my_task],
             lm_eval_limits: {hellaswag: 500}, lm_eval_fewshot: 2}
""")
    return path


def test_analysis_jobs_only_for_the_runs_an_analysis_applies_to(tmp_path, presets):
    grid = load_grid(_mixed_grid(tmp_path), "cluster")
    jobs = plan_grid(grid, presets)
    block = {r.run_id: r.block for r in grid.runs}
    got = sorted((block[j.run_id], j.analysis) for j in jobs if j.kind == "analysis")
    # depth_cap needs recursions (not Vanilla); kv every layer's own KV (not MoR, not shared KV)
    assert got == [("mor", "depth_cap"), ("recursive", "depth_cap"), ("recursive", "kv"), ("shared", "depth_cap"),
                   ("vanilla", "kv")]
    rec = next(r.config for r in grid.runs if r.block == "recursive")
    s, T = model_shape(rec.model), 2048
    tokens = (1_000_000 // T) * T  # the eval's windows
    want = tokens * sum(capped_forward_flops_per_token(rec.model, s, 49152, T, d) for d in (1, 2, 3))
    job = next(j for j in jobs if j.run_id == rec.run_id and j.analysis == "depth_cap")
    assert job.flops == pytest.approx(want) and job.tokens == tokens and job.label == "analysis/depth_cap"
    mor = next(r.config for r in grid.runs if r.block == "mor")
    job = next(j for j in jobs if j.run_id == mor.run_id and j.analysis == "depth_cap")  # + the causal routing
    assert job.flops == pytest.approx(2 * tokens * sum(capped_forward_flops_per_token(mor.model, s, 49152, T, d)
                                                       for d in (1, 2, 3)))
    kv = next(j for j in jobs if j.run_id == rec.run_id and j.analysis == "kv")
    assert kv.flops == pytest.approx(8 * T * forward_flops_per_token(rec.model, s, 49152, T))  # eval.batch windows
    assert kv.gpus == 1 and kv.time_min == 30  # the eval preset's (mor.jobs.KINDS) 3 h cut to 2 x its minutes, at least 30
    # the shipped grids: fig5c's three MoR runs get depth_cap, fig7's one Recursive run kv, table10 nothing
    assert _counts(plan_grid(load_grid(GRIDS / "fig5c.yaml", "cluster"), presets))["analysis"] == 3
    assert [j.analysis for j in plan_grid(load_grid(GRIDS / "fig7.yaml", "cluster"), presets)
            if j.kind == "analysis"] == ["kv"]


def test_throughput_jobs_only_in_grids_that_draw_fig4a(presets):
    grid = load_grid(GRIDS / "fig4a.yaml", "cluster")
    jobs = plan_grid(grid, presets)
    assert _counts(jobs) == {"train": 5, "eval": 5, "lmeval": 5, "throughput": 5}
    for other in ("table10", "fig5c", "fig7"):
        assert "throughput" not in _counts(plan_grid(load_grid(GRIDS / f"{other}.yaml", "cluster"), presets))
    # the Vanilla: its maximum batch is its own, so the relative maximum batch is base_batch (32)
    van = next(r.config for r in grid.runs if r.block == "vanilla")
    s = model_shape(van.model)
    requests, gen_mean, warmup, fixed = 1000, 256, 100, 32  # workflows/config/throughput.yaml, cluster
    flops = (2 * requests * gen_mean * decode_flops_per_token(van.model, s, 49152, gen_mean / 2)
             + (fixed + 32) * warmup * decode_flops_per_token(van.model, s, 49152, warmup / 2))
    job = next(j for j in jobs if j.run_id == van.run_id and j.kind == "throughput")
    assert job.flops == pytest.approx(flops) and job.tokens == 2 * requests * gen_mean + 64 * warmup
    assert job.gpu_hours == pytest.approx(flops / 60e12 / 3600) and job.gpu_hours_requested == pytest.approx(0.5)
    # MoR-4 admits more sequences into the same memory: a larger maximum batch, more warmup tokens
    mor4 = next(j for j in jobs if j.kind == "throughput" and "nr4" in j.run_id)
    assert mor4.tokens > job.tokens and mor4.fits


def test_throughput_price_counts_the_entries_the_engine_holds():
    """The planner prices a throughput job (App. E's memory model: its batch, whether a
    sequence fits) at the KV entries a request really holds in the engine: measured here on
    a tiny run (a 1-token prompt and n new tokens hold n entries per storing layer, and an
    engine of max_len n - 1 refuses the request), then required of the cluster protocol's
    price at its own gen_max."""
    import torch

    from mor.engine import Engine, Request
    from mor.flops import relative_max_batch_exact
    from mor.launch.cost import throughput_cost
    from mor.throughput_protocol import baseline, load_protocol
    from mor.model.transformer import build_model

    n = 11
    torch.manual_seed(0)
    model = build_model(ModelConfig(scale="tiny", variant="vanilla"), SCALES["tiny"], 50).eval()
    held = {}
    eng = Engine(model, batch=2, max_len=n)
    res = eng.run([Request(0, [3], n)], on_finish=lambda rid, slot: held.update(
        {e: k.shape[0] for e, (k, _) in eng.sequence_kv(slot).items()}))
    assert len(res.outputs[0]) == n and len(set(held.values())) == 1  # every storing layer alike (Vanilla)
    entries = held[0]  # as the last token is generated: every fed token's entry is written
    with pytest.raises(ValueError, match="exceeds the engine's max_len"):
        Engine(model, batch=2, max_len=entries - 1).run([Request(0, [3], n)])
    extra = entries - n  # entries per request beyond its new tokens (0)
    p = load_protocol("cluster")
    run = next(r.config for r in load_grid(GRIDS / "fig4a.yaml", "cluster").runs if "nr4" in r.run_id)
    want = p["gen_max"] + extra
    assert f"no sequence of {want} tokens fits" in throughput_cost(run, p, gpu_memory_gib=0.5).note
    s, van = model_shape(run.model), baseline(run.model)
    batch = int(relative_max_batch_exact(run.model, van, s, 49152, want, 80 * 2**30, p["base_batch"], 2))
    cost = throughput_cost(run, p, gpu_memory_gib=80)
    assert cost.fits and cost.tokens == 2 * p["requests"] * p["gen_mean"] + (p["fixed_batch"] + batch) * p["warmup_tokens"]


def test_plan_warns_where_a_job_does_not_fit_has_no_preset_or_outruns_its_limit(tmp_path, monkeypatch):
    monkeypatch.delenv("MOR_SITE", raising=False)
    tiny = tmp_path / "tiny-gpu.yaml"  # 360M's bf16 weights alone (~0.7 GB) fill it: no KV room
    tiny.write_text("gpu: toy\ngpu_memory_gib: 0.5\ngpus_per_node: 4\npeak_tflops_per_gpu: 10\n"
                    "tflops_per_gpu: {train: 5}\nthroughput_source: assumed until measured\n")
    path = tmp_path / "presets.yaml"
    path.write_text(f"site: {tiny}\nscales:\n  360M:\n    train: {{gpus_per_node: 1, time_min: 60}}\n"
                    "    eval: {gpus_per_node: 1, time_min: 3, signal_delay_s: 60, tflops_per_gpu: 0.001}\n"
                    "    throughput: {gpus_per_node: 1}\n")
    presets = load_presets(path)
    grid = load_grid(GRIDS / "fig4a.yaml", "cluster")
    jobs = plan_grid(grid, presets)
    text = format_plan(grid, jobs, presets)
    assert "WARNING: 5 train job(s) do not fit the GPU's memory even at micro-batch 1" in text
    assert "WARNING: 5 throughput job(s) do not fit the GPU's memory:" in text and text.count("DOES NOT FIT") == 10
    assert "no sequence of 512 tokens fits 0.5 GiB beside the weights" in text  # gen_max (engine: see below)
    assert "WARNING: 5 job(s) have no preset entry (scales.360M.lmeval): on Slurm they fail" in text
    assert all(j.gpu_hours == j.gpu_hours_requested == 0 for j in jobs if j.missing_preset)
    assert "WARNING: 5 scoring job(s) run longer than their time limit" in text
    assert "WARNING: 5 train job(s) need more time-limit segments than 1 + max_timeouts" in text
    assert text.count("OVER LIMIT") == 10
    # an eval job starts again after each time-out: the scheduler books 1 + max_timeouts (20) slots, then it fails
    evals = [j for j in jobs if j.kind == "eval"]
    assert all(j.segments == 21 and j.gpu_hours_requested == pytest.approx(21 * 3 / 60) for j in evals)
    path.write_text("scales:\n  135M:\n    train: {gpus_per_node: 1}\n")  # no 360M at all: an error, as before
    with pytest.raises(Exception, match="scales.360M is missing"):
        plan_grid(grid, load_presets(path))


def test_the_totals_line_sums_every_kind(presets):
    paths = [GRIDS / "fig4a.yaml", GRIDS / "fig5c.yaml", GRIDS / "fig7.yaml"]
    out = io.StringIO()
    with redirect_stdout(out):
        assert launch_main(["plan", *[a for p in paths for a in ("--grid", str(p))], "--mode", "cluster"]) == 0
    jobs = [j for p in paths for j in plan_grid(load_grid(p, "cluster"), presets)]
    assert set(_counts(jobs)) == {"train", "eval", "lmeval", "analysis", "throughput"}
    est, req = sum(j.gpu_hours for j in jobs), sum(j.gpu_hours_requested for j in jobs)
    assert "9 runs listed, 9 distinct" in out.getvalue()  # these three share no run
    assert f"GPU-hours: {est:.1f} estimated, {req:.1f} requested; each grid its own runs: {est:.1f} estimated" in out.getvalue()
    # requested: each job's limit (1.5 x a train job's estimated hours, 2 x a scoring job's, rounded up
    # to 15 min, at least 30 min, at most the preset's 24 h / 3 h / 1 h) x its segments x its GPUs
    ceiling = {"train": 24 * 60, "eval": 180, "analysis": 180, "lmeval": 60, "throughput": 60}

    def limit(j):
        return min(ceiling[j.kind], max(30, math.ceil(j.hours * 60 * (1.5 if j.kind == "train" else 2) / 15) * 15))

    assert [j.time_min for j in jobs] == [limit(j) for j in jobs]
    assert req == pytest.approx(sum(math.ceil(j.hours * 60 / limit(j)) * limit(j) / 60 * j.gpus for j in jobs))
    assert req < 5 * 4 * 24 + 4 * 2 * 24 + 9 * 3 + 4 * 3 + 9 * 1 + 5 * 1  # what the presets' limits alone booked


def test_a_run_two_grids_list_is_planned_once_with_what_that_saves(presets):
    """Issue 58: table10 and table15 share runs (one id, one home): the campaign counts each
    distinct run's own jobs once, its eval once per distinct eval settings, and the saving is
    exactly the GPU-hours of the repeated listings' own jobs."""
    paths = [GRIDS / "table10.yaml", GRIDS / "table15.yaml"]
    grids = [load_grid(p, "cluster") for p in paths]
    planned = {g.name: (g, plan_grid(g, presets)) for g in grids}
    ids = [{r.run_id for r in g.runs} for g in grids]
    shared = ids[0] & ids[1]
    assert shared  # derived from the grids: the test means something only if they share runs
    out = io.StringIO()
    with redirect_stdout(out):
        assert launch_main(["plan", *[a for p in paths for a in ("--grid", str(p))], "--mode", "cluster"]) == 0
    listed, distinct = len(ids[0]) + len(ids[1]), len(ids[0] | ids[1])
    assert f"{listed} runs listed, {distinct} distinct" in out.getvalue()
    second = planned["table15"][1]
    # an eval is shared too where both grids score the run with the same eval settings (its eval hash)
    scored = {(r.run_id, r.config.eval_hash) for r in grids[0].runs}
    same = {r.run_id for r in grids[1].runs if (r.run_id, r.config.eval_hash) in scored}
    saved = sum(j.gpu_hours for j in second if j.run_id in shared and (j.kind != "eval" or j.run_id in same))
    assert saved > 0
    assert f"sharing saves {saved:.1f} estimated" in out.getvalue()
    trains = [j for j in campaign_jobs(planned) if j.kind == "train"]
    assert len(trains) == distinct and len({j.run_id for j in trains}) == distinct
    evals = {(r.run_id, r.config.eval_hash) for g in grids for r in g.runs}
    assert len([j for j in campaign_jobs(planned) if j.kind == "eval"]) == len(evals) < listed  # one per (run, eval settings)


def test_the_designs_cluster_costs_are_the_plans_and_the_plan_prints_them():
    """grids/claims/claims.yaml prices one run of each deciding block in GPU-hours for the
    cluster mode; those prices stay within 15 % of what this plan computes for the shipped
    presets, and the plan prints each claim's cost to its last look beside the budget."""
    from mor.claims import load_specs
    from mor.claims.rounds import load_budget
    from mor.launch.cost import block_costs, plan_grid
    from mor.launch.plan import format_design
    from mor.launch.presets import load_presets

    design, specs = load_specs()
    budget = load_budget(mode="cluster")
    presets = load_presets(REPO / "slurm" / "presets.yaml")
    planned = {}
    for name in sorted({s.decided_by["grid"] for s in specs.values()}):
        grid = load_grid(REPO / "grids" / f"{name}.yaml", "cluster")
        planned[name] = (grid, plan_grid(grid, presets))
    costs = {}
    for grid, jobs in planned.values():
        costs.update(block_costs(grid, jobs))
    for spec in specs.values():
        g = spec.decided_by["grid"]
        for b in spec.decided_by["runs"]:
            assert budget.per_run(g, b) == pytest.approx(costs[(g, b)][0], rel=0.15), (g, b)
    text = format_design(planned)
    assert f"within {budget.total:,.0f} GPU-h" in text
    # sharing-costs: vanilla (1 run a seed) and recursive (2) of deciding, 3 -> 9 seeds
    v, r = costs[("deciding", "vanilla")], costs[("deciding", "recursive")]
    assert (v[1], r[1]) == (1, 2)
    want = 6 * (v[0] * v[1] + r[0] * r[1])
    line = next(ln for ln in text.splitlines() if ln.strip().startswith("sharing-costs"))
    assert line.endswith(f"3 -> {max(design.looks)} seeds: {want:,.0f} GPU-h")


def test_the_plan_names_its_site_first_and_limits_come_from_the_estimate(monkeypatch):
    """The issue's example: at the H100 site a 135M train job of table10 is estimated at ~4.3 h,
    and asked for 24 h; its eval at ~0.01 h, asked for 3 h. Now the first line names the site and
    where it came from, and each job asks for its estimate x its kind's margin: the train job
    1.5 x, the scoring jobs 2 x with a 30 min floor; the launcher submits the same limit."""
    from mor.launch.cost import timed_preset

    monkeypatch.setenv("MOR_SITE", "h100-80gb")
    out = io.StringIO()
    with redirect_stdout(out):
        assert launch_main(["plan", "--grid", str(GRIDS / "table10.yaml"), "--mode", "cluster"]) == 0
    first = out.getvalue().splitlines()[0]
    assert first.startswith("pricing site h100-80gb: H100-80GB (MOR_SITE=h100-80gb)"), first
    assert "1.5 train, 2 eval" in first and "at least 30 min" in first
    presets = load_presets(DEFAULT_PRESETS)
    grid = load_grid(GRIDS / "table10.yaml", "cluster")
    jobs = {(j.run_id, j.kind): j for j in plan_grid(grid, presets)}
    run = next(r.config for r in grid.runs if r.config.model.scale == "135M" and r.config.model.variant != "vanilla")
    train, ev = jobs[(run.run_id, "train")], jobs[(run.run_id, "eval")]
    assert 4.0 < train.hours < 4.6 and train.time_min == math.ceil(train.hours * 90 / 15) * 15 == 390  # 6:30
    assert train.segments == 1 and train.gpu_hours_requested == pytest.approx(6.5 * 2)
    assert ev.hours < 0.05 and ev.time_min == 30
    assert re.search(rf"{run.run_id} +train +135M +1 x 2 +6:30 ", out.getvalue())
    assert re.search(rf"{run.run_id} +eval +135M +1 x 1 +0:30 ", out.getvalue())
    # what the launcher submits: the same preset, with the plan's limit
    for kind, job in (("train", train), ("eval", ev)):
        submitted = timed_preset(run, kind, presets.get("135M", kind))
        assert submitted.time_min == job.time_min and submitted.submitit_parameters("x")["timeout_min"] == job.time_min
    # the shipped presets' site is the one the README's cluster command names
    import yaml

    default = yaml.safe_load(Path(DEFAULT_PRESETS).read_text())["site"]
    line = next(ln for ln in (REPO / "README.md").read_text().splitlines() if "mor.launch plan" in ln)
    assert f"site {default}" in line, line
