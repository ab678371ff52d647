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
    assert eng.max_live == max_batch(cfg, TINY, V, L, mem, elem) == 7
    assert eng.cache.nbytes() // (eng.blocks.num_blocks + 1) * eng.blocks.num_blocks <= mem - model_bytes(cfg, TINY, V, elem)
