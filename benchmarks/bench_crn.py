"""Paired-difference spread with and without common random numbers (mor.model.init), on
fresh seeds (100-107: not the seeds the design or its tests used).

Trains Vanilla, Recursive Middle-Cycle and MoR expert-choice (Nr=2) at the `xxs` scale for a
short budget, once with ``model.weight_init: crn`` and once with ``global_rng``, and prints
per init the sd over seeds of NLL(Recursive) - NLL(Vanilla) and NLL(Recursive) - NLL(MoR).

    .venv/bin/python benchmarks/bench_crn.py --out /tmp/crn.json   # 48 runs, ~34 min on a busy 2-core machine
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np
import torch

from mor.config import ModelConfig, RouterConfig, RunConfig, TrainConfig
from mor.eval.nll import evaluate
from mor.train.trainer import Trainer

VOCAB = 4096
VARIANTS = {
    "vanilla": dict(variant="vanilla"),
    "recursive": dict(variant="recursive", tying="middle_cycle", num_recursions=2),
    "mor": dict(variant="mor", tying="middle_cycle", num_recursions=2,
                router=RouterConfig(type="expert_choice", func="sigmoid", alpha=0.1, aux="aux_loss", aux_coeff=0.001)),
}


def nll(seed: int, init: str, variant: str, data: Path, steps: int) -> float:
    run = RunConfig(grid="crn", model=ModelConfig(scale="xxs", weight_init=init, **VARIANTS[variant]),
                    train=TrainConfig(seed=seed, tokens=steps * 8 * 128, seq_len=128, global_batch=8, micro_batch=8,
                                      checkpoint_every=10_000, lr=3e-3))
    with tempfile.TemporaryDirectory() as d:
        tr = Trainer(run, Path(d), data / "tokens" / f"train-bpe-{VOCAB}.npy", VOCAB, progress=False, threads=1)
        tr.fit()
        val = np.load(data / "tokens" / f"val-bpe-{VOCAB}.npy", mmap_mode="r")
        return float(evaluate(tr.model, val, 128, 65536, 8, torch.device("cpu"))["val_nll"])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="data")
    ap.add_argument("--seeds", type=int, nargs="+", default=list(range(100, 108)))
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    out = {}
    for init in ("crn", "global_rng"):
        rows = {s: {v: nll(s, init, v, Path(a.data), a.steps) for v in VARIANTS} for s in a.seeds}
        d_share = [r["recursive"] - r["vanilla"] for r in rows.values()]
        d_mor = [r["recursive"] - r["mor"] for r in rows.values()]
        out[init] = {"nll": rows, "sd(rec - van)": float(np.std(d_share, ddof=1)), "mean(rec - van)": float(np.mean(d_share)),
                     "sd(rec - mor)": float(np.std(d_mor, ddof=1)), "mean(rec - mor)": float(np.mean(d_mor)),
                     "sd(van)": float(np.std([r["vanilla"] for r in rows.values()], ddof=1))}
        print(init, {k: v for k, v in out[init].items() if k != "nll"}, flush=True)
        Path(a.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
