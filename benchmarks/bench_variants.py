"""Benchmark: training-step time of each MoR variant per FLOP, relative to Recursive.

At the ``small`` CPU scale (Middle-Cycle, Nr=3, batch 16 x 128) it times one forward +
backward of each variant and counts its FLOPs with ``torch.utils.flop_counter``. On CPU,
torch's SDPA runs ``aten._scaled_dot_product_flash_attention_for_cpu``, which the counter
does not know, so its formula (the same as the CUDA flash kernel's) is registered
(``mor.flop_count``).

    cost ratio = (t_variant / t_recursive) / (flops_variant / flops_recursive)

A ratio <= 1.0 means the variant spends no more time per FLOP than the Recursive model of
the same Nr: its routing, gathering and masking overhead is paid for by the compute it
skips. It also reports whether KV sharing is cheaper per step than recursion-wise caching:
per training step, for the Recursive model and for each router, and per prompt prefill,
for MoR under Cycle tying, where sharing runs only recursion 1 over the prompt (PAPER.md's
cost table: sharing saves KV memory and prefill; in MoR training its active queries attend
over all T keys, k*T instead of k^2, so its training step is not expected to be cheaper).

The machine this runs on is shared and noisy, so every round times each variant once, in
a shuffled order, and each ratio is taken within its round (the noise of a round hits all
variants alike); the table gives the median and quartiles of those per-round ratios. The process
uses the tuned CPU allocator the training jobs use (``mor.cpu_allocator``); without it,
page faults of the 32 MiB logits dominate every variant's step alike.

    .venv/bin/python benchmarks/bench_variants.py [--repeats 15] [--threads 1]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from typing import Callable

import torch

from mor.config import ModelConfig, RouterConfig, load_scales
from mor.cpu_allocator import tune_cpu_allocator
from mor.flop_count import measured_flops
from mor.model.decode import prefill
from mor.model.transformer import build_model


def variants() -> dict[str, ModelConfig]:
    base = dict(scale="small", tying="middle_cycle", num_recursions=3)
    ec = RouterConfig(type="expert_choice", alpha=0.1)
    tc = RouterConfig(type="token_choice", func="softmax", alpha=1.0)
    return {
        "recursive": ModelConfig(variant="recursive", **base),
        "recursive kv=shared": ModelConfig(variant="recursive", kv="shared", **base),
        "MoR-EC recursion-wise": ModelConfig(variant="mor", router=ec, **base),
        "MoR-EC kv=shared": ModelConfig(variant="mor", router=ec, kv="shared", **base),
        "MoR-EC kv=shared_dagger": ModelConfig(variant="mor", router=ec, kv="shared_dagger", **base),
        "MoR-TC recursion-wise": ModelConfig(variant="mor", router=tc, **base),
        "MoR-TC kv=shared": ModelConfig(variant="mor", router=tc, kv="shared", **base),
    }


def step_fn(model, x):
    def step():
        model.zero_grad(set_to_none=True)
        model(x, x).loss.backward()

    return step


def prefill_fns(x: torch.Tensor) -> dict[str, Callable[[], object]]:
    """Prompt prefill of MoR under Cycle tying, the scheme where KV sharing runs only
    recursion 1 over the prompt (mor.model.decode): one function per router x KV strategy."""
    shape = load_scales()["small"]
    routers = {"EC": RouterConfig(type="expert_choice", alpha=0.1),
               "TC": RouterConfig(type="token_choice", func="softmax", alpha=1.0)}
    fns = {}
    for name, router in routers.items():
        for kv in ("recursion_wise", "shared"):
            cfg = ModelConfig(variant="mor", router=router, scale="small", tying="cycle", num_recursions=3, kv=kv)
            model = build_model(cfg, shape, 4096).eval()
            fns[f"MoR-{name} {kv}"] = torch.no_grad()(lambda m=model: prefill(m, x))
    return fns


def interleaved_ms(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, list[float]]:
    """Milliseconds per call of each function, one call of each per round in a shuffled order
    (machine noise hits every function of a round alike; no function is always first)."""
    for fn in fns.values():  # warm-up (also lets the heap reach its steady state)
        for _ in range(3):
            fn()
    wall: dict[str, list[float]] = {name: [] for name in fns}
    order, rng = list(fns), random.Random(0)
    for _ in range(repeats):
        rng.shuffle(order)
        for name in order:
            t = time.perf_counter()
            fns[name]()
            wall[name].append((time.perf_counter() - t) * 1e3)
    return wall


def quartiles(values: list[float]) -> tuple[float, float, float]:
    q1, q2, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, q2, q3


def ratio_line(name: str, num: list[float], den: list[float]) -> str:
    """Median and quartiles of the per-round ratios num / den, and whether they sit below 1."""
    q1, med, q3 = quartiles([a / b for a, b in zip(num, den)])
    verdict = "cheaper" if q3 < 1.0 else "not cheaper" if q1 > 1.0 else "within noise"
    return f"  {name:48s} = {med:.3f} ({q1:.3f}-{q3:.3f}) {verdict}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=128)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    tuned = tune_cpu_allocator()  # as the train and eval jobs do (mor.jobs)
    shape = load_scales()["small"]
    torch.manual_seed(0)
    x = torch.randint(0, 4096, (a.batch, a.seq))
    steps, flops = {}, {}
    for name, cfg in variants().items():
        steps[name] = step_fn(build_model(cfg, shape, 4096).train(), x)
        flops[name] = measured_flops(steps[name])
    wall = interleaved_ms(steps, a.repeats)
    ref = "recursive"
    print(f"small scale, Middle-Cycle Nr=3, batch {a.batch} x {a.seq}, {a.threads} thread(s), {a.repeats} rounds, "
          f"cpu allocator {'tuned' if tuned else 'default'}")
    print("per round: time ratio = step time / recursive step time of the same round; "
          "cost = time ratio / FLOP ratio (median, and quartiles over rounds)")
    print(f"{'variant':26s} {'ms/step':>8s} {'GFLOP':>7s} {'FLOP x':>7s} {'time x':>7s} {'cost':>6s} {'cost q1-q3':>12s}")
    for n in steps:
        fr = flops[n] / flops[ref]
        ratios = [t / r for t, r in zip(wall[n], wall[ref])]
        q1, tr, q3 = quartiles(ratios)
        print(f"{n:26s} {statistics.median(wall[n]):8.1f} {flops[n] / 1e9:7.2f} {fr:7.3f} {tr:7.3f} {tr / fr:6.3f} "
              f"{q1 / fr:5.3f}-{q3 / fr:5.3f}")
    print("KV sharing vs recursion-wise caching, training step time, per-round ratio (median, q1-q3):")
    for plain, shared in (("recursive", "recursive kv=shared"), ("MoR-EC recursion-wise", "MoR-EC kv=shared"),
                          ("MoR-TC recursion-wise", "MoR-TC kv=shared")):
        print(ratio_line(f"{shared} / {plain}", wall[shared], wall[plain]))
    pre = interleaved_ms(prefill_fns(x), a.repeats)
    print(f"KV sharing vs recursion-wise caching, prompt prefill ({a.batch} x {a.seq}, Cycle Nr=3), per-round ratio:")
    for router in ("EC", "TC"):
        print(ratio_line(f"MoR-{router} shared / recursion_wise", pre[f"MoR-{router} shared"],
                         pre[f"MoR-{router} recursion_wise"]))


if __name__ == "__main__":
    main()
