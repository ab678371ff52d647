"""Masked attention through FlexAttention, and the one decision of which masked path runs.

Why: KV sharing makes a recursion's routed queries attend over every key recursion 1
computed, causally by position (a staircase mask), and a prefix relaxation prepends P
always-visible key columns. Fused SDPA kernels cannot skip masked blocks, so
``mor.model.layers.masked_attention`` chunks the queries by hand and trims each chunk's keys,
at one host sync per call. FlexAttention (``torch.nn.attention.flex_attention``, torch >= 2.5)
takes the mask as a block mask: whole masked 128 x 128 blocks are skipped in forward and
backward, no chunks, no host sync, and no float copy of the mask (the memory-efficient SDPA
kernel turns a bool mask into a float bias per chunk and keeps it for backward).

Where it runs (``masked_path``, the one decision; ``execution.attention``):

    auto   FlexAttention on CUDA while autograd records (training), else the chunked SDPA path.
           Not on CPU: torch 2.13 has no FlexAttention backward there ("FlexAttention does not
           support backward on CPU"), and its CPU forward is 3-28x slower than the chunked
           SDPA path (benchmarks/bench_flex_attention.py, docs/speed.md). Not at inference:
           the decode cache's masks change shape at every step (a recompile or a new block
           mask per step, for one query row with nothing to skip).
    flex   FlexAttention wherever torch can run it (CUDA; CPU without autograd); a bool mask
           that needs a CPU backward is refused with a message.
    sdpa   the chunked SDPA path everywhere (the behaviour before issue 60; for comparisons).
    flash  flash-attn for the causal square (mor.model.layers); masks as under auto.

Additive (float) masks always take SDPA. ``masked_path_override`` forces one path for the
duration of a block: the rehearsal (mor.rehearsal.fake) measures the chunked SDPA path,
since FlexAttention traces its mask's joint graph through the autograd engine, which a fake
CUDA device cannot run (PyTorch issue #92627).

On CUDA the kernel is ``torch.compile(flex_attention)`` (as torchtitan does): eager
FlexAttention is a reference implementation that materialises every score. On CPU it runs
eagerly (inference only; compiling costs 8-23 s per shape for a kernel that is still slower).
"""

from __future__ import annotations

import contextlib
import functools

import torch

try:  # torch >= 2.5
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
except ImportError:  # older torch: the chunked SDPA path only
    create_block_mask = flex_attention = None

MASKED_PATHS = ("flex", "sdpa")
_override: list[str] = []  # masked_path_override's stack


def flex_available() -> bool:
    """Whether this torch provides FlexAttention."""
    return flex_attention is not None


@contextlib.contextmanager
def masked_path_override(path: str):
    """Every masked attention inside the block takes ``path`` ('flex' | 'sdpa'), whatever the
    layers' backend (module docstring: the rehearsal's explicit path)."""
    if path not in MASKED_PATHS:
        raise ValueError(f"masked attention path {path!r}; choose one of {MASKED_PATHS}")
    _override.append(path)
    try:
        yield
    finally:
        _override.pop()


def masked_path(backend: str, device_type: str, grad: bool, bool_mask: bool = True) -> str:
    """'flex' or 'sdpa': which path attention under an explicit mask takes (module docstring).

    ``backend``: the layer's ``execution.attention``; ``device_type``: the queries' device;
    ``grad``: autograd records this call (q, k or v requires grad: a backward may follow);
    ``bool_mask``: the mask is bool (an additive float mask always takes SDPA)."""
    if _override:
        return _override[-1] if bool_mask else "sdpa"
    if backend == "flex" and not flex_available():
        raise RuntimeError(f"execution.attention='flex' needs torch >= 2.5 (FlexAttention); this is {torch.__version__}")
    if not bool_mask or backend == "sdpa" or not flex_available():
        return "sdpa"
    if backend == "flex":
        if device_type == "cpu" and grad:
            raise RuntimeError("execution.attention='flex' on CPU in training: torch has no FlexAttention backward "
                               "on CPU; use 'auto' (the chunked SDPA path there)")
        return "flex"
    return "flex" if device_type == "cuda" and grad else "sdpa"  # auto, flash


@functools.cache
def _compiled():
    return torch.compile(flex_attention)


def flex_masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                          gqa: bool) -> torch.Tensor:
    """FlexAttention under a bool mask, equal to ``F.scaled_dot_product_attention(q, k, v,
    attn_mask=mask, enable_gqa=gqa)`` to float tolerance.

    q: (B, H, Tq, hd); k, v: (B, Hkv, S, hd); mask: (B|1, 1|H, Tq|1, S) bool, True = may attend.
    The block mask reads the dense mask (any bool mask works: KV sharing's staircase, a
    prefix's all-True columns) and is built per call: routing changes it every step. A row
    that sees no key gives 0 here and NaN in SDPA; none of these masks has one (a query
    always sees its own position's key, or the prefix).
    """
    Tq, S = q.shape[2], k.shape[2]  # queries, keys
    mB, mH = mask.shape[0], mask.shape[1]  # 1 where the mask is broadcast
    m = mask.expand(mB, mH, Tq, S)  # (B|1, H|1, Tq, S): one row per query

    def mask_mod(b, h, qi, ki):
        return m[b if mB > 1 else 0, h if mH > 1 else 0, qi, ki]

    block_mask = create_block_mask(mask_mod, mB if mB > 1 else None, mH if mH > 1 else None, Tq, S, device=q.device)
    kernel = _compiled() if q.is_cuda else flex_attention
    return kernel(q, k, v, block_mask=block_mask, enable_gqa=gqa)  # (B, H, Tq, hd)
