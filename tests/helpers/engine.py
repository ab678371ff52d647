"""The tiny model and the reference decode that the engine tests share
(tests/unit/test_engine.py, tests/unit/test_sampling.py), and a CPU double of the CUDA
graph capture (``FakeGraphs``) with the per-pass state record that checks it."""

from __future__ import annotations

import contextlib

import torch

from mor.config import ModelConfig
from mor.engine import Request
from mor.engine.check import pass_states, state_deviation  # noqa: F401 (the tests' state check)
from mor.model.decode import generate
from mor.model.transformer import build_model

from helpers.decode import TINY, V  # the decoding tests' tiny scale and vocabulary


def make(cfg: ModelConfig, seed: int = 0):
    """A tiny model in eval mode; MoR routers get std-1 weights (decisive logits)."""
    torch.manual_seed(seed)
    model = build_model(cfg, TINY, V).eval()
    with torch.no_grad():
        for router in model.routers:
            for head in (router.head, getattr(router, "aux_head", None)):
                for p in head.parameters() if head is not None else ():
                    if p.dim() == 2:
                        torch.nn.init.normal_(p, std=1.0)
    return model


def solo(model, req: Request) -> list[int]:
    """One request decoded alone by the reference loop (mor.model.decode.generate)."""
    return generate(model, torch.tensor([req.prompt]), req.max_new_tokens)[0, len(req.prompt):].tolist()


class FakeGraphs:
    """A CPU double of ``mor.engine.graphs.CudaGraphs`` that drives StaticPass's device branch
    (warm-up, state restore, capture, replay) as a GPU would run it. ``capture`` records the
    function and runs nothing: what tracing it wrote to the per-slot state and the KV pool is
    undone and its outputs hold garbage (NaN, -1, True), as a captured graph's outputs do
    before a replay. ``replay`` re-runs it into the same output storage and then poisons every
    other graph's outputs, as graphs sharing one memory pool may overwrite each other's."""

    def __init__(self, stepper):
        self.state = [stepper.h, stepper.g, stepper.h1, stepper.depth, stepper.tg, stepper.cache.k, stepper.cache.v]
        self.graphs: list[FakeGraph] = []

    def side(self):
        return contextlib.nullcontext()

    def capture(self, fn, views):
        saved = [t.clone() for t in self.state]
        out = fn(views)
        for t, s in zip(self.state, saved):
            t.copy_(s)
        graph = FakeGraph(self, fn, views, out)
        graph.poison()
        self.graphs.append(graph)
        return graph, out


class FakeGraph:
    def __init__(self, owner: FakeGraphs, fn, views, out):
        self.owner, self.fn, self.views, self.out = owner, fn, views, out
        self.replays = 0

    def _leaves(self):
        return [t for t in (self.out if isinstance(self.out, tuple) else (self.out,)) if t is not None]

    def poison(self) -> None:
        for t in self._leaves():
            t.fill_(True if t.dtype == torch.bool else -1 if not t.is_floating_point() else float("nan"))

    def replay(self) -> None:
        res = self.fn(self.views)
        res = res if isinstance(res, tuple) else (res,)
        for dst, src in zip(self._leaves(), [t for t in res if t is not None]):
            dst.copy_(src)
        self.replays += 1
        for g in self.owner.graphs:
            if g is not self:
                g.poison()
