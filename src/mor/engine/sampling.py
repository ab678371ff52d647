"""Next-token choice on the device: greedy, or temperature / top-p sampling with a seed.

    sample(logits, temperature, top_p, seed, pos) -> (N,) tokens

Row i is greedy where temperature[i] == 0; otherwise it draws from softmax(logits / T)
restricted to the smallest set of most probable tokens whose mass reaches top_p (nucleus
sampling), by the Gumbel-max trick with noise from a counter-based hash of (seed, position,
token id). The draw of a token thus depends on its request's seed and its position only,
not on the batch it ran in, the scheduling policy or a preemption, and it needs no device
generator state (static shapes, capturable in a CUDA graph, no host sync).
"""

from __future__ import annotations

import torch

_M32 = 0xFFFFFFFF


def _mix(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash (xor-shift-multiply; int64 arithmetic that never overflows)."""
    x = x & _M32
    x = (((x >> 16) ^ x) * 0x45D9F3B) & _M32
    x = (((x >> 16) ^ x) * 0x45D9F3B) & _M32
    return (x >> 16) ^ x


def uniform(seed: torch.Tensor, pos: torch.Tensor, vocab: int) -> torch.Tensor:
    """(N, V) float64 in (0, 1): the noise of rows with (seed, pos), each token id its own."""
    v = torch.arange(vocab, device=seed.device, dtype=torch.long)
    x = _mix(_mix(_mix(seed.unsqueeze(1) & _M32) ^ pos.unsqueeze(1)) ^ v)  # (N, V)
    return (x.to(torch.float64) + 0.5) / 2.0**32


def sample(logits: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor, seed: torch.Tensor,
           pos: torch.Tensor) -> torch.Tensor:
    """logits (N, V); temperature, top_p (N,) float; seed, pos (N,) long -> tokens (N,) long."""
    greedy = logits.argmax(-1)
    t = temperature.to(torch.float32).clamp_min(1e-6).unsqueeze(1)  # (N, 1)
    z = logits.float() / t  # (N, V)
    probs = torch.softmax(z, -1)
    srt, order = probs.sort(-1, descending=True)
    before = srt.cumsum(-1) - srt  # mass of the more probable tokens
    keep = torch.zeros_like(probs, dtype=torch.bool).scatter(1, order, before < top_p.to(torch.float32).unsqueeze(1))
    gumbel = -torch.log(-torch.log(uniform(seed, pos, logits.shape[-1]))).to(torch.float32)
    drawn = torch.where(keep, z + gumbel, torch.full_like(z, float("-inf"))).argmax(-1)
    return torch.where(temperature > 0, drawn, greedy)
