"""The ``mor`` adapter against lm-eval's own ``hf`` backend, document by document.

Why: the accuracy column of every table goes through ``MoRLM`` (mor.lm_eval.adapter), which
re-implements the harness's scoring (context/continuation split, left truncation, batching).
On a real model (the start point ``smollm2-135m-instruct``) both backends score the same
documents of the same tasks: our Vanilla through ``MoRLM``, transformers' ``LlamaForCausalLM``
(loaded by transformers from the same GGUF) through ``lm_eval.models.huggingface.HFLM``. Both get
the same tokenizer (the start point's, wrapped for transformers), so any difference is scoring.

    python -m mor.lm_eval.parity --limit 25 --out parity.json     (tasks: the paper's six)

``compare`` is pure: per task, the largest |loglikelihood difference| over every scored
continuation, the two accuracies and whether every document got the same prediction.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

from mor.lm_eval import DEFAULT_TASKS_DIR, offline_env

TASKS = ("mor_lambada", "mor_hellaswag", "mor_piqa", "mor_winogrande", "mor_arc_easy", "mor_arc_challenge")
START = "smollm2-135m-instruct"


def per_document(lm, tasks, limit: int, tasks_dir: str | Path, max_length: int) -> dict:
    """{task: {"acc": ..., "docs": {doc_id: {"ll": [per continuation], "acc": 0/1}}}} for one LM."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    tm = TaskManager(include_path=str(tasks_dir), include_defaults=False)
    res = lm_eval.simple_evaluate(model=lm, tasks=list(tasks), limit=limit or None, num_fewshot=0, task_manager=tm,
                                  log_samples=True, bootstrap_iters=0, random_seed=0, numpy_random_seed=1234,
                                  torch_random_seed=1234, fewshot_random_seed=1234)
    out = {}
    for t in tasks:
        docs = {}
        for s in res["samples"][t]:
            ll = [float(r[0][0]) for r in s["resps"]]  # one (loglikelihood, is_greedy) per continuation
            docs[int(s["doc_id"])] = {"ll": ll, "acc": float(s.get("acc", float("nan")))}
        out[t] = {"acc": float(res["results"][t]["acc,none"]), "docs": docs}
    return out


def compare(a: dict, b: dict) -> dict:
    """Per task and overall: max |Δ loglikelihood|, both accuracies, documents scored alike."""
    tasks, worst = {}, 0.0
    for t in a:
        da, db = a[t]["docs"], b[t]["docs"]
        if set(da) != set(db):
            raise ValueError(f"{t}: the backends scored different documents ({len(da)} vs {len(db)})")
        diffs = [abs(x - y) for d in da for x, y in zip(da[d]["ll"], db[d]["ll"], strict=True)]
        same = sum(da[d]["acc"] == db[d]["acc"] for d in da)
        tasks[t] = {"n": len(da), "continuations": len(diffs), "max_abs_ll_diff": max(diffs, default=0.0),
                    "acc_mor": a[t]["acc"], "acc_hf": b[t]["acc"], "same_prediction": same}
        worst = max(worst, tasks[t]["max_abs_ll_diff"])
    return {"max_abs_ll_diff": worst, "identical_accuracies": all(r["acc_mor"] == r["acc_hf"] for r in tasks.values()),
            "tasks": tasks}


def lms(model, hf_model, tokenizer_json: Path, max_length: int, batch: int):
    """(MoRLM over our model, HFLM over a transformers model), both with the one tokenizer."""
    from lm_eval.models.huggingface import HFLM
    from transformers import PreTrainedTokenizerFast

    from mor.data.tokenizer import load_tokenizer
    from mor.lm_eval.adapter import MoRLM

    mor = MoRLM.from_model(model, load_tokenizer(tokenizer_json), max_length=max_length, batch_size=batch)
    hf_tok = PreTrainedTokenizerFast(tokenizer_file=str(tokenizer_json), eos_token="<|endoftext|>",
                                     pad_token="<|endoftext|>")
    return mor, HFLM(pretrained=hf_model, tokenizer=hf_tok, batch_size=batch, max_length=max_length, device="cpu")


def backends(checkpoint_folder: Path, gguf: Path, max_length: int, batch: int):
    """Both LMs for the start point: our Vanilla from the named start point (mor.checkpoints.hf) and
    transformers' LlamaForCausalLM from the same GGUF (transformers' own loader)."""
    import torch
    from transformers import AutoModelForCausalLM

    from mor.config import ModelConfig, load_scales
    from mor.checkpoints.gguf import START_POINTS
    from mor.checkpoints.hf import init_from_checkpoint
    from mor.model.transformer import build_model

    scale = START_POINTS[START].scale
    model = build_model(ModelConfig(scale=scale, tied_init="stepwise", init_checkpoint=START), load_scales()[scale],
                        49152).eval()
    init_from_checkpoint(model, START, "stepwise")
    hf_model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32).eval()
    return lms(model, hf_model, Path(checkpoint_folder) / "tokenizer.json", max_length, batch)


def run(limit: int, tasks=TASKS, tasks_dir: str | Path = DEFAULT_TASKS_DIR, max_length: int = 256,
        batch: int = 16) -> dict:
    from mor.lm_eval.tasks import verify
    from mor.checkpoints.gguf import gguf_path, materialise

    verify(tasks_dir)
    folder = materialise(START)
    mor, hf = backends(folder, gguf_path(START), max_length, batch)
    t0 = time.time()
    a = per_document(mor, tasks, limit, tasks_dir, max_length)
    t1 = time.time()
    b = per_document(hf, tasks, limit, tasks_dir, max_length)
    out = compare(a, b)
    out.update(limit=limit, max_length=max_length, seconds_mor=round(t1 - t0, 1), seconds_hf=round(time.time() - t1, 1))
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="the mor adapter vs lm-eval's hf backend on the real start point")
    ap.add_argument("--limit", type=int, default=25, help="documents per task (0 = all)")
    ap.add_argument("--tasks-dir", default=str(DEFAULT_TASKS_DIR))
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    offline_env(Path(a.tasks_dir).parent / "hf-datasets")
    res = run(a.limit, tasks_dir=a.tasks_dir)
    text = json.dumps(res, indent=2, default=lambda v: None if isinstance(v, float) and math.isnan(v) else v)
    if a.out:
        a.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
