"""Router architectures (App. G.1): the head that maps a token's state to its router logits.

    linear     one C -> out matrix
    mlp        C -> C, GELU, C -> out
    wide_mlp   C -> 4C, GELU, 4C -> out

One object per architecture: its parameter count (``mor.flops``, pure) and its module
(``head``; torch imported there, so counting stays torch-free).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RouterArch:
    """``width`` None: a single linear map; else the MLP's hidden width as a multiple of C."""

    name: str
    width: int | None = None
    exported: bool = True  # the HF modeling file builds it (export_hf/modeling_mor.py ``router_head``)

    def params(self, hidden: int, out: int) -> int:
        """Weights of one head (no biases)."""
        if self.width is None:
            return hidden * out
        w = self.width * hidden
        return hidden * w + w * out

    def head(self, hidden: int, out: int = 1):
        """The head as an ``nn.Module`` (bias-free, as the authors')."""
        from torch import nn

        if self.width is None:
            return nn.Linear(hidden, out, bias=False)
        w = self.width * hidden
        return nn.Sequential(nn.Linear(hidden, w, bias=False), nn.GELU(), nn.Linear(w, out, bias=False))


LINEAR = RouterArch("linear")
MLP = RouterArch("mlp", 1)
WIDE_MLP = RouterArch("wide_mlp", 4)
