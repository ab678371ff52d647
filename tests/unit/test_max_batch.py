"""App. E's maximum decoding batch: the seed's simplification and the exact memory model,
on shapes small enough to count by hand."""

from __future__ import annotations

import pytest

from mor.config import ModelConfig, load_scales
from mor.flops import max_batch, param_count, relative_max_batch, relative_max_batch_exact

TINY = load_scales()["tiny"]  # hidden 32, 4 layers, 4 heads (head_dim 8), 2 KV heads
V = 64
# one cached position of one layer: K and V x 2 KV heads x head_dim 8 x 2 bytes (bf16)
ENTRY = 2 * 2 * 8 * 2


def test_seed_simplification_gives_42_48_51():
    """32 x 2Nr / (Nr + 1): the whole model's memory treated as KV cache."""
    assert [round(relative_max_batch(nr), 2) for nr in (2, 3, 4)] == [42.67, 48.0, 51.2]


def test_vanilla_max_batch_by_hand():
    cfg = ModelConfig(scale="tiny")
    L = 10
    per_seq = 4 * L * ENTRY  # 4 layers, every position cached
    params = param_count(cfg, TINY, V) * 2
    assert max_batch(cfg, TINY, V, L, params + 3 * per_seq + per_seq - 1) == 3
    assert max_batch(cfg, TINY, V, L, params + 3 * per_seq) == 3
    assert max_batch(cfg, TINY, V, L, params - 1) == 0


def test_mor_max_batch_counts_capacities_and_unshared_layers():
    """MoR-2 Middle-Cycle over 4 layers = 1 + 1x2 + 1: the first and last layer cache all 10
    positions, recursion 1 (capacity 1) all 10, recursion 2 (capacity 1/2) 5: 35 entries."""
    cfg = ModelConfig(scale="tiny", variant="mor", num_recursions=2, tying="middle_cycle")
    per_seq = (10 + 10 + 5 + 10) * ENTRY
    params = param_count(cfg, TINY, V) * 2
    assert max_batch(cfg, TINY, V, 10, params + 7 * per_seq) == 7
    vanilla = ModelConfig(scale="tiny")
    mem = param_count(vanilla, TINY, V) * 2 + 100 * 4 * 10 * ENTRY  # vanilla fits exactly 100
    expected = 32 * ((mem - params) // per_seq) / 100
    assert relative_max_batch_exact(cfg, vanilla, TINY, V, 10, mem) == pytest.approx(expected)


def test_shared_kv_stores_the_first_recursion_only():
    """Recursive Cycle Nr=2 over 4 layers with kv: shared: recursion 2's two layers read
    recursion 1's cache, so one sequence stores 2 layers x L positions."""
    cfg = ModelConfig(scale="tiny", variant="recursive", num_recursions=2, tying="cycle", kv="shared")
    params = param_count(cfg, TINY, V) * 2
    assert max_batch(cfg, TINY, V, 10, params + 5 * 2 * 10 * ENTRY) == 5


def test_vanilla_with_more_layers_is_app_e_baseline():
    """model.layers: 34 at 360M gives the 34-layer vanilla App. E compares MoR-4 with."""
    s = load_scales()["360M"]
    v32, v34 = ModelConfig(scale="360M"), ModelConfig(scale="360M", layers=34)
    mem = 80e9
    b32, b34 = max_batch(v32, s, 49152, 2048, mem), max_batch(v34, s, 49152, 2048, mem)
    per_layer = 2048 * 2 * s.kv_heads * s.head_dim * 2
    assert b34 == int((mem - param_count(v34, s, 49152) * 2) // (34 * per_layer)) < b32


@pytest.mark.parametrize("kv", ["recursion_wise", "shared"])
def test_engine_admission_limit_is_max_batch(kv):
    """An engine given a memory budget admits exactly flops.max_batch live sequences, and its
    paged cache holds the rest of the budget after the parameters: one function for both."""
    import torch

    from mor.engine import Engine
    from mor.flops import kv_cache_bytes, model_bytes
    from mor.model.transformer import build_model

    cfg = ModelConfig(scale="tiny", variant="mor", num_recursions=3, tying="middle_cycle", kv=kv)
    model = build_model(cfg, TINY, V)
    L, elem = 12, 4  # fp32
    mem = model_bytes(cfg, TINY, V, elem) + 7.5 * kv_cache_bytes(cfg, TINY, 1, L, elem)
    eng = Engine(model, batch=2, max_len=L, memory_bytes=mem, block_size=4, dtype=torch.float32)
    assert eng.max_live == max_batch(cfg, TINY, V, L, mem, elem, block_size=4) <= max_batch(cfg, TINY, V, L, mem, elem) == 7
    assert eng.cache.nbytes() // (eng.blocks.num_blocks + 1) * eng.blocks.num_blocks <= mem - model_bytes(cfg, TINY, V, elem)


def test_block_rounded_max_batch_by_hand():
    """MoR-2 Middle-Cycle, 10 positions, blocks of 4: layers of 10, 10, 5, 10 entries take
    3 + 3 + 2 + 3 = 11 blocks a sequence; 50 blocks hold 4 sequences (exact count: 50 x 4 / 35 = 5)."""
    from mor.flops import kv_cache_blocks

    cfg = ModelConfig(scale="tiny", variant="mor", num_recursions=2, tying="middle_cycle")
    assert kv_cache_blocks(cfg, TINY, 10, 4) == 11
    block = 2 * 4 * 2 * 8 * 2  # K and V x 4 entries x 2 KV heads x head_dim 8 x bf16
    mem = param_count(cfg, TINY, V) * 2 + 50 * block
    assert max_batch(cfg, TINY, V, 10, mem, block_size=4) == 4 and max_batch(cfg, TINY, V, 10, mem) == 5


def _fake_passes(eng, shares: list[float], seed: int = 0):
    """Replace the engine's device passes by routers that keep each recursion's design share
    of the tokens reaching it (seeded coin flips) and a constant token: the host's planning,
    paging and scheduling run as they do for a model, at no model cost."""
    import torch

    st, g = eng.stepper, torch.Generator().manual_seed(seed)

    def keep(n, r):
        return torch.rand(n, generator=g) < shares[r]

    def enter(idx, p, tokens, plan):
        return keep(idx.shape[0], 1) if st.drops[0] or shares[1] < 1 else None

    def block(idx, p, rec, nxt, plan, need, route, lids=None):
        return torch.stack([keep(1, int(r))[0] if int(r) < len(shares) else torch.tensor(False) for r in nxt])

    def head(idx, p, plan, enter_=None):
        tok = torch.zeros(idx.shape[0], dtype=torch.long)
        return tok, (None if enter_ is None else enter(enter_[0], None, None, None))

    st._enter_fn, st._block_fn, st._head_fn = enter, block, head
    st.drops = [True] * st.nr


@pytest.mark.parametrize("block_size", [16, 256])
def test_admitting_max_live_at_app_e_lengths_never_preempts(block_size):
    """App. E's lengths (one prompt token, N(256, 64) new tokens clipped to 1..512, max_len
    512): an engine whose admission limit is max_batch with block rounding (the engine's own
    count) serves the queue at that many live sequences without one preemption, routers
    keeping their design shares (admission reserves every sequence's worst case, whole
    blocks at max_len, so the pool cannot overrun while the shares hold)."""
    import dataclasses
    import random

    import torch

    from mor.capacity import capacities
    from mor.engine import Engine, Request
    from mor.flops import model_bytes
    from mor.model.transformer import build_model

    cfg = ModelConfig(scale="tiny", variant="mor", num_recursions=3, tying="middle_cycle")
    shape = dataclasses.replace(TINY, max_seq_len=1024)
    model = build_model(cfg, shape, V)
    L, elem, live = 512, 4, 12
    block = 2 * block_size * shape.kv_heads * shape.head_dim * elem
    from mor.flops import kv_cache_blocks

    mem = model_bytes(cfg, shape, V, elem) + live * kv_cache_blocks(cfg, shape, L, block_size) * block
    caps = capacities(3, cfg.router.capacity)
    shares = [1.0] + [caps[r] / caps[r - 1] for r in range(1, 3)]
    rnd = random.Random(0)
    reqs = [Request(i, [1], max(1, min(512, round(rnd.gauss(256, 64))))) for i in range(2 * live)]
    eng = Engine(model, batch=live, max_len=L, memory_bytes=mem, block_size=block_size, dtype=torch.float32)
    assert eng.max_live == max_batch(cfg, shape, V, L, mem, elem, block_size=block_size) == live
    _fake_passes(eng, shares)
    res = eng.run(reqs)
    assert not res.preempted and max(res.live) == live and sorted(res.outputs) == list(range(len(reqs)))
    assert [len(res.outputs[r.id]) for r in reqs] == [r.max_new_tokens for r in reqs]
    assert res.peak_blocks <= eng.blocks.num_blocks
