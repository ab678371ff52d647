"""Benchmark: training-step time of each MoR variant per FLOP, relative to Recursive.

At the ``small`` CPU scale (Middle-Cycle, Nr=3, batch 16 x 128) it times one forward +
backward of each variant and counts its FLOPs with ``torch.utils.flop_counter``. On CPU,
torch's SDPA runs ``aten._scaled_dot_product_flash_attention_for_cpu``, which the counter
does not know, so its formula (the same as the CUDA flash kernel's) is registered below.

    cost ratio = (t_variant / t_recursive) / (flops_variant / flops_recursive)

A ratio <= 1.0 means the variant spends no more time per FLOP than the Recursive model of
the same Nr: its routing, gathering and masking overhead is paid for by the compute it
skips. It also reports whether KV sharing is cheaper per step than recursion-wise caching,
for the Recursive model and for each router.

The machine this runs on is shared and noisy, so every round times each variant once, in
turn, and each ratio is taken within its round (the noise of a round hits all variants
alike); the table gives the median and quartiles of those per-round ratios. The process
uses the tuned CPU allocator the training jobs use (``mor.cpu_allocator``); without it,
page faults of the 32 MiB logits dominate every variant's step alike.

    .venv/bin/python benchmarks/bench_variants.py [--repeats 15] [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch.utils.flop_counter import FlopCounterMode, register_flop_formula, sdpa_backward_flop_count, sdpa_flop_count

from mor.config import ModelConfig, RouterConfig, load_scales
from mor.cpu_allocator import tune_cpu_allocator
from mor.model.transformer import build_model

aten = torch.ops.aten


@register_flop_formula(aten._scaled_dot_product_flash_attention_for_cpu, get_raw=True)
def _sdpa_cpu_flop(query, key, value, *args, out_val=None, **kwargs) -> int:
    return sdpa_flop_count(query.shape, key.shape, value.shape)


@register_flop_formula(aten._scaled_dot_product_flash_attention_for_cpu_backward, get_raw=True)
def _sdpa_cpu_backward_flop(grad_out, query, key, value, *args, out_val=None, **kwargs) -> int:
    return sdpa_backward_flop_count(grad_out.shape, query.shape, key.shape, value.shape)


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


def count_flops(step) -> int:
    with FlopCounterMode(display=False) as counter:
        step()
    return counter.get_total_flops()


def quartiles(values: list[float]) -> tuple[float, float, float]:
    q1, q2, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, q2, q3


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
        model = build_model(cfg, shape, 4096).train()
        steps[name] = step_fn(model, x)
        flops[name] = count_flops(steps[name])
        for _ in range(3):  # warm-up (also lets the heap reach its steady state)
            steps[name]()
    wall: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(a.repeats):  # interleaved rounds: machine noise hits every variant of a round alike
        for name, step in steps.items():
            t = time.perf_counter()
            step()
            wall[name].append((time.perf_counter() - t) * 1e3)
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
    print("KV sharing vs recursion-wise caching, per-round step-time ratio (median, q1-q3):")
    for plain, shared in (("recursive", "recursive kv=shared"), ("MoR-EC recursion-wise", "MoR-EC kv=shared"),
                          ("MoR-TC recursion-wise", "MoR-TC kv=shared")):
        q1, med, q3 = quartiles([s / r for s, r in zip(wall[shared], wall[plain])])
        print(f"  {shared:24s} / {plain:22s} = {med:.3f} ({q1:.3f}-{q3:.3f}) "
              f"{'cheaper' if q3 < 1.0 else 'not cheaper' if q1 > 1.0 else 'within noise'}")


if __name__ == "__main__":
    main()
