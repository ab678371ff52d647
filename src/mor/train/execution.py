"""How a model computes during training, never what it computes (mor.config.ExecConfig).

Why here and not in the model: as in torchtitan, the model describes the network and the
training side decides how it runs, so memory savings (activation checkpointing, the chunked
loss) change no model code and ``mor.model`` imports nothing of ``torch.utils.checkpoint``.
The model keeps two neutral hooks, used in training mode only (eval, scoring and decoding
always take the plain path), which ``apply_execution`` sets:

    layer_wrapper   every layer call runs as ``layer_wrapper(call, *args)`` (None: ``call(*args)``);
                    here ``checkpointed``: recompute the call's activations in backward
    lm_loss_fn      with targets, ``lm_loss_fn(normed_h (N, C), head weight (V, C), targets (N,))``
                    gives the mean LM loss instead of the logits and their cross-entropy
                    (None: the plain path); here ``chunked_cross_entropy``

Both are module-level functions (a ``functools.partial`` for the chunk), so a model that is
deep-copied or pickled keeps them.
"""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from mor.model.flex import flex_available
from mor.model.layers import flash_available


def apply_execution(model, attention: str = "auto", checkpoint_layers: bool = False, loss_chunk: int = 0) -> None:
    """How ``model`` (a mor.model.transformer.MoRTransformer) computes, never what: the attention
    backend of every layer ('auto' | 'sdpa' | 'flash' | 'flex'; which path masked attention
    takes: mor.model.flex); recompute each layer call's activations in backward instead of
    keeping them (training only); and the loss over ``loss_chunk`` positions at a time (training
    with targets; 0 = all at once). The defaults undo both."""
    if attention == "flash" and not flash_available():
        raise RuntimeError("execution.attention='flash' but flash_attn is not installed (pip install '.[gpu]')")
    if attention == "flex" and not flex_available():
        raise RuntimeError("execution.attention='flex' needs torch >= 2.5 (FlexAttention), "
                           f"this is {torch.__version__}")
    for layer in model.unique_layers:
        layer.self_attn.backend = attention
    for attn in model.recursion_attn.values():  # untied attention of recursions > 1
        attn.backend = attention
    model.layer_wrapper = checkpointed if checkpoint_layers else None
    model.lm_loss_fn = partial(chunked_cross_entropy, chunk=loss_chunk) if loss_chunk else None


def checkpointed(call, *args):
    """``call(*args)`` under activation checkpointing where a backward will follow: only its
    inputs are kept, the whole call (relaxation included) is recomputed in backward."""
    if torch.is_grad_enabled():
        return checkpoint(call, *args, use_reentrant=False)
    return call(*args)


def _chunk_loss_sum(h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Summed cross-entropy of one chunk: h (n, C) -> fp32 logits (n, V) -> a scalar."""
    return F.cross_entropy(F.linear(h, weight).float(), targets, ignore_index=-100, reduction="sum")


def chunked_cross_entropy(h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunk: int) -> torch.Tensor:
    """Mean next-token cross-entropy of the normed hidden states h (N, C) under the head
    ``weight`` (V, C), ``chunk`` positions at a time, equal to the plain path's
    ``cross_entropy(linear(h, weight).float(), targets)`` up to float summation order.

    Each chunk is checkpointed: forward keeps only its scalar, backward recomputes that
    chunk's (chunk, V) logits, so at most one chunk's fp32 logits (and their softmax
    gradient) exist at a time instead of the whole micro-batch's (N, V)."""
    total = h.new_zeros((), dtype=torch.float32)
    for start in range(0, h.shape[0], chunk):
        h_c, t_c = h[start:start + chunk], targets[start:start + chunk]  # (n, C), (n,)
        if torch.is_grad_enabled():
            total = total + checkpoint(_chunk_loss_sum, h_c, weight, t_c, use_reentrant=False)
        else:
            total = total + _chunk_loss_sum(h_c, weight, t_c)
    return total / (targets != -100).sum()  # the mean over scored positions, as cross_entropy's default
