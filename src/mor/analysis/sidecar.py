"""What the analysis job stores and which runs it measures: the sidecar format (pure, no torch).

``results/runs/<run_id>.<analysis>.npz`` holds the arrays of one analysis of one run
and ``meta`` (JSON: run id, config hash, the analysis, its settings and ``VERSION``), checked
by ``read_sidecar``. The workflow (which runs need an analysis, its params), the analysis
job (``mor.analysis.job``, which writes the files) and the reports (which read them) all
read this one module, so the reports never import the job or the trainer behind it.
"""

from __future__ import annotations

import json
from pathlib import Path

from mor.atomic import atomic_path
from mor.layout import sidecar_file

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


def sidecar_path(results_dir: str | Path, run_id: str, analysis: str) -> Path:
    return sidecar_file(results_dir, run_id, analysis)


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


def job_settings(run, mode: str, wildcards: dict) -> dict:
    """The table's settings hook (``mor.jobs``): the settings of the wildcard's analysis."""
    return settings(wildcards["analysis"], run)
