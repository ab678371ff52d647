"""The ``throughput`` job: App. E's decoding-throughput protocol on one trained run.

    python -m mor.launch throughput --grid ... --run-id ... --run-dir runs/<id> --out runs/<id>/throughput.json

Protocol (``workflows/config/throughput.yaml``, one section per mode): ``requests`` prompts from the
validation split, each a single token (App. E starts "without any input prefix"; one token
is the least a greedy decoder needs), generation lengths ~ Normal(gen_mean, gen_std)
clipped to 1..gen_max, ``warmup_tokens`` decoding iterations of a full batch before timing,
then the same request set at two batch sizes:

    fixed  ``fixed_batch`` (32) rows per pass (mor.engine: continuous depth-wise batching
           with twice as many live sequences, so passes fill from any recursion depth)
    max    rows per pass = the relative maximum batch: base_batch x max_batch(model) / max_batch(vanilla)
           (mor.flops.max_batch: parameters + capacity-sized KV cache in ``memory_gib``, or
           the GPU's memory when it is 'device'); vanilla = a Vanilla model of the run's
           effective depth (for MoR-4 Middle-Cycle at 360M the 34-layer one, App. E)

It writes tokens/s over the forward passes (App. E's timing) and over the wall time,
rows per shared-block pass / batch, shared-block passes per token (the first three over one
window, the passes run while requests wait, and over the whole run beside them), the mean occupancy of
the live-sequence limit, the batch sizes, and the FLOPs-predicted speedup over that
vanilla (mor.flops.decode_flops_per_token at the mean context gen_mean / 2; the JSON also
holds it at the recursion shares the routers kept, either router type, ``flops_speedup_realised``). The eval job
copies them into the run's result row (``throughput_columns``).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Callable

# the protocol's definition lives without torch, for the planner and the Snakefile
from mor.throughput_protocol import PROTOCOL_FILE, VERSION, baseline, load_protocol, sequence_len


def requests_from(val_tokens, p: dict):
    """The protocol's request set: one validation token per prompt, normal generation lengths."""
    import numpy as np

    from mor.engine import Request

    rng = np.random.default_rng(p["seed"])
    starts = rng.integers(0, len(val_tokens), size=p["requests"])
    lengths = np.clip(np.rint(rng.normal(p["gen_mean"], p["gen_std"], size=p["requests"])), 1, p["gen_max"])
    return [Request(i, [int(val_tokens[s])], int(n)) for i, (s, n) in enumerate(zip(starts, lengths))]


def measure(model, reqs, batch: int, max_len: int, warmup_tokens: int, device, dtype,
            memory_bytes: float | None = None, graphs: bool | None = None,
            run_engine: Callable | None = None) -> dict:
    """Warm up, then run ``reqs`` through the engine with ``batch`` rows per pass (continuous
    depth-wise batching); the timings and batching of the timed run. Live sequences are
    admitted while their KV fits ``memory_bytes`` (the engine's limit is ``flops.max_batch``
    in that memory), or 2 x batch without a budget.

    One window for every figure (EngineResult.window): the passes run while requests wait
    in the queue (the steady state continuous batching is about). In it:

    tokens_per_s      generated tokens / seconds inside the window's passes (App. E's timing)
    row_fill          mean rows per shared-block pass / batch
    passes_per_token  shared-block passes per generated token (Σ c_r / batch when full)

    and the same over the whole run beside them (``*_run``); a run whose queue never waits
    has no window (None: a visible gap). Also: occupancy (mean live sequences / the
    admission limit), recursion_share (tokens that ran each recursion / those that ran the
    first), tokens_per_s_wall (whole run, wall clock).

    ``run_engine`` (engine, requests) -> EngineResult runs a request set: None, ``Engine.run``;
    a dry run (``mor.rehearsal``) passes one that runs the engine's passes once and reports."""
    import torch

    from mor.engine import Engine, Request

    run_requests = run_engine or Engine.run
    engine = Engine(model, batch=batch, max_len=max_len, device=device, dtype=dtype, memory_bytes=memory_bytes,
                    graphs=graphs)  # None: CUDA graphs per row bucket on a GPU, eager on a CPU
    if warmup_tokens:
        run_requests(engine, [Request(-1 - i, reqs[i % len(reqs)].prompt, warmup_tokens) for i in range(batch)])
    res = run_requests(engine, reqs)
    graphs_on = engine.stepper.graphs
    # the KV pool (most of a GPU) goes with the engine (Engine.__del__ releases its stepper):
    # the next setting's engine asks for the same memory
    del engine
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()
    tokens = res.tokens
    ran = res.recursion_tokens()  # tokens that ran each recursion
    win, run = res.window(True), res.window(False)
    has = win["tokens"] > 0
    return {"batch": batch, "graphs": graphs_on, "tokens": tokens, "steps": res.steps, "forward_s": res.forward_s, "wall_s": res.wall_s,
            "tokens_per_s": win["tokens_per_s"] if has else None, "tokens_per_s_run": tokens / res.forward_s,
            "tokens_per_s_wall": tokens / res.wall_s,
            "occupancy": sum(res.occupancy) / len(res.occupancy), "max_live": res.max_live,
            "row_fill": win["row_fill"] if has else None, "row_fill_run": run["row_fill"],
            "passes_per_token": win["passes_per_token"] if has else None, "passes_per_token_run": run["passes_per_token"],
            "window_tokens": win["tokens"], "window_forward_s": win["forward_s"], "preempted": len(res.preempted),
            "block_passes": res.block_passes, "mixed_depth_passes": res.mixed_passes(),
            "recursion_share": [n / ran[0] if ran[0] else 0.0 for n in ran]}


def throughput_job(grid: str, run_id: str, mode: str, run_dir: str, out: str, data_root: str = "data",
                   device: str = "auto", threads: int = 0, protocol_file: str | Path = PROTOCOL_FILE,
                   graphs: bool | None = None, measure: Callable[..., dict] = measure,
                   read_weights: Callable | None = None) -> dict:
    """App. E's protocol on one trained run; writes ``out`` (JSON) and returns it.

    ``measure`` (model, reqs, batch, max_len, warmup_tokens, device, dtype, memory_bytes, graphs)
    -> figures runs one setting (``measure`` above); ``read_weights`` fills the model from the
    run's final weights (None: ``mor.trained.open_run``'s reader). A dry run (``mor.rehearsal``)
    passes its own of both."""
    import torch

    from mor.atomic import write_text_atomic
    from mor.config import model_shape
    from mor.cpu_allocator import tune_cpu_allocator
    from mor.data.paths import data_paths
    from mor.data.sampler import load_tokens
    from mor.flops import decode_flops_per_token, max_batch, relative_max_batch_exact
    from mor.grids import load_grid
    from mor.trained import open_run

    if threads:
        torch.set_num_threads(threads)
    tune_cpu_allocator()
    p = load_protocol(mode, protocol_file)
    run = load_grid(grid, mode).run(run_id).config
    paths = data_paths(run.data, Path(data_root))
    opened = open_run(run_dir, run, device, data_root, read_weights=read_weights)
    model, dev = opened.model, opened.device
    dtype = getattr(torch, p["dtype"])
    elem = torch.tensor([], dtype=dtype).element_size()
    memory = (torch.cuda.get_device_properties(dev).total_memory if p["memory_gib"] == "device"
              else float(p["memory_gib"]) * 2**30)
    cfg, s, vocab = run.model, model_shape(run.model), model.vocab_size
    van = baseline(cfg)
    max_len = sequence_len(p)  # KV entries a sequence holds: one prompt token + gen_max - 1 fed tokens (512: whole 256-blocks)
    own_max = max_batch(cfg, s, vocab, max_len, memory, elem)  # App. E's exact count (the engine admits by blocks)
    van_max = max_batch(van, model_shape(van), vocab, max_len, memory, elem)
    rel = relative_max_batch_exact(cfg, van, s, vocab, max_len, memory, p["base_batch"], elem)
    ctx = p["gen_mean"] / 2
    speedup = decode_flops_per_token(van, model_shape(van), vocab, ctx) / decode_flops_per_token(cfg, s, vocab, ctx)
    reqs = requests_from(load_tokens(paths.val_tokens), p)
    t0 = time.perf_counter()
    # both settings admit sequences by the same memory (the protocol's); they differ in rows per pass
    # the engine really allocates its pool: on a GPU, App. E's 'device' memory model (total
    # memory) sizes the batches, while the engine fills the parameters + most of what is free
    engine_memory = memory
    if p["memory_gib"] == "device":
        from mor.flops import model_bytes

        model.to(device=dev, dtype=dtype)
        engine_memory = min(memory, model_bytes(cfg, s, vocab, elem) + 0.85 * torch.cuda.mem_get_info(dev)[0])
    settings = {"fixed": measure(model, reqs, p["fixed_batch"], max_len, p["warmup_tokens"], dev, dtype,
                                 engine_memory, graphs)}
    settings["max"] = measure(model, reqs, max(1, int(rel)), max_len, p["warmup_tokens"], dev, dtype,
                              engine_memory, graphs)
    share = settings["fixed"]["recursion_share"]
    realised = None  # the prediction at the recursion shares the routers really kept (either router type)
    if cfg.variant == "mor" and share and min(share) > 0:
        realised = (decode_flops_per_token(van, model_shape(van), vocab, ctx)
                    / decode_flops_per_token(cfg, s, vocab, ctx, shares=tuple(share)))
    elif cfg.variant != "mor":
        realised = speedup  # no router: the design is what runs
    result = {"run_id": run_id, "config_hash": run.config_hash, "version": VERSION, "protocol": p,
              "device": str(dev), "memory_bytes": memory, "engine_memory_bytes": engine_memory, "max_len": max_len, "max_batch": own_max,
              "baseline_layers": van.layers or model_shape(van).layers, "baseline_max_batch": van_max, "relative_max_batch": rel,
              "flops_speedup": speedup, "flops_speedup_realised": realised,
              "settings": settings, "seconds": time.perf_counter() - t0}
    write_text_atomic(Path(out), json.dumps(result, indent=2))
    return result


def throughput_columns(path: str | Path | None, run_id: str) -> dict:
    """The result-row columns from a run's throughput.json (all null without one).

    decode_baseline_layers           effective depth of the same-depth Vanilla this run's speed
                                     is normalised to (its row: variant 'vanilla' with these
                                     effective_layers)
    decode_flops_speedup             FLOPs-predicted speed-up over it at the design capacities
    decode_flops_speedup_realised    ... at the recursion shares the routers kept in the run
    decode_tokens_per_s_*            tokens / second inside the passes, while requests wait
    decode_row_fill_*                mean rows per shared-block pass / batch, same window
    decode_passes_per_token_*        shared-block passes per generated token, same window
    decode_*_run_*                   the same three over the whole run"""
    cols = {f"decode_{k}": None for k in ("max_batch", "batch_max", "flops_speedup", "flops_speedup_realised",
                                          "baseline_layers", "tokens_per_s_fixed", "tokens_per_s_wall_fixed",
                                          "occupancy_fixed", "row_fill_fixed", "passes_per_token_fixed",
                                          "tokens_per_s_max", "tokens_per_s_wall_max", "occupancy_max",
                                          "row_fill_max", "passes_per_token_max",
                                          *(f"{k}_run_{n}" for n in ("fixed", "max")
                                            for k in ("tokens_per_s", "row_fill", "passes_per_token")))}
    if path is None or not Path(path).exists():
        return cols
    r = json.loads(Path(path).read_text())
    if r.get("run_id") != run_id:
        raise ValueError(f"{path} belongs to run {r.get('run_id')!r}, not {run_id!r}")
    cols.update(decode_max_batch=r["max_batch"], decode_batch_max=r["settings"]["max"]["batch"],
                decode_flops_speedup=r["flops_speedup"],
                decode_flops_speedup_realised=r.get("flops_speedup_realised"),
                decode_baseline_layers=r.get("baseline_layers"))
    for name in ("fixed", "max"):
        m = r["settings"][name]
        cols[f"decode_tokens_per_s_{name}"] = m["tokens_per_s"]
        cols[f"decode_tokens_per_s_wall_{name}"] = m["tokens_per_s_wall"]
        cols[f"decode_occupancy_{name}"] = m["occupancy"]
        cols[f"decode_row_fill_{name}"] = m.get("row_fill")
        cols[f"decode_passes_per_token_{name}"] = m.get("passes_per_token")
        for k in ("tokens_per_s", "row_fill", "passes_per_token"):
            cols[f"decode_{k}_run_{name}"] = m.get(f"{k}_run")
    return cols


def summary(r: dict) -> str:
    f, m = r["settings"]["fixed"], r["settings"]["max"]
    fill = lambda x: (f", rows/pass {x['row_fill']:.2f} of the batch, {x['passes_per_token']:.4f} block passes/token"  # noqa: E731
                      " while requests wait" if x.get("row_fill") is not None else "")
    num = lambda v: "n/a" if v is None else f"{v:.0f}"  # noqa: E731
    return (f"throughput {r['run_id']}: batch {f['batch']}: {num(f['tokens_per_s'])} tok/s (wall {f['tokens_per_s_wall']:.0f}){fill(f)}; "
            f"batch {m['batch']}: {num(m['tokens_per_s'])} tok/s (wall {m['tokens_per_s_wall']:.0f}){fill(m)}; "
            f"FLOPs-predicted speedup over the same-depth Vanilla {r['flops_speedup']:.2f} at the design capacities, "
            f"{'n/a' if r.get('flops_speedup_realised') is None else format(r['flops_speedup_realised'], '.2f')} at those the routers kept "
            f"(shares {[round(x, 3) for x in f['recursion_share']]})")
