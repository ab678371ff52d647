"""The decoding variants (every tying scheme, KV strategy and router) and a tiny model whose
causal routing really splits tokens, shared by the decoding and export tests."""

import torch

from mor.config import ModelConfig, RouterConfig, load_scales
from mor.model.decode import full_forward_causal
from mor.model.transformer import build_model

TINY = load_scales()["tiny"]
V, B, T, PROMPT = 50, 2, 12, 5
TYINGS = ("cycle", "sequence", "middle_cycle", "middle_sequence")


def cfg_id(c: ModelConfig) -> str:
    parts = [c.variant, c.tying, f"nr{c.num_recursions}", c.kv]
    if c.variant == "mor" and c.router.type == "token_choice":
        parts += ["token_choice", c.router.func, c.router.gating]
    elif c.variant == "mor":
        parts += [c.router.aux, c.router.gating]
    return "-".join(parts)


VARIANTS = [
    ModelConfig(scale="tiny"),
    *[ModelConfig(scale="tiny", tying=t, num_recursions=nr, kv="shared")  # vanilla KV sharing
      for t, nr in (("cycle", 1), ("sequence", 1), ("middle_cycle", 1), ("sequence", 3))],
    *[ModelConfig(scale="tiny", variant="recursive", tying=t, num_recursions=2, kv=kv)
      for t in TYINGS for kv in ("recursion_wise", "shared")],
    ModelConfig(scale="tiny", variant="recursive", tying="middle_cycle", num_recursions=3, kv="shared"),
    *[ModelConfig(scale="tiny", variant="mor", tying=t, num_recursions=3, kv=kv, router=RouterConfig(aux=aux))
      for t in ("cycle", "middle_cycle", "sequence") for kv in ("recursion_wise", "shared", "shared_dagger")
      for aux in ("aux_loss", "aux_router")],
    *[ModelConfig(scale="tiny", variant="mor", tying="middle_sequence", num_recursions=2, kv=kv,
                  router=RouterConfig(gating="additive"))
      for kv in ("recursion_wise", "shared", "shared_dagger")],
    *[ModelConfig(scale="tiny", variant="mor", tying=t, num_recursions=3, kv=kv,
                  router=RouterConfig(type="token_choice", func=func, gating=gating))
      for t in ("cycle", "middle_cycle") for kv in ("recursion_wise", "shared", "shared_dagger")
      for func, gating in (("softmax", "weighted"), ("sigmoid", "additive"))],
]


def make(cfg: ModelConfig, seed: int = 0):
    """A tiny model and a batch (B, T) of token ids. MoR routers get std-1 weights (decisive
    logits), and the first seed from ``seed`` on whose causal routing splits tokens is used."""
    for attempt in range(seed, seed + 20):
        torch.manual_seed(attempt)
        model = build_model(cfg, TINY, V).eval()
        x = torch.randint(0, V, (B, T))
        if not model.routers:
            return model, x
        with torch.no_grad():
            for router in model.routers:
                for head in (router.head, getattr(router, "aux_head", None)):
                    if head is not None:
                        torch.nn.init.normal_(head.weight, std=1.0)
        if routing_splits(full_forward_causal(model, x)):
            return model, x
    raise AssertionError(f"no seed gives non-trivial routing for {cfg_id(cfg)}")


def routing_splits(ref) -> bool:
    """At some recursion beyond the first, a candidate token stopped and another continued."""
    split = [bool((k & c).any() and (~k & c).any()) for k, c in zip(ref.routing.selected, ref.routing.candidates)]
    return any(split[1:])
