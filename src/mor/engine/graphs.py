"""Static passes and graph capture: the buffers one pass shape reuses (``StaticPass``) and
how a GPU captures and replays it as a CUDA graph (``CudaGraphs``). The passes themselves
(what runs inside) are ``mor.engine.step``'s.
"""

from __future__ import annotations

import contextlib

import numpy as np
import torch


class CudaGraphs:
    """How StaticPass captures and replays on a GPU: a warm-up run on a side stream, then
    ``torch.cuda.graph`` capture into one memory pool shared by every graph of the stepper
    (graphs replay one at a time, so their intermediates may share memory; nano-vllm's
    model runner does the same). Tests drive StaticPass's device branch on a CPU with a
    double of this class (tests/helpers/engine.py ``FakeGraphs``)."""

    def __init__(self, device: torch.device):
        self.dev, self.pool = device, None

    @contextlib.contextmanager
    def side(self):
        side = torch.cuda.Stream(self.dev)
        side.wait_stream(torch.cuda.current_stream(self.dev))
        with torch.cuda.stream(side):
            yield
        torch.cuda.current_stream(self.dev).wait_stream(side)

    def capture(self, fn, views):
        """-> (graph, outputs): ``fn(views)`` captured, not run (its outputs hold nothing until a replay)."""
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = fn(views)
        return graph, out


class StaticPass:
    """Static input and output buffers of one pass shape (kind, row bucket, table width, ...),
    reused by every pass of that shape: the plan's arrays are copied into one flat device
    buffer (one copy, pinned and asynchronous on a GPU) whose views the device function reads,
    and its outputs are the same tensors every time. With a graph ``backend`` (CudaGraphs on a
    GPU) the function is captured once (after a warm-up run whose effect on the per-slot
    ``state`` is undone) and replayed; without one (a CPU) it runs eagerly over the same buffers
    and its outputs are copied into the static ones, the same code path."""

    def __init__(self, shapes, fn, device, backend=None, state=()):
        self.shapes, self.fn, self.dev, self.backend, self.state = list(shapes), fn, device, backend, list(state)
        self.sizes = [int(np.prod(sh)) for sh in self.shapes]
        self.inp = torch.zeros(sum(self.sizes), dtype=torch.long, device=device)
        self.views, at = [], 0
        for sh, n in zip(self.shapes, self.sizes):
            self.views.append(self.inp[at: at + n].view(sh))
            at += n
        self.out = None
        self.graph = None
        self.runs = 0

    def _load(self, arrays) -> None:
        flat = torch.from_numpy(np.concatenate([np.asarray(a, dtype=np.int64).reshape(-1) for a in arrays]))
        if self.dev.type == "cuda":
            flat = flat.pin_memory()
        self.inp.copy_(flat, non_blocking=self.dev.type == "cuda")

    def _restore(self, saved) -> None:
        for t, v in zip(self.state, saved):
            t.copy_(v)

    def run(self, arrays):
        if [tuple(a.shape) for a in arrays] != [tuple(sh) for sh in self.shapes]:
            raise ValueError("a static pass got arrays of another shape")
        self._load(arrays)
        self.runs += 1
        if self.graph is not None:
            self.graph.replay()
            return self.out
        if self.backend is not None:
            # warm-up outside the capture (lazy inits, autotuning); the per-slot state it updated
            # is put back, so the replay below applies the pass once (the KV entries it wrote
            # are rewritten by the replay with the same values)
            saved = [t.clone() for t in self.state]
            with self.backend.side():
                self.fn(self.views)
            self._restore(saved)
            self.graph, self.out = self.backend.capture(self.fn, self.views)
            self.graph.replay()
            return self.out
        res = self.fn(self.views)
        if self.out is None:
            self.out = _tree(lambda t: t.clone(), res)
        else:
            _tree_copy(self.out, res)
        return self.out


def _tree(f, x):
    if x is None:
        return None
    if isinstance(x, tuple):
        return tuple(_tree(f, y) for y in x)
    return f(x)


def _tree_copy(dst, src) -> None:
    if dst is None:
        return
    if isinstance(dst, tuple):
        for d, s_ in zip(dst, src):
            _tree_copy(d, s_)
    else:
        dst.copy_(src)
