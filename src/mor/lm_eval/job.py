"""The ``lmeval`` job: one run's few-shot accuracies, through lm-eval and the ``mor`` adapter.

    python -m mor.launch lmeval --grid ... --run-id ... --run-dir runs/<id> --out runs/<id>/lm_eval.json

It reads the run's ``eval.lm_eval_*`` settings from the grid and writes, atomically, one JSON::

    {"settings": {...}, "lm_eval_version": "0.4.13", "seconds": 12.3,
     "tasks": {"mor_piqa": {"acc": 0.55, "acc_stderr": 0.05, "acc_norm": 0.5, "acc_norm_stderr": 0.05,
                            "n": 100, "num_fewshot": 0}, ...},
     "tasks_topk": {...the same keys...}}

``tasks`` is scored under the causal protocol, ``tasks_topk`` under the authors' (top-k over
the whole right-padded request, the router seeing future tokens; mor.lm_eval.adapter). A
model without a router scores the same under both (its forward is causal, the adapter calls
the same code), so for it ``tasks_topk`` is a copy of ``tasks``, not a second harness run.

The eval job copies it into the run's result row (``mor.eval.job.eval_job``). Tasks named
``mor_*`` are the offline copies of ``mor.lm_eval.tasks`` (``--tasks-dir``); the hub and
``datasets`` are then kept offline. Other names are lm-eval's own tasks (cluster mode),
which download their data as lm-eval does. stderr is lm-eval's closed form for a mean,
sqrt(p(1-p)/(n-1)).
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Callable

from mor.atomic import write_json_atomic
from mor.lm_eval import is_local_task, offline_env

from mor.layout import LM_EVAL_FILE  # runs/<run_id>/lm_eval.json: this job's output, read by the eval job
METRICS = ("acc", "acc_stderr", "acc_norm", "acc_norm_stderr")
PROTOCOLS = ("causal", "topk")  # mor.lm_eval.adapter.PROTOCOLS; in the settings, so an older JSON re-runs


def lm_eval_settings(eval_cfg) -> dict:
    """What decides the lmeval job's output: its own settings, nothing of the NLL eval."""
    tasks = list(eval_cfg.lm_eval_tasks)
    return {"tasks": tasks, "limits": {t: eval_cfg.lm_eval_limit_for(t) for t in tasks},
            "num_fewshot": eval_cfg.lm_eval_fewshot, "batch": eval_cfg.batch, "protocols": list(PROTOCOLS)}


def _finite(v):
    return float(v) if isinstance(v, (int, float)) and math.isfinite(float(v)) else None


def evaluate_tasks(lm, settings: dict, tasks_dir: str | Path | None) -> dict:
    """lm-eval on ``lm`` (an LM object) for the settings' tasks; {task: metrics}."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    tasks = settings["tasks"]
    local = [t for t in tasks if is_local_task(t)]
    if local and tasks_dir is None:
        raise ValueError(f"tasks {local} are offline copies: pass the converted folder (--tasks-dir)")
    tm = TaskManager(include_path=str(tasks_dir) if local else None, include_defaults=len(local) < len(tasks))
    groups: dict[int, list[str]] = {}
    for t in tasks:  # one harness call per distinct limit
        groups.setdefault(settings["limits"][t], []).append(t)
    out = {}
    for limit, names in groups.items():
        res = lm_eval.simple_evaluate(model=lm, tasks=names, limit=limit or None, num_fewshot=settings["num_fewshot"],
                                      task_manager=tm, log_samples=False, bootstrap_iters=1000,
                                      random_seed=0, numpy_random_seed=1234, torch_random_seed=1234,
                                      fewshot_random_seed=1234)
        for t in names:
            r = res["results"][t]
            row = {m: _finite(r.get(f"{m},none")) for m in METRICS}
            row["n"] = int(res.get("n-samples", {}).get(t, {}).get("effective", r.get("sample_len", 0)) or 0)
            row["num_fewshot"] = res.get("n-shot", {}).get(t)
            out[t] = row
    return out


def topk_tasks(lm, settings: dict, tasks_dir, causal: dict, evaluate_tasks: Callable = evaluate_tasks) -> dict:
    """The tasks under the authors' top-k protocol: a second harness run (``evaluate_tasks``) on the
    same model for a routed one; ``causal`` itself for a model without a router (the adapter's
    forward is the same)."""
    if not lm.model.routers:
        return causal
    lm.protocol = "topk"
    try:
        return evaluate_tasks(lm, settings, tasks_dir)
    finally:
        lm.protocol = "causal"


def lmeval_job(grid: str, run_id: str, mode: str, run_dir: str, out: str, data_root: str = "data",
               device: str = "auto", threads: int = 0, tasks_dir: str | None = None,
               evaluate_tasks: Callable[..., dict] = evaluate_tasks, seams=None) -> dict:
    """Score one trained run on its grid's lm-eval tasks; write ``out`` (JSON).

    ``evaluate_tasks`` (lm, settings, tasks_dir) -> {task: metrics} runs the harness; ``seams``
    (``mor.lm_eval.adapter.AdapterSeams``) what the adapter uses to open the run. A dry run
    (``mor.rehearsal``) passes its own of both; a real run leaves them as they are."""
    from mor.grids import load_grid

    run = load_grid(grid, mode).run(run_id).config
    settings = lm_eval_settings(run.eval)
    if tasks_dir is None:
        tasks_dir = str(Path(data_root) / "lm_eval" / "tasks")
    result = {"run_id": run_id, "settings": settings, "tasks": {}}
    t0 = time.time()
    if settings["tasks"]:
        if all(is_local_task(t) for t in settings["tasks"]):
            offline_env(Path(data_root) / "lm_eval" / "hf-datasets")
            from mor.lm_eval.tasks import verify

            verify(tasks_dir)
        import lm_eval

        from mor.cpu_allocator import tune_cpu_allocator
        from mor.lm_eval.adapter import MoRLM

        tune_cpu_allocator()
        lm = MoRLM(run_dir=run_dir, data_root=data_root, device=device, batch_size=max(16, run.eval.batch),
                   threads=threads or None, seams=seams)
        result["tasks"] = evaluate_tasks(lm, settings, tasks_dir)
        result["tasks_topk"] = topk_tasks(lm, settings, tasks_dir, result["tasks"], evaluate_tasks)
        result["lm_eval_version"] = lm_eval.__version__
    result["seconds"] = round(time.time() - t0, 2)
    write_json_atomic(out, result)
    return result


def read_result(path: Path, eval_cfg, run_id: str) -> dict:
    """The lmeval JSON of a run, checked against the run's current lm-eval settings."""
    redo = "re-run the workflow (its lmeval job writes it again)"
    try:
        result = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"run {run_id}: {path} missing: its lmeval job has not run; {redo}") from None
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"run {run_id}: {path} is unreadable ({e}); delete it and {redo}") from None
    want = lm_eval_settings(eval_cfg)
    if result.get("settings") != json.loads(json.dumps(want)):
        raise ValueError(f"run {run_id}: {path} was written for lm-eval settings {result.get('settings')}, "
                         f"not the grid's {want}; delete it and {redo}")
    return result


def _picked(tasks: dict) -> tuple[dict, float | None, float | None]:
    """{metric: {task: value}}, the mean acc over tasks and its stderr."""
    pick = {m: {t: r[m] for t, r in tasks.items() if r.get(m) is not None} for m in METRICS}
    accs = list(pick["acc"].values())
    ses = [pick["acc_stderr"].get(t) for t in pick["acc"]]
    avg = sum(accs) / len(accs) if accs else None
    # independent tasks: the mean's stderr is sqrt(sum se_i^2) / n
    avg_se = math.sqrt(sum(s * s for s in ses)) / len(ses) if accs and all(s is not None for s in ses) else None
    return pick, avg, avg_se


def accuracy_columns(result: dict) -> dict:
    """The result row's accuracy columns from an lmeval JSON (see mor.results): the causal
    protocol's as ``accuracy*`` / ``avg_accuracy*``, the authors' top-k one as ``*_topk``."""
    pick, avg, avg_se = _picked(result.get("tasks", {}))
    top, top_avg, top_se = _picked(result.get("tasks_topk", {}))
    return {"accuracy": pick["acc"], "accuracy_stderr": pick["acc_stderr"], "accuracy_norm": pick["acc_norm"],
            "accuracy_norm_stderr": pick["acc_norm_stderr"], "avg_accuracy": avg, "avg_accuracy_stderr": avg_se,
            "accuracy_topk": top["acc"], "accuracy_topk_stderr": top["acc_stderr"],
            "avg_accuracy_topk": top_avg, "avg_accuracy_topk_stderr": top_se}


def summary(r: dict) -> str:
    """The one line a finished lmeval job prints."""
    accs = ", ".join(f"{t} {m['acc']:.3f}±{m['acc_stderr'] or 0:.3f}" for t, m in r["tasks"].items() if m["acc"] is not None)
    topk = ", ".join(f"{t} {m['acc']:.3f}" for t, m in r.get("tasks_topk", {}).items() if m["acc"] is not None)
    return f"lmeval {r['run_id']}: causal {accs or 'no tasks'}; top-k (sees future) {topk or '-'} ({r['seconds']:.1f}s)"


def job_settings(run, mode: str, wildcards: dict) -> dict:
    """The table's settings hook (``mor.jobs``): the run's lm-eval settings."""
    return lm_eval_settings(run.eval)
