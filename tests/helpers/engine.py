"""The tiny model and the reference decode that the engine tests share
(tests/unit/test_engine.py, tests/unit/test_sampling.py)."""

from __future__ import annotations

import torch

from mor.config import ModelConfig
from mor.engine import Request
from mor.model.decode import generate
from mor.model.transformer import build_model

from helpers.decode import TINY, V  # the decoding tests' tiny scale and vocabulary


def make(cfg: ModelConfig, seed: int = 0):
    """A tiny model in eval mode; MoR routers get std-1 weights (decisive logits)."""
    torch.manual_seed(seed)
    model = build_model(cfg, TINY, V).eval()
    with torch.no_grad():
        for router in model.routers:
            for head in (router.head, getattr(router, "aux_head", None)):
                for p in head.parameters() if head is not None else ():
                    if p.dim() == 2:
                        torch.nn.init.normal_(p, std=1.0)
    return model


def solo(model, req: Request) -> list[int]:
    """One request decoded alone by the reference loop (mor.model.decode.generate)."""
    return generate(model, torch.tensor([req.prompt]), req.max_new_tokens)[0, len(req.prompt):].tolist()
