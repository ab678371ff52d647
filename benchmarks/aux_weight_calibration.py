"""How the expert-choice BCE weight calibrates the causal router (issue 56, docs/authors.md).

    PYTHONPATH=src .venv/bin/python benchmarks/aux_weight_calibration.py \
        --tokens data/tokens/train-bpe-4096.npy --seeds 0 1 2 --steps 300

Trains MoR expert-choice, Middle-Cycle Nr 3 at the ``medium`` scale (hidden 128, 8 layers) on
CPU, one thread, with the BCE weighted 0.001 x aux_accum_steps for each ``--accum`` (16: the
authors' effective weight, 1: their configured coefficient as written), then measures on
held-out sequences the share of ALL tokens that the causal decision (the one inference uses,
``decode.full_forward_causal``) keeps at each recursion, against the top-k capacity it was
trained to imitate. A short recipe (AdamW 3e-3, warm-up 5 %, linear decay over the last
20 %, batch 16 x 128), not a grid run: it measures the calibration, not a paper number.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch

from mor.capacity import capacities, tokens_kept
from mor.config import ModelConfig, RouterConfig, load_scales
from mor.model import decode
from mor.model.transformer import build_model


def batches(tokens: np.ndarray, seed: int, batch: int, seq: int):
    """Endless (B, T+1) windows of the token stream, drawn by ``seed``."""
    rng = np.random.default_rng(seed)
    while True:
        starts = rng.integers(0, len(tokens) - seq - 1, batch)
        yield torch.from_numpy(np.stack([tokens[s : s + seq + 1] for s in starts]).astype(np.int64))  # (B, T+1)


def train_one(tokens, vocab: int, seed: int, accum: int, steps: int, batch: int, seq: int):
    cfg = ModelConfig(scale="medium", variant="mor", tying="middle_cycle", num_recursions=3,
                      router=RouterConfig(aux_accum_steps=accum))
    torch.manual_seed(seed)
    model = build_model(cfg, load_scales()["medium"], vocab, init_seed=seed).train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.95), weight_decay=0.1)
    warm, decay = max(1, steps // 20), steps // 5

    def lr_at(s: int) -> float:
        if s < warm:
            return (s + 1) / warm
        return min(1.0, (steps - s) / decay) if decay else 1.0

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    data = batches(tokens, seed, batch, seq)
    for _ in range(steps):
        xy = next(data)  # (B, T+1)
        out = model(xy[:, :-1], xy[:, 1:])
        opt.zero_grad(set_to_none=True)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
    return model.eval(), float(out.lm_loss.detach()), float(out.aux_loss.detach())


@torch.no_grad()
def causal_keep(model, val: np.ndarray, seq: int, n: int = 32) -> list[float]:
    """Share of all tokens of ``n`` held-out sequences kept at each recursion (causal)."""
    x = torch.from_numpy(val[: n * seq].astype(np.int64).reshape(n, seq))  # (n, T)
    out = decode.full_forward_causal(model, x)
    return [float(s.float().mean()) for s in out.routing.selected]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", required=True, help="train token .npy (a local corpus split)")
    ap.add_argument("--val", default=None, help="held-out token .npy (default: the train file's other name)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--accum", type=int, nargs="+", default=[16, 1])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=128)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    train = np.load(args.tokens, mmap_mode="r")
    val = np.load(args.val or args.tokens.replace("train-", "val-"), mmap_mode="r")
    vocab = int(max(train.max(), val.max())) + 1
    caps = capacities(3)
    print(json.dumps({"capacity": caps, "topk_share": [tokens_kept(args.seq, c, "floor") / args.seq for c in caps]}))
    for accum in args.accum:
        for seed in args.seeds:
            t0 = time.time()
            model, lm, aux = train_one(train, vocab, seed, accum, args.steps, args.batch, args.seq)
            keep = causal_keep(model, val, args.seq)
            print(json.dumps({"aux_weight": model.cfg.router.aux_weight, "seed": seed, "steps": args.steps,
                              "causal_keep": [round(k, 3) for k in keep], "lm_loss": round(lm, 3),
                              "aux_loss": round(aux, 5), "seconds": round(time.time() - t0, 1)}), flush=True)


if __name__ == "__main__":
    main()
