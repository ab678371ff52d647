"""The ``hub`` job: fill the shared Hugging Face cache once, where the hub can be reached.

Why: compute nodes of many clusters have no internet, and a GPU job that downloads (a
tokenizer, an lm-eval task's dataset) either hangs there or fails after its queue wait.
So exactly one job reaches the hub: this one, run by the workflow on the node it runs on
(the login or transfer node, rule ``hub_cache`` in ``workflows/rules/hub.smk``), before any job
that needs the files. It downloads

- every hub tokenizer the grids use (``transformers.AutoTokenizer``, into ``HF_HOME``): the
  lmeval job's adapter encodes with it (train, eval, analysis and throughput jobs take the
  vocabulary size from the prepared corpus's manifest, ``mor.data.tokenizer.vocab_size``), and
- the datasets of every lm-eval task that is not one of our offline copies (``mor_*``),
  through lm-eval's own task loader (into ``HF_DATASETS_CACHE``),

and writes a manifest of what it fetched. Every other job kind runs with
``HF_HUB_OFFLINE=1`` / ``HF_DATASETS_OFFLINE=1`` (``mor.jobs.JobKind.environment``) and reads
that cache only; point ``HF_HOME`` at a file system the compute nodes share.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from mor.atomic import write_text_atomic
from mor.lm_eval import is_local_task


class HubCacheError(RuntimeError):
    """Something the cache must hold could not be fetched; the message names it."""


def _where() -> dict:
    """The cache folders the downloads went to (what the GPU jobs must see too)."""
    home = os.environ.get("HF_HOME", str(Path.home() / ".cache" / "huggingface"))
    return {"HF_HOME": home, "HF_DATASETS_CACHE": os.environ.get("HF_DATASETS_CACHE", str(Path(home) / "datasets"))}


def _advice(what: str) -> str:
    offline = os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False")
    return (f"{what}: run `python -m mor.launch hub ...` (rule hub_cache) on a node that reaches the hub"
            + (" (HF_HUB_OFFLINE is set here)" if offline else "")
            + f", with HF_HOME={_where()['HF_HOME']} on a file system the compute nodes share")


def fetch_tokenizer(name: str) -> int:
    """Download (or find in the cache) hub tokenizer ``name``; returns its vocabulary size, as the
    data job records it in the corpus manifest (the same loader, ``mor.data.tokenizer``)."""
    from mor.data.tokenizer import load_tokenizer

    try:
        return load_tokenizer(name).vocab_size
    except ImportError as e:  # transformers: the cluster extra
        raise HubCacheError(f"tokenizer {name!r}: {e} (pip install '.[cluster]')") from None
    except (OSError, ValueError) as e:
        raise HubCacheError(_advice(f"tokenizer {name!r} could not be loaded ({type(e).__name__}: {e})")) from None


def fetch_tasks(tasks: list[str]) -> dict:
    """Build lm-eval's tasks, which downloads their datasets into the datasets cache; returns
    {task: its dataset path and name}."""
    if not tasks:
        return {}
    from lm_eval.tasks import TaskManager, get_task_dict

    try:
        built = get_task_dict(list(tasks), TaskManager())
    except Exception as e:  # lm-eval raises KeyError / ValueError / datasets' ConnectionError alike
        raise HubCacheError(_advice(f"lm-eval task(s) {tasks} could not be built ({type(e).__name__}: {e})")) from None
    out = {}
    for name, task in built.items():
        cfg = getattr(task, "config", None)
        out[str(name)] = {"dataset_path": getattr(cfg, "dataset_path", None), "dataset_name": getattr(cfg, "dataset_name", None)}
    return out


def fill_hub_cache(out: str, tokenizers: list[str] | tuple[str, ...] = (), tasks: list[str] | tuple[str, ...] = ()) -> dict:
    """Fetch ``tokenizers`` and ``tasks`` into the cache; write the manifest ``out`` (JSON) last,
    so it exists only when everything it lists is in the cache."""
    t0 = time.perf_counter()
    local = [t for t in tasks if is_local_task(t)]
    if local:
        raise HubCacheError(f"tasks {local} are our offline copies (mor.lm_eval.tasks, rule lm_eval_tasks), "
                            "not hub datasets; leave them out of the hub job")
    manifest = {"tokenizers": {name: fetch_tokenizer(name) for name in sorted(set(tokenizers))},
                "tasks": fetch_tasks(sorted(set(tasks))), **_where()}
    manifest["seconds"] = round(time.perf_counter() - t0, 2)
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(Path(out), json.dumps(manifest, indent=2, sort_keys=True))
    return {"out": str(out), **manifest}


def summary(r: dict) -> str:
    """The one line a finished hub job prints."""
    toks = ", ".join(f"{k} (vocab {v})" for k, v in r["tokenizers"].items()) or "no tokenizer"
    return (f"hub cache {r['out']}: {toks}; {len(r['tasks'])} lm-eval task(s); HF_HOME {r['HF_HOME']} "
            f"({r['seconds']:.1f}s)")
