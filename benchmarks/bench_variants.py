"""Benchmark: training-step time of each MoR variant per FLOP, relative to Recursive.

At the ``small`` CPU scale (Middle-Cycle, Nr=3, batch 16 x 128) it times one forward +
backward of each variant and counts its FLOPs with ``torch.utils.flop_counter``. On CPU,
torch's SDPA runs ``aten._scaled_dot_product_flash_attention_for_cpu``, which the counter
does not know, so its formula (the same as the CUDA flash kernel's) is registered below.

    cost ratio = (t_variant / t_recursive) / (flops_variant / flops_recursive)

A ratio <= 1.0 means the variant spends no more time per FLOP than the Recursive model of
the same Nr: its routing, gathering and masking overhead is paid for by the compute it
skips. It also reports whether recursive KV sharing is cheaper per step than
recursion-wise caching. Timings on a shared machine are noisy: read the ratios, which are
measured in one process, interleaved, median of ``--repeats``.

    .venv/bin/python benchmarks/bench_variants.py [--repeats 9] [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch.utils.flop_counter import FlopCounterMode, register_flop_formula, sdpa_backward_flop_count, sdpa_flop_count

from mor.config import ModelConfig, RouterConfig, load_scales
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=128)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    shape = load_scales()["small"]
    torch.manual_seed(0)
    x = torch.randint(0, 4096, (a.batch, a.seq))
    steps, flops = {}, {}
    for name, cfg in variants().items():
        model = build_model(cfg, shape, 4096).train()
        steps[name] = step_fn(model, x)
        flops[name] = count_flops(steps[name])
        for _ in range(2):  # warm-up
            steps[name]()
    wall: dict[str, list[float]] = {name: [] for name in steps}
    cpu: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(a.repeats):  # interleaved, so machine noise hits every variant alike
        for name, step in steps.items():
            t, c = time.perf_counter(), time.process_time()
            step()
            wall[name].append((time.perf_counter() - t) * 1e3)
            cpu[name].append((time.process_time() - c) * 1e3)
    med = {n: statistics.median(v) for n, v in wall.items()}
    cmed = {n: statistics.median(v) for n, v in cpu.items()}
    ref = "recursive"
    print(f"small scale, Middle-Cycle Nr=3, batch {a.batch} x {a.seq}, {a.threads} thread(s), median of {a.repeats}")
    print("cost ratio = (time / recursive time) / (FLOPs / recursive FLOPs); wall and process-CPU time")
    print(f"{'variant':26s} {'ms/step':>8s} {'GFLOP':>7s} {'FLOP x':>7s} {'wall x':>7s} {'cost':>6s} {'cpu x':>7s} {'cost':>6s}")
    for n in steps:
        fr = flops[n] / flops[ref]
        tr, cr = med[n] / med[ref], cmed[n] / cmed[ref]
        print(f"{n:26s} {med[n]:8.1f} {flops[n] / 1e9:7.2f} {fr:7.3f} {tr:7.3f} {tr / fr:6.3f} {cr:7.3f} {cr / fr:6.3f}")
    for router in ("MoR-EC", "MoR-TC"):
        rw, sh = med[f"{router} recursion-wise"], med[f"{router} kv=shared"]
        print(f"{router}: kv=shared step / recursion-wise step = {sh / rw:.3f} ({'cheaper' if sh < rw else 'NOT cheaper'})")


if __name__ == "__main__":
    main()
