"""Per-row relaxations for a call over rows at mixed recursion depths (the batching engine's
block pass): each row uses its own recursion's LoRA / DoRA slot and recursion-PE gain.

A model concern (it reads ``mor.model.relax``'s slots and hooks the shared linears), kept
beside the relaxations so the engine only asks for the rows' recursion indices.
"""

from __future__ import annotations

import contextlib

import torch

from mor.model.relax import LORA_TARGETS, LowRankRelaxation, RecursionPE, slot_name


class RowRelaxation:
    """Per-row relaxations for a mixed-depth call: row i uses recursion ``rec[i]``'s LoRA /
    DoRA slot of the layer and recursion ``rec[i]``'s position-encoding gain.

    LoRA / DoRA (relax.LowRankRelaxation) are stacked per unique layer and projection over
    the recursions: A (R, rank, in), B (R, out, rank), DoRA gain m / ||W + s B A|| (R, out)
    (the weights are frozen at inference), zeros / ones where the plan runs no such slot.
    Forward hooks on the shared linears (installed for the engine's run only, after the
    model's own hooks, which leave a call at ``recursion=None`` untouched) add
    s * B[rec] A[rec] x per row and apply the gain."""

    def __init__(self, model):
        self.model, self.rec = model, None
        relax = model.relax
        R = len(model.plan.recursions)
        self.pe = torch.stack([g.detach() for g in relax.gains]) if isinstance(relax, RecursionPE) else None  # (R, C)
        self.stacks: dict[tuple[int, str], tuple] = {}
        if isinstance(relax, LowRankRelaxation):
            units = sorted({u for rec in model.plan.recursions for u in rec})
            for u in units:
                for short, path in LORA_TARGETS.items():
                    lin = model.unique_layers[u].get_submodule(path)
                    A = lin.weight.new_zeros(R, relax.rank, lin.in_features)
                    B = lin.weight.new_zeros(R, lin.out_features, relax.rank)
                    gain = lin.weight.new_ones(R, lin.out_features) if relax.dora else None
                    scale = 1.0
                    for r in range(R):
                        name = slot_name(u, r)
                        if name in relax.slots:
                            d = relax.slots[name][short]
                            A[r], B[r], scale = d.A.detach(), d.B.detach(), d.scale
                            if gain is not None:
                                gain[r] = (d.magnitude / d.row_norm(lin.weight)).detach().to(gain.dtype)
                    self.stacks[u, short] = (A, B, gain, scale)

    @contextlib.contextmanager
    def installed(self):
        handles = []
        for (u, short), _ in self.stacks.items():
            lin = self.model.unique_layers[u].get_submodule(LORA_TARGETS[short])
            handles.append(lin.register_forward_hook(self._hook(u, short)))
        try:
            yield
        finally:
            for h in handles:
                h.remove()

    def _hook(self, u: int, short: str):
        def hook(module, inputs, out):
            if self.rec is None:
                return None
            A, B, gain, scale = self.stacks[u, short]
            x = inputs[0]  # (n, 1, in)
            a = torch.einsum("nti,nri->ntr", x, A[self.rec].to(x.dtype))  # (n, 1, rank)
            y = out + scale * torch.einsum("ntr,nor->nto", a, B[self.rec].to(x.dtype))  # (n, 1, out)
            return y if gain is None else y * gain[self.rec].to(y.dtype).unsqueeze(1)
        return hook

    @contextlib.contextmanager
    def at(self, rec: torch.Tensor):
        self.rec = rec
        try:
            yield
        finally:
            self.rec = None

    def end_recursion(self, h: torch.Tensor, rec: torch.Tensor) -> torch.Tensor:
        """Recursion PE of each row's recursion; h (n, 1, C)."""
        return h if self.pe is None else h * self.pe[rec].to(h.dtype).unsqueeze(1)
