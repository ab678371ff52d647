"""FLOPs as torch counts them (``torch.utils.flop_counter.FlopCounterMode``), on CPU too.

The analytic formulas live in ``mor.flops``; this module measures, so benchmarks and tests
can check those formulas and time variants per FLOP. On CPU, torch's SDPA runs
``aten._scaled_dot_product_flash_attention_for_cpu`` (and its backward), which the counter
does not know: attention would count as zero. ``register_cpu_sdpa_flops`` gives them the
formulas of the CUDA flash kernel (full Tq x S scores: no causal halving, like
``mor.flops``).
"""

from __future__ import annotations

from typing import Callable

import torch
from torch.utils.flop_counter import FlopCounterMode, register_flop_formula, sdpa_backward_flop_count, sdpa_flop_count

_registered = False


def register_cpu_sdpa_flops() -> None:
    """Teach FlopCounterMode the CPU SDPA kernels (once per process)."""
    global _registered
    if _registered:
        return
    aten = torch.ops.aten

    @register_flop_formula(aten._scaled_dot_product_flash_attention_for_cpu, get_raw=True)
    def _forward(query, key, value, *args, out_val=None, **kwargs) -> int:
        return sdpa_flop_count(query.shape, key.shape, value.shape)

    @register_flop_formula(aten._scaled_dot_product_flash_attention_for_cpu_backward, get_raw=True)
    def _backward(grad_out, query, key, value, *args, out_val=None, **kwargs) -> int:
        return sdpa_backward_flop_count(grad_out.shape, query.shape, key.shape, value.shape)

    _registered = True


def measured_flops(fn: Callable[[], object]) -> int:
    """FLOPs torch counts while running ``fn()`` (attention included on CPU)."""
    register_cpu_sdpa_flops()
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()
