"""Gradients held against finite differences (a reference that shares no code with autograd)."""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F


def directional_check(model: torch.nn.Module, params: list[torch.nn.Parameter], loss_fn, eps: float = 1e-5,
                      seed: int = 0) -> tuple[float, float]:
    """(autograd, central difference) of ``loss_fn()`` along one random direction of ``params``.

    Run the model in float64 so ``eps`` is far above rounding and far below the score gaps at
    which a top-k / argmax routing decision would flip (which would make the loss jump).
    """
    gen = torch.Generator().manual_seed(seed)
    direction = [torch.randn(p.shape, generator=gen, dtype=p.dtype) for p in params]
    model.zero_grad()
    loss_fn().backward()
    autograd = sum(float((p.grad * d).sum()) for p, d in zip(params, direction))
    with torch.no_grad():
        for p, d in zip(params, direction):
            p.add_(eps * d)
        up = float(loss_fn())
        for p, d in zip(params, direction):
            p.sub_(2 * eps * d)
        down = float(loss_fn())
        for p, d in zip(params, direction):
            p.add_(eps * d)
    return autograd, (up - down) / (2 * eps)


@contextlib.contextmanager
def float64_norms():
    """RMSNorm in its input's dtype (it computes in float32 by design, which would bury a central
    difference in rounding); restored on exit."""
    from mor.model.layers import RMSNorm

    original = RMSNorm.forward

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))

    RMSNorm.forward = forward
    try:
        yield
    finally:
        RMSNorm.forward = original


def lm_loss64(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy of ``model`` on ``x`` in the logits' dtype (the model's own loss
    is float32 by design)."""
    logits = model(x).logits  # (B, T, V)
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))
