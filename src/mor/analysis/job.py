"""The ``analysis`` job: measurements of one trained run that some figures need, stored
beside the run's parquet row as ``results/runs/<run_id>.<analysis>.npz``.

    python -m mor.launch analysis --analysis depth_cap|kv --grid ... --run-id ... --run-dir runs/<id> --out ...

    depth_cap  (Fig. 5c) arrays max_depth, val_nll, val_nll_causal: the validation NLL with the
               recursion depth capped at 1..Nr, on the eval job's windows (eval.nll_tokens)
    kv         (Figs. 7, 8) key_/value_magnitude (L, T) and key_/value_cosine (L, L) over
               the first eval.batch validation windows

The file format, and which runs an analysis applies to, live in ``mor.analysis.sidecar``.
Only the runs a grid's artifacts need are measured (``ARTIFACT_ANALYSES``, ``applies``); training is never re-run, the job reads the
run's final weights. Editing a run's eval.* settings re-runs its analyses (Snakemake params).
"""

from __future__ import annotations

from pathlib import Path

from mor.analysis.sidecar import ANALYSES, VERSION, applies, settings, write_sidecar


def analysis_job(analysis: str, grid: str, run_id: str, mode: str, run_dir: str, out: str, data_root: str = "data",
                 device: str = "auto", threads: int = 0) -> dict:
    """Measure ``analysis`` on one trained run's final weights; write ``out`` (.npz). Returns meta."""
    import time

    import numpy as np
    import torch

    from mor.cpu_allocator import tune_cpu_allocator
    from mor.data.paths import data_paths
    from mor.data.sampler import load_tokens
    from mor.grids import load_grid
    from mor.trained import open_run

    if analysis not in ANALYSES:
        raise ValueError(f"unknown analysis {analysis!r}; known: {list(ANALYSES)}")
    if threads:
        torch.set_num_threads(threads)
    tune_cpu_allocator()
    run = load_grid(grid, mode).run(run_id).config
    if not applies(analysis, run):
        raise ValueError(f"run {run_id} ({run.model.variant}, kv={run.model.kv}): analysis {analysis!r} does not apply")
    opened = open_run(run_dir, run, device, data_root)  # checked as the eval job checks it
    model, dev, final = opened.model, opened.device, opened.files.weights
    paths = data_paths(run.data, Path(data_root))
    s = settings(analysis, run)
    t0 = time.time()
    from mor.analysis.depth_cap import capped_nll, validation_windows

    tokens = load_tokens(paths.val_tokens)
    if analysis == "depth_cap":
        windows = validation_windows(tokens, s["seq_len"], s["nll_tokens"])
        r = capped_nll(model, windows, s["batch"], dev)
        arrays = {"max_depth": r["max_depth"], "val_nll": r["val_nll"], "val_nll_causal": r["val_nll_causal"]}
        extra = {"tokens": r["tokens"]}
    else:
        from mor.analysis.kv_states import depth_labels, kv_states, kv_statistics

        windows = validation_windows(tokens, s["seq_len"], s["windows"] * s["seq_len"])[: s["windows"]]
        keys, values = kv_states(model, torch.from_numpy(windows[:, :-1]).to(dev))
        arrays = kv_statistics(keys, values)
        extra = {"windows": len(windows), "depth_labels": depth_labels(model.plan),
                 "recursion_layers": [len(model.plan.prefix), len(model.plan.recursions[0]) if model.plan.recursions else 0,
                                      len(model.plan.recursions), len(model.plan.suffix)]}
    for k, v in arrays.items():
        if not np.all(np.isfinite(np.asarray(v, dtype=np.float64))):
            raise FloatingPointError(f"run {run_id}: analysis {analysis}: {k} is not finite (weights {final}); "
                                     "nothing was written")
    meta = {"run_id": run_id, "config_hash": run.config_hash, "analysis": analysis, "settings": s,
            "version": VERSION, "seconds": round(time.time() - t0, 2), **extra}
    write_sidecar(out, meta, arrays)
    return meta


def summary(meta: dict) -> str:
    """The one line a finished analysis job prints."""
    return f"analysis {meta['analysis']} of {meta['run_id']}: {meta['seconds']:.1f}s"
