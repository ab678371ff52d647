"""The ``analysis`` job: measurements of one trained run that some figures need, stored
beside the run's parquet row as ``results/runs/<grid>/<run_id>.<analysis>.npz``.

    python -m mor.launch analysis --analysis depth_cap|kv --grid ... --run-id ... --run-dir runs/<grid>/<id> --out ...

    depth_cap  (Fig. 5c) arrays max_depth, val_nll, val_nll_causal: the validation NLL with the
               recursion depth capped at 1..Nr, on the eval job's windows (eval.nll_tokens)
    kv         (Figs. 7, 8) key_/value_magnitude (L, T) and key_/value_cosine (L, L) over
               the first eval.batch validation windows

Each file also holds ``meta`` (JSON: run id, config hash, the analysis, its settings and
``VERSION``), checked by ``read_sidecar``. Only the runs a grid's artifacts need are
measured (``ARTIFACT_ANALYSES``, ``applies``); training is never re-run, the job reads the
run's final weights. Editing a run's eval.* settings re-runs its analyses (Snakemake params).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from mor.atomic import atomic_path
from mor.launch.checkpointable import ScoringJob

VERSION = 1  # bump when an analysis computes something else: its files are then remade
ANALYSES = ("depth_cap", "kv")
ARTIFACT_ANALYSES = {"figures/fig5c": "depth_cap", "figures/fig7": "kv", "figures/fig8": "kv"}
TOKENIZER_ARTIFACTS = ("figures/fig1", "tables/table17")  # decode tokens: the runs' tokenizer is an input


def applies(analysis: str, cfg) -> bool:
    """Whether ``analysis`` measures something for run config ``cfg``: depth caps need
    recursions (Recursive or MoR); KV states need every layer's own KV over every token
    (Vanilla or Recursive with recursion-wise caching)."""
    m = cfg.model
    if analysis == "depth_cap":
        return m.variant != "vanilla"
    if analysis == "kv":
        return m.variant != "mor" and m.kv == "recursion_wise"
    raise ValueError(f"unknown analysis {analysis!r}; known: {list(ANALYSES)}")


def settings(analysis: str, cfg) -> dict:
    """What decides the analysis's output besides the weights (its Snakemake params)."""
    if analysis == "depth_cap":
        return {"nll_tokens": cfg.eval.nll_tokens, "batch": cfg.eval.batch, "seq_len": cfg.train.seq_len}
    if analysis == "kv":
        return {"windows": cfg.eval.batch, "seq_len": cfg.train.seq_len}
    raise ValueError(f"unknown analysis {analysis!r}; known: {list(ANALYSES)}")


def sidecar_path(results_dir: str | Path, grid: str, run_id: str, analysis: str) -> Path:
    return Path(results_dir) / "runs" / grid / f"{run_id}.{analysis}.npz"


def write_sidecar(path: str | Path, meta: dict, arrays: dict) -> None:
    import numpy as np

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp, open(tmp, "wb") as f:  # a file object: numpy adds no suffix
        np.savez(f, meta=np.array(json.dumps(meta, sort_keys=True)), **{k: np.asarray(v) for k, v in arrays.items()})


def read_sidecar(path: str | Path, run_id: str | None = None, config_hash: str | None = None) -> tuple[dict, dict]:
    """(meta, arrays) of an analysis file, checked against the run it should belong to."""
    import numpy as np

    path = Path(path)
    redo = f"delete {path} and re-run the workflow (its analysis job writes it again from the run's final weights)"
    try:
        with np.load(path, allow_pickle=False) as z:
            meta = json.loads(str(z["meta"]))
            arrays = {k: z[k] for k in z.files if k != "meta"}
    except FileNotFoundError:
        raise FileNotFoundError(f"{path} missing: the run's analysis job has not run; re-run the workflow") from None
    except (OSError, ValueError, KeyError) as e:
        raise ValueError(f"{path} is unreadable ({e}); {redo}") from None
    for key, want in (("run_id", run_id), ("config_hash", config_hash)):
        if want is not None and meta.get(key) != want:
            raise ValueError(f"{path} was written for {key} {meta.get(key)!r}, not {want!r}; {redo}")
    return meta, arrays


def analysis_job(analysis: str, grid: str, run_id: str, mode: str, run_dir: str, out: str, data_root: str = "data",
                 device: str = "auto", threads: int = 0) -> dict:
    """Measure ``analysis`` on one trained run's final weights; write ``out`` (.npz). Returns meta."""
    import time

    import numpy as np
    import torch

    from mor.cpu_allocator import tune_cpu_allocator
    from mor.data.paths import data_paths
    from mor.data.sampler import load_tokens
    from mor.data.tokenizer import load_tokenizer
    from mor.grids import load_grid
    from mor.train.checkpoint import CheckpointError, load_model_weights
    from mor.train.trainer import make_model, pick_device

    if analysis not in ANALYSES:
        raise ValueError(f"unknown analysis {analysis!r}; known: {list(ANALYSES)}")
    if threads:
        torch.set_num_threads(threads)
    tune_cpu_allocator()
    run = load_grid(grid, mode).run(run_id).config
    if not applies(analysis, run):
        raise ValueError(f"run {run_id} ({run.model.variant}, kv={run.model.kv}): analysis {analysis!r} does not apply")
    final = Path(run_dir) / "final" / "model.safetensors"
    if not (Path(run_dir) / "train_summary.json").exists():
        raise FileNotFoundError(f"{Path(run_dir) / 'train_summary.json'} missing: run {run_id} has not finished training")
    paths = data_paths(run.data, Path(data_root))
    dev = pick_device(device)
    model = make_model(run, load_tokenizer(paths.tokenizer).vocab_size, dev, load_init=False)
    try:
        load_model_weights(final, model)
    except CheckpointError as e:
        raise CheckpointError(f"run {run_id}: {e}; delete {Path(run_dir) / 'train_summary.json'} and re-run the "
                              "workflow: training resumes from its last checkpoint and writes the final weights again") from None
    model.eval()
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


@dataclass(kw_only=True)
class AnalysisJob(ScoringJob):
    """``analysis_job`` as a Slurm job (submitit pickles this; no torch at import). It runs
    with the scale's eval preset."""

    analysis: str

    def __call__(self) -> dict:
        meta = analysis_job(self.analysis, self.grid, self.run_id, self.mode, self.run_dir, self.out, self.data_root,
                            self.device, threads=self.threads)
        return {"rank": 0, "world_size": 1, **meta}


def summary(meta: dict) -> str:
    return f"analysis {meta['analysis']} of {meta['run_id']}: {meta['seconds']:.1f}s"
