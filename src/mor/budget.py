"""isoFLOP budgets (§ 5.1): a run's training tokens derived from a FLOPs budget.

A grid sets ``train.budget_flops``; when the grid is expanded, each run's ``train.tokens``
becomes the whole number of optimizer steps whose training FLOPs (``mor.flops.train_flops``:
the variant's own cost per token, with expert-choice capacities, token-choice depths, KV
strategy, unshared layers and router counted) come closest to the budget:

    steps  = max(1, round(budget / (3 * forward_flops_per_token * tokens_per_step)))
    tokens = steps * tokens_per_step

so every variant at one budget spends it to within half an optimizer step's FLOPs, and a
cheaper model (MoR, a smaller scale) trains on more tokens. The derived tokens are part of
the run's identity (its config hash), like hand-set ones; the budget is too.

Pure: no torch, no tokenizer (the vocabulary comes from the scale or the local BPE's name).
"""

from __future__ import annotations

import dataclasses

from mor.config import ConfigError, RunConfig, model_shape
from mor.flops import forward_flops_per_token


def run_vocab(run: RunConfig) -> int:
    """Vocabulary size without loading a tokenizer: the scale's, else the local BPE's."""
    shape = model_shape(run.model)
    vocab = shape.vocab or run.data.bpe_vocab
    if not vocab:
        raise ConfigError(f"run {run.run_id}: scale {shape.name} has vocab 0 and tokenizer {run.data.tokenizer!r} "
                          "is not a local 'bpe-<vocab>'; cannot size the LM head")
    return vocab


def step_flops(run: RunConfig) -> float:
    """Training FLOPs of one optimizer step (forward + backward over its tokens)."""
    t = run.train
    return 3.0 * forward_flops_per_token(run.model, model_shape(run.model), run_vocab(run), t.seq_len) * t.tokens_per_step


def resolve_budget(run: RunConfig) -> RunConfig:
    """``run`` with ``train.tokens`` derived from ``train.budget_flops`` (unchanged if unset)."""
    t = run.train
    if not t.budget_flops:
        return run
    per_step = step_flops(run)
    steps = round(t.budget_flops / per_step)
    if steps < 1:
        raise ConfigError(f"train.budget_flops={t.budget_flops:.4g} is less than half of one optimizer step of this "
                          f"run ({per_step:.4g} FLOPs for {t.tokens_per_step} tokens); raise the budget or shrink "
                          "train.global_batch / train.seq_len")
    return dataclasses.replace(run, train=dataclasses.replace(t, tokens=steps * t.tokens_per_step))
