"""The authors' FLOP convention (mor.flops_authors) against their nine released 360M configs
(grids/authors/released.yaml): steps, decay steps and fixed save steps, and the layer counts our
models build (the floor depth rule, mor.depth)."""

from __future__ import annotations

import dataclasses

import pytest

from mor.authors import load_released
from mor.config import ModelConfig, RouterConfig, load_scales
from mor.flops import plan_for
from mor.flops_authors import authors_steps, decay_steps, save_step

COMMON, RUNS = load_released()
TOKENS_PER_STEP = COMMON["total_batch_size"] * COMMON["max_length"]
# The one step the convention does not give: both MoR-3 runs come out at 14,160.01 (round: 14,160)
# and were released as 14,161, while their save steps follow the 14,160.01 (mor.flops_authors).
ONE_STEP_OFF = {"mor3-expert", "mor3-token"}


def _model(r) -> tuple[ModelConfig, object]:
    router = RouterConfig(type="expert_choice" if r.router == "expert" else "token_choice") if r.router else RouterConfig()
    cfg = ModelConfig(scale="360M", variant=r.variant, num_recursions=r.num_recursions, router=router, kv=r.kv,
                      layers=r.layers if r.layers != 32 else 0)
    return cfg, dataclasses.replace(load_scales()["360M"], layers=r.layers)


@pytest.mark.parametrize("r", RUNS, ids=[r.name for r in RUNS])
def test_steps_match_the_released_configs(r):
    cfg, shape = _model(r)
    ours = authors_steps(cfg, shape, COMMON["max_length"], TOKENS_PER_STEP, COMMON["budget_flops"])
    if r.name in ONE_STEP_OFF:
        assert ours == r.num_train_steps - 1, f"{r.file}: ours {ours}, theirs {r.num_train_steps}"
    else:
        assert ours == r.num_train_steps, f"{r.file}: ours {ours}, theirs {r.num_train_steps}"
    assert decay_steps(r.num_train_steps) == r.num_decay_steps


@pytest.mark.parametrize("r", [r for r in RUNS if r.fixed_save_steps], ids=lambda r: r.name)
def test_fixed_save_steps_are_0p8_of_each_budget(r):
    cfg, shape = _model(r)
    ours = tuple(save_step(cfg, shape, COMMON["max_length"], TOKENS_PER_STEP, b) for b in (2e18, 5e18, 16.5e18))
    assert ours == r.fixed_save_steps


@pytest.mark.parametrize("r", RUNS, ids=[r.name for r in RUNS])
def test_layers_match_the_released_configs(r):
    cfg, shape = _model(r)
    assert len(plan_for(cfg, shape).order) == r.layers
