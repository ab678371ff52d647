"""Peak memory per GPU by category, counted storage by storage, beside ``mor.memory``'s estimate.

``StorageTracker`` counts bytes the way torch's ``mem_tracker.MemTracker`` does (every storage an
op creates is followed by a weak reference until it is freed; CUDA allocations rounded up to
512 bytes), but by the storage's role rather than by module: torch's tracker refuses a module
called more than once per step, and a recursive model calls every shared layer ``Nr`` times
(and every model several times under gradient accumulation). Categories:

    params     parameters and buffers (RoPE tables, the routers' bias) held when the step starts
    grads      a parameter's ``.grad`` (moved here when it is accumulated)
    optimizer  what ``optimizer.step`` creates (AdamW's moments; its short-lived temporaries too)
    transient  everything else: activations saved for backward, the logits, weight casts,
               DDP's buckets / FSDP's gathered layers, backward's temporaries

and the snapshot of the four at the moment their total peaks. Like torch's tracker it follows
``UntypedStorage.resize_``, which bypasses the dispatcher: FSDP frees a gathered layer by resizing
its storage to 0 (counted as still held, FSDP at 1.7B would read 6.4 GiB more). The memory model's parts map
onto them: ``transient`` <- weight casts + activations + logits + recompute + buffers.
"""

from __future__ import annotations

import math
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map_only

GiB = 1024**3
CATEGORIES = ("params", "grads", "optimizer", "transient", "total")
_CUDA_BLOCK = 512  # the caching allocator's smallest block


def _storages(t: torch.Tensor) -> list:
    from torch.distributed._tools.common_utils import get_untyped_storages

    return list(get_untyped_storages(t))


class StorageTracker(TorchDispatchMode):
    """Live bytes by category across one training step (module docstring)."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None):
        super().__init__()
        self.live: dict[int, list] = {}  # storage id -> [category, bytes, weakref]
        self.now = dict.fromkeys(CATEGORIES, 0.0)
        self.peak = dict(self.now)
        self.in_optimizer = False
        self.peak_phase = "start"
        self._hooks = []
        for p in model.parameters():
            self._add(p, "params")
            if p.requires_grad:  # a frozen parameter (the loss-free balancing bias) gets no gradient
                self._hooks.append(p.register_post_accumulate_grad_hook(self._grad))
        for b in model.buffers():
            self._add(b, "params")
        if optimizer is not None:
            for state in optimizer.state.values():
                tree_map_only(torch.Tensor, lambda t: self._add(t, "optimizer"), state)
            self._hooks.append(optimizer.register_step_pre_hook(lambda *a: self._set_opt(True)))
            self._hooks.append(optimizer.register_step_post_hook(lambda *a: self._set_opt(False)))

    def _set_opt(self, on: bool) -> None:
        self.in_optimizer = on

    def _bytes(self, st) -> int:
        n = st.nbytes()
        return math.ceil(n / _CUDA_BLOCK) * _CUDA_BLOCK if st.device.type == "cuda" else n

    def _add(self, t: torch.Tensor, category: str) -> None:
        for st in _storages(t):
            key = st._cdata
            if key in self.live:
                continue
            n = self._bytes(st)
            ref = weakref.ref(st, lambda _, key=key: self._free(key))
            self.live[key] = [category, n, ref]
            self._count(category, n)

    def _count(self, category: str, n: float) -> None:
        self.now[category] += n
        self.now["total"] += n
        if self.now["total"] > self.peak["total"]:
            self.peak = dict(self.now)
            # where the step is at its peak: backward runs inside an autograd graph task
            self.peak_phase = ("optimizer" if self.in_optimizer else
                               "backward" if torch._C._current_graph_task_id() >= 0 else "forward")

    def _free(self, key: int) -> None:
        entry = self.live.pop(key, None)
        if entry is not None:
            self.now[entry[0]] -= entry[1]
            self.now["total"] -= entry[1]

    def _resized(self, st, size: int) -> None:
        """``UntypedStorage.resize_`` bypasses the dispatcher; FSDP frees a gathered layer so
        (its storage resized to 0) and gathers into the same storage again (resized back)."""
        self._resize(st, size)
        entry = self.live.get(st._cdata)
        if entry is not None:
            n = self._bytes(st)
            self.now[entry[0]] -= entry[1]
            self.now["total"] -= entry[1]
            entry[1] = n
            self._count(entry[0], n)

    def __enter__(self):
        self._resize = torch.UntypedStorage.resize_
        tracker = self
        torch.UntypedStorage.resize_ = lambda st, size: tracker._resized(st, size)
        return super().__enter__()

    def _grad(self, p: torch.Tensor) -> None:
        """A parameter's gradient: counted as ``grads`` from here on."""
        for st in _storages(p.grad):
            entry = self.live.get(st._cdata)
            if entry is None:
                self._add(p.grad, "grads")
            elif entry[0] != "grads":
                self.now[entry[0]] -= entry[1]
                self.now["grads"] += entry[1]
                entry[0] = "grads"

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        from torch.distributed.tensor import DTensor

        if any(t is DTensor or issubclass(t, DTensor) for t in types):
            return NotImplemented  # DTensor unwraps to its local shard first; that is what is counted
        out = func(*args, **(kwargs or {}))
        category = "optimizer" if self.in_optimizer else "transient"
        tree_map_only(torch.Tensor, lambda t: self._add(t, category), out)
        return out

    def __exit__(self, *args):
        torch.UntypedStorage.resize_ = self._resize
        for h in self._hooks:
            h.remove()
        return super().__exit__(*args)


def modelled(est) -> dict[str, float]:
    """``mor.memory.MemoryEstimate`` in the same categories (bytes)."""
    transient = est.weight_casts + est.activations + est.logits + est.recompute + est.buffers
    return {"params": est.params, "grads": est.grads, "optimizer": est.optimizer, "transient": transient,
            "total": est.total}


def ratios(measured: dict[str, float], model: dict[str, float]) -> dict[str, float | None]:
    """measured / modelled per category (None where the model has nothing)."""
    return {k: (measured[k] / model[k] if model.get(k) else None) for k in CATEGORIES}
