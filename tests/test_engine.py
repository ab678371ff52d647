"""The continuous depth-wise batching engine equals decoding each request alone.

For every model variant of grids tables 10, 13, 14 and 15 (mapped to the ``tiny`` scale), a
mixed queue with staggered prompt and generation lengths runs through an engine with fewer
slots than requests; each request's greedy tokens must equal ``decode.generate`` on its
prompt alone (fp32, CPU), token for token. MoR routers get std-1 weights so the causal
decision really sends tokens out early in the engine (asserted), otherwise a model that
never routes would pass trivially. Scheduling is tested on its own: the batch stays full
while the queue is non-empty, and no request is lost, duplicated or reordered.
"""

import dataclasses
import random

import pytest
import torch

from mor.config import ModelConfig, RouterConfig, load_scales
from mor.engine import Engine, Request
from mor.grids import grid_path, load_grid
from mor.model.decode import generate
from mor.model.transformer import build_model

TINY = load_scales()["tiny"]
V, MAX_LEN = 50, 16
GRIDS = ("table10", "table13", "table14", "table15")


def grid_variants() -> list[ModelConfig]:
    """Every distinct model config of the grids, at the tiny scale."""
    seen: dict[ModelConfig, None] = {}
    for name in GRIDS:
        for run in load_grid(grid_path(name), "local").runs:
            seen.setdefault(dataclasses.replace(run.config.model, scale="tiny"))
    return list(seen)


VARIANTS = grid_variants()


def cfg_id(c: ModelConfig) -> str:
    parts = [c.variant, c.tying, f"nr{c.num_recursions}", c.kv]
    if c.variant == "vanilla" and c.reduced:
        parts.append("reduced")
    if c.variant == "mor":
        r = c.router
        parts += [r.type, r.aux if r.type == "expert_choice" else r.balancing, r.func, r.arch, r.gating,
                  f"a{r.alpha}", f"z{r.z_loss_coeff}"]
    return "-".join(str(p) for p in parts)


def requests(n: int, seed: int = 0) -> list[Request]:
    """Staggered prompt (1..6) and generation (1..9) lengths."""
    rnd = random.Random(seed)
    return [Request(i, [rnd.randrange(V) for _ in range(rnd.randint(1, 6))], rnd.randint(1, 9)) for i in range(n)]


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
    return generate(model, torch.tensor([req.prompt]), req.max_new_tokens)[0, len(req.prompt):].tolist()


def early_exits(res) -> bool:
    """Some recursion ran on fewer tokens than the recursion before it in the same iteration."""
    prev = None
    for stage, n in zip(res.stages, res.rows):
        if stage.startswith("depth") and stage != "depth0" and prev is not None and n < prev:
            return True
        prev = n if stage.startswith("depth") else None
    return False


def test_grids_give_many_variants():
    kinds = {(c.variant, c.router.type if c.variant == "mor" else None, c.kv) for c in VARIANTS}
    assert len(VARIANTS) >= 30 and ("mor", "token_choice", "recursion_wise") in kinds
    assert {c.kv for c in VARIANTS} == {"recursion_wise", "shared", "shared_dagger"}


@pytest.mark.parametrize("cfg", VARIANTS, ids=cfg_id)
def test_engine_equals_each_request_generated_alone(cfg):
    reqs = requests(7)
    for seed in range(10):  # the first seed whose routing sends a token out early in the engine
        model = make(cfg, seed)
        res = Engine(model, capacity=3, max_len=MAX_LEN).run(reqs)
        if cfg.variant != "mor" or early_exits(res):
            break
    else:
        raise AssertionError(f"no seed makes {cfg_id(cfg)} exit a token early")
    assert sorted(res.outputs) == [r.id for r in reqs]
    for r in reqs:
        assert res.outputs[r.id] == solo(model, r), f"request {r.id}"
    assert res.forward_s > 0 and res.wall_s >= res.forward_s


def test_batch_stays_full_while_the_queue_is_not_empty():
    model = make(ModelConfig(scale="tiny", variant="mor", tying="middle_cycle", num_recursions=3,
                             router=RouterConfig(aux="aux_router")))
    capacity, reqs = 4, requests(13, seed=1)
    res = Engine(model, capacity=capacity, max_len=MAX_LEN).run(reqs)
    assert len(res.occupancy) == res.steps == len(res.waiting)
    busy = [occ for occ, w in zip(res.occupancy, res.waiting) if w > 0]
    assert len(busy) > 10 and all(occ == 1.0 for occ in busy)
    assert res.waiting[-1] == 0 and min(res.occupancy) < 1.0  # the queue drained, then slots emptied
    for stage, n, occ in zip(res.stages, res.rows, res.occupancy):  # a head step takes every exited token
        assert n <= capacity and (stage != "head" or n == round(occ * capacity))


def test_no_request_lost_or_duplicated_and_fifo_admission():
    model = make(ModelConfig(scale="tiny", variant="mor", tying="cycle", num_recursions=2, kv="shared"))
    reqs = requests(11, seed=2) + [Request(11, [3], 0)]  # one with nothing to generate
    res = Engine(model, capacity=4, max_len=MAX_LEN).run(reqs)
    assert sorted(res.outputs) == list(range(12))
    assert [len(res.outputs[r.id]) for r in reqs] == [r.max_new_tokens for r in reqs]
    assert res.admitted == list(range(11))  # FIFO, each once (the empty request takes no slot)
    assert res.tokens == sum(r.max_new_tokens for r in reqs)


def test_static_cache_is_never_reallocated_and_misuse_fails():
    model = make(ModelConfig(scale="tiny", variant="mor", tying="middle_cycle", num_recursions=3, kv="shared_dagger"))
    eng = Engine(model, capacity=2, max_len=MAX_LEN)
    ptrs = {e: (s.k.data_ptr(), s.v.data_ptr(), s.pos.data_ptr()) for e, s in eng.cache.cache.slots.items()}
    eng.run(requests(5))
    assert ptrs == {e: (s.k.data_ptr(), s.v.data_ptr(), s.pos.data_ptr()) for e, s in eng.cache.cache.slots.items()}
    with pytest.raises(ValueError, match="max_len"):
        eng.run([Request(0, [1] * 10, MAX_LEN)])
    with pytest.raises(ValueError, match="unique"):
        eng.run([Request(0, [1], 2), Request(0, [2], 2)])


@pytest.mark.parametrize("kv", ["recursion_wise", "shared", "shared_dagger"])
def test_engine_cache_rows_equal_the_decode_cache(kv):
    """Beyond the greedy tokens: after a request, its slot holds the keys, values and positions
    ``decode.prefill`` + ``decode_step`` cache for the same tokens (a stale or missing write
    that does not flip an argmax still fails here)."""
    from mor.model.decode import decode_step, prefill

    model = make(ModelConfig(scale="tiny", variant="mor", tying="middle_cycle", num_recursions=3, kv=kv,
                             router=RouterConfig(aux="aux_router")))
    req = Request(0, [3, 1, 4, 1, 5], 10)
    eng = Engine(model, capacity=1, max_len=MAX_LEN)
    out = eng.run([req]).outputs[0]
    cache, _ = prefill(model, torch.tensor([req.prompt]), MAX_LEN)
    with torch.no_grad():
        for tok in out[:-1]:
            decode_step(model, cache, torch.tensor([tok]))
    lengths = set()
    for e, ref in cache.slots.items():
        if cache.specs[e].kind == "dagger":
            ref.mirror(cache.slots[cache.specs[e].source])
        got = eng.cache.cache.slots[e]
        n = int(ref.length[0])
        lengths.add(n)
        assert int(got.length[0]) == n and torch.equal(got.pos[0, :n], ref.pos[0, :n]), f"slot e{e}"
        torch.testing.assert_close(got.k[0, :, :n], ref.k[0, :, :n], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(got.v[0, :, :n], ref.v[0, :, :n], rtol=1e-5, atol=1e-6)
    if kv == "recursion_wise":  # tokens exited early: deeper slots hold fewer of them
        assert len(lengths) > 1
