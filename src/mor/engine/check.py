"""State checks of the engine's passes: what a pass leaves behind, compared between two paths.

A capture bug (a CUDA graph whose warm-up run was not undone, a replay that reads another
graph's outputs) can leave the tokens of a small model unchanged while the hidden state
moves; comparing the per-slot state and the KV pool after every pass against the eager
path's catches it. Used by the tests (with a CPU double of the CUDA graph,
tests/helpers/engine.py) and by benchmarks/device_check.py (real graphs, fp32, on a GPU).

    eager, static = Engine(model, ..., graphs=False), Engine(model, ..., graphs=True)
    a, b = pass_states(eager), pass_states(static)   # recorders: install before run()
    eager.run(reqs); static.run(reqs)
    state_deviation(a, b)   # largest |difference| pass by pass (inf: different passes)
"""

from __future__ import annotations

import torch


def pass_states(engine) -> list[list[torch.Tensor]]:
    """Record, after every pass ``engine`` runs (enter, block, head), the state it leaves
    behind: the per-slot tensors of the sequence slots (h, router weight, token-choice h1 /
    weight / depth; the padding slot left out) and the KV pool (the trash block left out).
    Copies go to the host, so a long run does not hold them on the device."""
    st, out = engine.stepper, []
    S = st.pad_row
    for name in ("enter", "block", "head"):
        fn = getattr(st, name)

        def after(*a, _fn=fn, **k):
            res = _fn(*a, **k)
            out.append([t[:S].detach().to("cpu", copy=True) for t in (st.h, st.g, st.h1, st.tg, st.depth)]
                       + [engine.cache.k[:-1].to("cpu", copy=True), engine.cache.v[:-1].to("cpu", copy=True)])
            return res

        setattr(st, name, after)
    return out


def state_deviation(a: list[list[torch.Tensor]], b: list[list[torch.Tensor]]) -> float:
    """The largest absolute difference between two runs' states pass by pass (inf when they
    ran different numbers of passes or a difference is not finite)."""
    if len(a) != len(b):
        return float("inf")
    worst = 0.0
    for sa, sb in zip(a, b):
        for x, y in zip(sa, sb):
            d = (x.double() - y.double()).abs()
            if d.numel():
                worst = max(worst, float("inf") if not torch.isfinite(d).all() else float(d.max()))
    return worst
