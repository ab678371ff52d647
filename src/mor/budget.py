"""isoFLOP budgets (§ 5.1): a run's training tokens derived from a FLOPs budget.

A grid sets ``train.budget_flops``; when the grid is expanded, each run's ``train.tokens``
becomes the whole number of optimizer steps the budget buys **in the authors' FLOP convention**
(``mor.flops_authors``, issue 55: forward only, no embeddings or head, d x d attention
projections, causal attention; it reproduces their released step counts):

    steps  = max(1, round(budget / (authors_forward_flops_per_token * tokens_per_step)))
    tokens = steps * tokens_per_step

so the paper's 16.5e18 trains a 360M Vanilla 9,438 steps (19.8B tokens), as the authors did.
What a run really spends (``mor.flops.train_flops``: 3 x forward with embeddings, head and
routers; ``step_flops``) is not the budget; the plan prints it beside the tokens
(docs/isoflop.md). Before issue 55 the budget was spent in that full count (3.5x fewer tokens).
The derived tokens are part of the run's identity (its config hash), like hand-set ones; the
budget is too.

Pure: no torch, no tokenizer (the vocabulary comes from the scale or the local BPE's name).
"""

from __future__ import annotations

import dataclasses

from mor.config import ConfigError, RunConfig, model_shape
from mor.flops import forward_flops_per_token
from mor.flops_authors import authors_forward_flops_per_token


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


def budget_step_flops(run: RunConfig) -> float:
    """FLOPs one optimizer step costs in the authors' convention (what a budget is counted in)."""
    t = run.train
    return authors_forward_flops_per_token(run.model, model_shape(run.model), t.seq_len) * t.tokens_per_step


def resolve_budget(run: RunConfig) -> RunConfig:
    """``run`` with ``train.tokens`` derived from ``train.budget_flops`` (unchanged if unset)."""
    t = run.train
    if not t.budget_flops:
        return run
    per_step = budget_step_flops(run)
    steps = round(t.budget_flops / per_step)
    if steps < 1:
        raise ConfigError(f"train.budget_flops={t.budget_flops:.4g} is less than half of one optimizer step of this "
                          f"run ({per_step:.4g} FLOPs in the authors' convention for {t.tokens_per_step} tokens); "
                          "raise the budget or shrink train.global_batch / train.seq_len")
    return dataclasses.replace(run, train=dataclasses.replace(t, tokens=steps * t.tokens_per_step))
