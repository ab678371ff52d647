"""Sampling in the engine (mor.engine.sampling): the draw follows softmax(logits / T) within
the top-p nucleus (checked against the known distribution by simulation), it depends on
(seed, position) only, so the engine's sampled tokens are the same at any batch, policy or
preemption, and temperature 0 stays greedy (decode.generate)."""

import dataclasses

import pytest
import torch

from mor.config import ModelConfig, RouterConfig
from mor.engine import Engine, Request
from mor.engine.sampling import sample, uniform


def test_noise_is_uniform_and_keyed_by_seed_and_position():
    seed, pos = torch.tensor([1, 1, 2]), torch.tensor([5, 6, 5])
    u = uniform(seed, pos, 4000)
    assert u.min() > 0 and u.max() < 1 and abs(u.mean().item() - 0.5) < 0.01
    assert abs((u < 0.25).double().mean().item() - 0.25) < 0.01
    assert not torch.equal(u[0], u[1]) and not torch.equal(u[0], u[2])
    assert torch.equal(uniform(seed[:1], pos[:1], 4000)[0], u[0])  # the same key, the same noise


def test_sampled_frequencies_match_the_tempered_nucleus():
    """20k draws of one row (distinct positions): frequencies within 4 standard errors of
    softmax(logits / T) renormalised over the nucleus; tokens outside it never drawn."""
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0])
    T, p, n = 0.7, 0.9, 20_000
    probs = torch.softmax(logits / T, -1)
    srt, order = probs.sort(descending=True)
    nucleus = order[(srt.cumsum(0) - srt) < p]
    want = torch.zeros_like(probs)
    want[nucleus] = probs[nucleus] / probs[nucleus].sum()
    rows = logits.expand(n, -1)
    tok = sample(rows, torch.full((n,), T, dtype=torch.float64), torch.full((n,), p, dtype=torch.float64),
                 torch.full((n,), 7), torch.arange(n))
    freq = torch.bincount(tok, minlength=6).double() / n
    se = (want * (1 - want) / n).sqrt()
    assert len(nucleus) < 6 and freq[want == 0].sum() == 0
    assert ((freq - want).abs() <= 4 * se + 1e-12).all(), (freq, want)
    greedy = sample(rows[:3], torch.zeros(3, dtype=torch.float64), torch.ones(3, dtype=torch.float64),
                    torch.zeros(3, dtype=torch.long), torch.arange(3))
    assert greedy.tolist() == [0, 0, 0]


def _model(seed=0):
    from helpers.engine import make

    return make(ModelConfig(scale="tiny", variant="mor", tying="middle_cycle", num_recursions=3,
                            router=RouterConfig(aux="aux_router")), seed)


def _reqs(n, **kw):
    import random

    rnd = random.Random(0)
    return [Request(i, [rnd.randrange(50) for _ in range(rnd.randint(1, 4))], rnd.randint(3, 9), **kw) for i in range(n)]


def test_engine_sampling_is_seeded_and_independent_of_batching():
    model = _model()
    reqs = _reqs(7, temperature=1.0, top_p=0.95, seed=3)
    a = Engine(model, batch=3, max_len=16).run(reqs)
    b = Engine(model, batch=1, max_len=16, policy="lockstep").run(reqs)
    c = Engine(model, batch=4, max_len=16, graphs=True).run(reqs)
    assert a.outputs == b.outputs == c.outputs
    greedy = Engine(model, batch=3, max_len=16).run([dataclasses.replace(r, temperature=0.0) for r in reqs])
    assert greedy.outputs != a.outputs  # temperature 1 over 50 tokens of a random model samples
    other = Engine(model, batch=3, max_len=16).run([dataclasses.replace(r, seed=4) for r in reqs])
    assert other.outputs != a.outputs
    from helpers.engine import solo

    narrow = Engine(model, batch=3, max_len=16).run([dataclasses.replace(r, top_p=1e-6) for r in reqs])
    assert narrow.outputs == greedy.outputs == {r.id: solo(model, r) for r in reqs}  # the nucleus is the argmax


def test_sampled_tokens_survive_preemption():
    """Preempted sequences are recomputed from their tokens; their later draws keep their
    (seed, position) keys, so a memory-starved run samples what an unconstrained one does."""
    model = _model()
    reqs = [Request(i, [(7 * i) % 50, (3 * i + 1) % 50], 9 + i % 4, temperature=1.0, seed=i) for i in range(10)]
    free = Engine(model, batch=3, max_len=16).run(reqs)
    tight = Engine(model, batch=3, max_len=16, max_live=6, num_blocks=36, block_size=2).run(reqs)
    assert tight.preempted and tight.outputs == free.outputs


def test_bad_sampling_parameters_fail():
    with pytest.raises(ValueError, match="top_p"):
        Request(0, [1], 2, top_p=0.0)
    with pytest.raises(ValueError, match="temperature"):
        Request(0, [1], 2, temperature=-1.0)
