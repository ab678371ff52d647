"""Routers that decide, per token, how many recursions it receives.

Expert-choice (this file's ``ExpertChoiceRouter``): at recursion r a router scores the
tokens still active and keeps the top-k of each sequence (hierarchical filtering: a token
dropped at r never comes back). Output weight g = alpha * f(w^T h / temperature).
Top-k over a sequence looks at future tokens, so it is only used in training and
teacher-forced scoring; decoding uses the causal decision ``sigmoid(logit) > 0.5`` that the
auxiliary BCE loss trains (or an auxiliary router trained to predict selection).
"""

from __future__ import annotations

import torch
from torch import nn

from mor.config import RouterConfig


def router_head(hidden: int, arch: str, out: int = 1) -> nn.Module:
    """linear | 2-layer MLP with GELU | Wide-MLP (hidden layer 4x wider), App. G.1."""
    if arch == "linear":
        return nn.Linear(hidden, out, bias=False)
    width = hidden if arch == "mlp" else 4 * hidden
    return nn.Sequential(nn.Linear(hidden, width, bias=False), nn.GELU(), nn.Linear(width, out, bias=False))


def apply_router_func(logits: torch.Tensor, func: str, alpha: float) -> torch.Tensor:
    if func == "sigmoid":
        return alpha * torch.sigmoid(logits)
    if func == "tanh":
        return alpha * torch.tanh(logits)
    if func == "softmax":
        return alpha * torch.softmax(logits, dim=-1)
    return alpha * logits  # 'none'


class ExpertChoiceRouter(nn.Module):
    """One scalar score per token for one recursion step."""

    def __init__(self, hidden: int, cfg: RouterConfig):
        super().__init__()
        self.cfg = cfg
        self.head = router_head(hidden, cfg.arch)
        # aux_router: a separate head trained (on detached states) to predict selection,
        # used only for the causal decision at inference.
        self.aux_head = router_head(hidden, cfg.arch) if cfg.aux == "aux_router" else None

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """h: (B, T, C) -> (B, T) pre-activation router logits."""
        return self.head(h).squeeze(-1) / self.cfg.temperature

    def weights(self, logits: torch.Tensor) -> torch.Tensor:
        return apply_router_func(logits, self.cfg.func, self.cfg.alpha)

    def causal_logits(self, h: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """Logits whose sign is the inference-time (causal) keep/drop decision."""
        if self.aux_head is None:
            return logits
        return self.aux_head(h.detach()).squeeze(-1)


def select_topk(logits: torch.Tensor, active: torch.Tensor, k: int) -> torch.Tensor:
    """Indices (B, k), ascending, of the k highest-scoring active tokens of each sequence.

    Ascending order keeps the gathered subsequence causal for attention.
    """
    masked = logits.detach().masked_fill(~active, float("-inf"))  # (B, T)
    idx = masked.topk(k, dim=1).indices  # (B, k)
    return idx.sort(dim=1).values


def gather_tokens(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """x: (B, T, ...) and idx: (B, k) -> (B, k, ...)."""
    shape = idx.shape + x.shape[2:]
    return x.gather(1, idx.view(*idx.shape, *([1] * (x.dim() - 2))).expand(shape))


def scatter_tokens(x: torch.Tensor, idx: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """Out-of-place x[b, idx[b, j]] = values[b, j]; x (B, T, C), values (B, k, C)."""
    return x.scatter(1, idx.unsqueeze(-1).expand_as(values), values)

