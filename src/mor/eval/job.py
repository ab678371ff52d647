"""The ``eval`` job: score one trained run on the validation split and write its measurement.

The measurement is a row of ``mor.results``'s schema with what the run's weights and its eval
settings decide: the validation NLL (teacher-forced and with causal routing), the router
statistics, the training summary, and, where the run scores lm-eval tasks, the lmeval job's
accuracies (``runs/<run_id>/lm_eval.json``). It is the run's own (``mor.layout``:
``runs/<run_id>/eval/<eval_hash>.parquet``): grids that list the run with the same eval settings
share it, and each grid's result row is assembled from it (``mor.eval.row``, which also adds the
throughput job's decoding figures where the grid draws them). Its grid and label columns are
those of the listing it was run from; the row replaces them with each grid's own.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Callable

from mor.config import model_shape
from mor.cpu_allocator import tune_cpu_allocator
from mor.data.paths import data_paths
from mor.data.sampler import load_tokens
from mor.flops import train_flops
from mor.grids import load_grid
from mor.eval.nll import evaluate
from mor.lm_eval.job import accuracy_columns, read_result
from mor.provenance import git_commit
from mor.results import write_rows
from mor.trained import open_run


def eval_job(grid: str, run_id: str, mode: str, run_dir: str, out: str, data_root: str = "data",
             device: str = "auto", threads: int = 0, evaluate: Callable[..., dict] = evaluate,
             read_weights: Callable | None = None) -> dict:
    """Score a trained run on the validation split and write its measurement (``out``).

    ``evaluate`` (model, tokens, seq_len, max_tokens, batch, device) -> metrics scores the
    split (``mor.eval.nll.evaluate``); ``read_weights`` fills the model from the run's final
    weights (None: ``mor.trained.open_run``'s reader). A dry run (``mor.rehearsal``) passes its own of both."""
    import torch

    if threads:
        torch.set_num_threads(threads)
    tune_cpu_allocator()

    g = load_grid(grid, mode)
    run = g.run(run_id).config
    opened = open_run(run_dir, run, device, data_root, read_weights=read_weights)
    model, dev, files, summary, final = opened.model, opened.device, opened.files, opened.summary, opened.files.weights
    paths = data_paths(run.data, Path(data_root))
    metrics = evaluate(model, load_tokens(paths.val_tokens), run.train.seq_len, run.eval.nll_tokens, run.eval.batch, dev)
    for key in ("val_nll", "val_nll_causal"):
        if not math.isfinite(metrics[key]):
            raise FloatingPointError(f"run {run_id}: validation NLL ({key}) is {metrics[key]} (weights {final}); "
                                     "no result row was written")
    accuracy = {"accuracy": {}, "avg_accuracy": None, "accuracy_topk": {}, "avg_accuracy_topk": None}
    if run.eval.lm_eval_tasks:  # written by this run's lmeval job (mor.lm_eval.job), a workflow input
        accuracy = accuracy_columns(read_result(files.lm_eval, run.eval, run_id))
    shape = model_shape(run.model)
    plan = model.plan  # the built model's tying plan, not a second one
    m = run.model
    spent = train_flops(m, shape, model.vocab_size, run.train.seq_len, summary["tokens_seen"])
    row = {
        "run_id": run_id, "grid": g.name, "config_hash": run.config_hash, "git_commit": git_commit(),
        "mode": mode, "scale": m.scale, "paper_scale": run.paper_scale, "seed": run.train.seed,
        "label": run.label, "variant": m.variant,
        # vanilla models have no tying, except as the KV-sharing pattern when kv is shared
        "tying": m.tying if m.variant != "vanilla" or m.kv != "recursion_wise" else None,
        "num_recursions": m.num_recursions, "reduced": m.reduced,
        "router_type": m.router.type if m.variant == "mor" else None,
        "kv": m.kv,
        "n_params": model.num_params(), "unique_layers": plan.num_unique, "effective_layers": len(plan.order),
        "train_tokens": summary["tokens_seen"], "train_steps": summary["steps"],
        "budget_flops": run.train.budget_flops or None,
        "train_flops": spent,
        "train_time_s": summary["train_time_s"], "train_tokens_per_s": summary["tokens_per_s"],
        "model_flops_per_s": spent / summary["train_time_s"] if summary["train_time_s"] > 0 else None,
        "mfu": summary.get("mfu"),
        "final_train_loss": summary["final_loss"],
        "val_nll": metrics["val_nll"], "val_nll_causal": metrics["val_nll_causal"], "val_tokens": metrics["val_tokens"],
        **accuracy,  # decode_* columns: each grid's row adds them (mor.eval.row)
        "dead_token_ratio": metrics.get("dead_token_ratio"), "sampling_accuracy": metrics.get("sampling_accuracy"),
        "max_vio": metrics.get("max_vio"), "entropy": metrics.get("entropy"),
        "mean_depth": metrics.get("mean_depth"), "depth_histogram": metrics.get("depth_histogram"),
        "router_output_hist": json.dumps(metrics["router_output_hist"]) if "router_output_hist" in metrics else None,
        "sample_token_ids": metrics.get("sample_token_ids"), "sample_token_depths": metrics.get("sample_token_depths"),
        "config_json": json.dumps(run.to_dict(), sort_keys=True),
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    write_rows(out, [row])
    return row


def summary(r: dict) -> str:
    """The one line a finished eval job prints."""
    return f"eval {r['run_id']}: val NLL {r['val_nll']:.4f} over {r['val_tokens']} tokens"
