"""Gradients held against finite differences (a reference that shares no code with autograd).

A central difference is only as good as its own error: truncation (of order h² times the third
derivative) and rounding (of order the loss's last digits divided by h, where which BLAS kernel
runs decides those digits). A fixed ``rel=1e-5`` is therefore a statement about the CPU, not
about the gradient. ``directional_check`` instead takes the difference at two steps, h and h/2,
extrapolates them (Richardson: the h² terms cancel), and derives the tolerance from the two
differences' disagreement plus a rounding bound; it also reports how small that tolerance is
against the derivative, so a test can require that the check resolves the error it is meant to
catch (a 1 % wrong gate backward) before it trusts a pass.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F

# Rounding of one float64 loss evaluation, in units of |loss|. Measured: ~1 ulp (issue 54, an
# Intel Xeon with AVX-512: the central difference at h 1e-5 off by 5e-11 on a loss of 4.0,
# i.e. 1e-15 in the loss); 64 leaves a wide margin for other kernels and summation orders.
ROUNDING_ULPS = 64
FLOAT64_EPS = torch.finfo(torch.float64).eps


@dataclass(frozen=True)
class GradientCheck:
    """One directional derivative, by autograd and by extrapolated central differences."""

    autograd: float
    reference: float  # Richardson extrapolation of the central differences at h and h/2
    tolerance: float  # bound on |reference - true derivative| (module docstring)

    @property
    def resolution(self) -> float:
        """The tolerance relative to the derivative: the smallest relative gradient error this
        check can see (a 1 % error needs a resolution well under 0.01)."""
        return self.tolerance / abs(self.reference)

    @property
    def agrees(self) -> bool:
        return abs(self.autograd - self.reference) <= self.tolerance


def directional_check(model: torch.nn.Module, params: list[torch.nn.Parameter], loss_fn, h: float = 1e-3,
                      seed: int = 0) -> GradientCheck:
    """Autograd's derivative of ``loss_fn()`` along one random direction of ``params`` against
    the central differences at steps h and h/2, extrapolated.

    Run the model in float64 so that h = 1e-3 is far above rounding (the loss's rounding,
    ~1e-16 of it, is ~1e-13 of the step) and far below the score gaps at which a top-k /
    argmax routing decision would flip (a flip makes the loss jump: then the two differences
    disagree, the tolerance grows, and ``resolution`` says the check resolves nothing).
    """
    gen = torch.Generator().manual_seed(seed)
    direction = [torch.randn(p.shape, generator=gen, dtype=p.dtype) for p in params]
    model.zero_grad()
    loss = loss_fn()
    loss.backward()
    autograd = sum(float((p.grad * d).sum()) for p, d in zip(params, direction))

    def shifted(t: float) -> float:
        with torch.no_grad():
            for p, d in zip(params, direction):
                p.add_(t * d)
            value = float(loss_fn())
            for p, d in zip(params, direction):
                p.sub_(t * d)
        return value

    def central(step: float) -> float:
        return (shifted(step) - shifted(-step)) / (2 * step)

    coarse, fine = central(h), central(h / 2)
    reference = (4 * fine - coarse) / 3  # the h² truncation terms cancel
    # |coarse - fine| estimates fine's truncation (x3) and carries both differences' rounding;
    # the extrapolation's own error is far below it. The rounding bound covers the case where
    # the two differences agree by chance.
    rounding = ROUNDING_ULPS * FLOAT64_EPS * abs(float(loss.detach())) / (h / 2)
    tolerance = abs(coarse - fine) + rounding
    return GradientCheck(autograd, reference, tolerance)


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


class _ScaleGrad(torch.autograd.Function):
    """Identity forward; backward multiplies the gradient by ``factor`` (a planted error)."""

    @staticmethod
    def forward(ctx, x, factor):
        ctx.factor = factor
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.factor, None


@contextlib.contextmanager
def planted_gate_error(factor: float = 1.01, *, custom_backward: bool = False):
    """The gradient the gate sends to the router weights scaled by ``factor``: the wrong gradient
    a gradient check must catch. ``custom_backward``: in token-choice's hand-written gate
    backward (``routing._WeightedGate``, the weighted gate after the stack); otherwise in the
    router function's backward, which every gate weight passes through. Test-only; restored."""
    from mor.model import router, routing

    original_func = router.apply_router_func
    original_backward = routing._WeightedGate.__dict__["backward"]  # the staticmethod itself

    def func(*args, **kwargs):
        return _ScaleGrad.apply(original_func(*args, **kwargs), factor)

    def backward(ctx, grad):
        grad_x0, grad_gate, grad_x = original_backward.__func__(ctx, grad)
        return grad_x0, None if grad_gate is None else grad_gate * factor, grad_x

    if custom_backward:
        routing._WeightedGate.backward = staticmethod(backward)
    else:
        router.apply_router_func = func
    try:
        yield
    finally:
        router.apply_router_func = original_func
        routing._WeightedGate.backward = original_backward


def lm_loss64(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy of ``model`` on ``x`` in the logits' dtype (the model's own loss
    is float32 by design)."""
    logits = model(x).logits  # (B, T, V)
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))
