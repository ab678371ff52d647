"""Routers that decide, per token, how many recursions it receives.

Expert-choice (this file's ``ExpertChoiceRouter``): at recursion r a router scores the
tokens still active and keeps the top-k of each sequence (hierarchical filtering: a token
dropped at r never comes back). Output weight g = alpha * f(w^T h / temperature).
Top-k over a sequence looks at future tokens, so it is only used in training and
teacher-forced scoring; decoding uses the causal decision ``sigmoid(logit) > 0.5`` that the
auxiliary BCE loss trains (or an auxiliary router trained to predict selection).

Token-choice (``TokenChoiceRouter``): one router scores the Nr depths of every token once,
before the first recursion, and each token takes its top-1 depth; causal by construction.
"""

from __future__ import annotations

import torch
from torch import nn

from mor.config import RouterConfig
from mor.dtensor import gather_full, shard_like
from mor.model.router_losses import bias_step_from_load, expert_load
from mor.model.routers.registry import router_arch


def router_head(hidden: int, arch: str, out: int = 1) -> nn.Module:
    """The head of the registered architecture ``arch`` (mor.model.routers.arch: linear, mlp, wide_mlp)."""
    return router_arch(arch).head(hidden, out)


def apply_router_func(logits: torch.Tensor, func: str, alpha: float) -> torch.Tensor:
    if func == "sigmoid":
        return alpha * torch.sigmoid(logits)
    if func == "tanh":
        return alpha * torch.tanh(logits)
    if func == "softmax":
        return alpha * torch.softmax(logits, dim=-1)
    return alpha * logits  # 'none'


def _tempered(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """logits / temperature; temperature 1.0 (the default) skips the identity division and its backward."""
    return logits if temperature == 1.0 else logits / temperature


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
        return _tempered(self.head(h).squeeze(-1), self.cfg.temperature)

    def weights(self, logits: torch.Tensor) -> torch.Tensor:
        return apply_router_func(logits, self.cfg.func, self.cfg.alpha)

    def causal_logits(self, h: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """Logits whose sign is the inference-time (causal) keep/drop decision."""
        if self.aux_head is None:
            return logits
        return self.aux_head(h.detach()).squeeze(-1)


def select_topk(logits: torch.Tensor, active: torch.Tensor | None, k: int) -> torch.Tensor:
    """Indices (B, k), ascending, of the k highest-scoring active tokens of each sequence.

    Ascending order keeps the gathered subsequence causal for attention. ``active`` None:
    every token is a candidate (no masking).
    """
    masked = logits.detach()  # (B, T)
    if active is not None:
        masked = masked.masked_fill(~active, float("-inf"))
    idx = masked.topk(k, dim=1).indices  # (B, k)
    return idx.sort(dim=1).values


def gather_tokens(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """x: (B, T, ...) and idx: (B, k) -> (B, k, ...)."""
    shape = idx.shape + x.shape[2:]
    return x.gather(1, idx.view(*idx.shape, *([1] * (x.dim() - 2))).expand(shape))


def scatter_tokens(x: torch.Tensor, idx: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """Out-of-place x[b, idx[b, j]] = values[b, j]; x (B, T, C), values (B, k, C)."""
    return x.scatter(1, idx.unsqueeze(-1).expand_as(values), values)


def flat_rows(idx: torch.Tensor, seq_len: int) -> torch.Tensor:
    """idx (B, k) token indices per sequence -> (B*k,) row indices into the (B*T, ...) view.

    Lets ``take_rows`` / ``add_rows`` move whole rows (index_select / index_add over dim 0)
    instead of gather / scatter with an index expanded over every channel.
    """
    offsets = torch.arange(idx.shape[0], device=idx.device).unsqueeze(1) * seq_len  # (B, 1)
    return (idx + offsets).reshape(-1)  # (B*k,)


def take_rows(x: torch.Tensor, flat: torch.Tensor) -> torch.Tensor:
    """x (B, T, ...) and ``flat_rows`` indices (B*k,) -> (B, k, ...); same as gather_tokens.

    Backward is one index_add of rows into zeros (gather's is an elementwise scatter_add).
    """
    B, T = x.shape[:2]
    rows = x.reshape(B * T, *x.shape[2:]).index_select(0, flat)  # (B*k, ...)
    return rows.view(B, flat.numel() // B, *x.shape[2:])


def add_rows(x: torch.Tensor, flat: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
    """Out-of-place x[b, idx[b, j]] += delta[b, j]; x (B, T, ...), delta (B, k, ...).

    Writing back ``new`` as ``x_sel + (new - x_sel)`` this way replaces scatter_tokens: the
    backward passes the gradient of x through unchanged and takes delta's rows by one
    index_select, where scatter's backward copies and zeroes the gradient elementwise. The
    indices of one call are unique, so every row gets at most one add: exact and deterministic.
    """
    B, T = x.shape[:2]
    rows = delta.reshape(flat.numel(), *x.shape[2:])  # (B*k, ...)
    return x.reshape(B * T, *x.shape[2:]).index_add(0, flat, rows).view(x.shape)


class TokenChoiceRouter(nn.Module):
    """Token-choice: one router at the start of the recursion stack picks each token's depth.

    logits (B, T, Nr) = head(h) / temperature; scores = f(logits) (softmax over the Nr
    depths, or elementwise sigmoid / tanh / identity); depth = 1 + argmax(probs + bias)
    (top-1); router weight g = alpha * score of the chosen depth. ``probs`` are the
    selection probabilities the balancing loss and the entropy metric average: the scores
    for softmax / sigmoid, softmax(logits) for tanh / none (whose outputs are not
    probabilities). A token's depth depends only on its own hidden state, so the decision is
    causal: training, scoring and decoding use the same one.

    ``bias`` (loss-free balancing, DeepSeek / Wang et al. 2024) shifts the selection, never
    g. It is a frozen ``nn.Parameter`` (as in the authors' code), not a buffer, because
    checkpoints and the final weights store named parameters: a resumed run and the eval job
    route with the bias the run trained. It changes by ``loss_free_bias_update`` over the
    top-1 loads of all micro-batches of one optimizer step (``after_optimizer_step``), the
    same on every rank (DDP: each holds the whole bias; FSDP2: each its shard).
    """

    def __init__(self, hidden: int, num_recursions: int, cfg: RouterConfig):
        super().__init__()
        self.cfg, self.num_recursions = cfg, num_recursions
        self.head = router_head(hidden, cfg.arch, out=num_recursions)
        if cfg.balancing == "loss_free":
            self.bias = nn.Parameter(torch.zeros(num_recursions), requires_grad=False)
        else:
            self.register_parameter("bias", None)
        self.pending_load: torch.Tensor | None = None  # (Nr,) top-1 counts since the last step

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """h: (B, T, C) -> (B, T, Nr) tempered router logits, one per depth."""
        return _tempered(self.head(h), self.cfg.temperature)

    def scores(self, logits: torch.Tensor) -> torch.Tensor:
        """f(logits) without alpha: (B, T, Nr)."""
        return apply_router_func(logits, self.cfg.func, 1.0)

    def probs(self, logits: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        """(B, T, Nr) non-negative selection probabilities (see the class docstring)."""
        return scores if self.cfg.func in ("softmax", "sigmoid") else torch.softmax(logits, dim=-1)

    def choose(self, probs: torch.Tensor) -> torch.Tensor:
        """(B, T) expert ids 0..Nr-1 (depth - 1): top-1 of probs + bias, no gradient."""
        p = probs.detach().float()  # (B, T, Nr)
        if self.bias is not None:
            p = p + self.bias
        return p.argmax(-1)

    @torch.no_grad()
    def record_load(self, assignment: torch.Tensor) -> None:
        """Accumulate the top-1 loads of a training forward for the next bias update."""
        load = expert_load(assignment.reshape(-1), self.num_recursions, torch.long)  # (Nr,) a fixed shape
        self.pending_load = load if self.pending_load is None else self.pending_load + load

    @torch.no_grad()
    def after_optimizer_step(self) -> None:
        """Loss-free balancing: b <- b + u * sign(mean load - load), then forget the loads."""
        load, self.pending_load = self.pending_load, None
        if self.bias is None or load is None:
            return
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.all_reduce(load)  # every rank applies the same global step
        # the step from the loads themselves: no per-token id list rebuilt from them (a shape that
        # depends on the data, which the rehearsal's fake tensors refuse); an empty batch moves nothing
        full = bias_step_from_load(gather_full(self.bias), load, self.cfg.bias_update_rate)
        self.bias.copy_(shard_like(full, self.bias))  # FSDP2: this rank's shard of the same update
