"""Benchmark: masked attention (KV sharing, prefix) through FlexAttention vs the chunked SDPA path, on CPU.

Issue 60 moved masked training attention to FlexAttention where torch provides it
(``mor.model.flex``). This prints, from one process, the CPU time of each path at the
``small`` scale (MoR expert-choice, Middle-Cycle, Nr=3, KV shared; and the Recursive model
with a prefix relaxation), as ratios within a round:

    train  one training step (forward, backward, AdamW) under execution.attention 'auto'
           (the default: on CPU the chunked SDPA path) vs 'sdpa' (the path before issue 60).
           FlexAttention itself cannot train on CPU: torch 2.13 has no CPU backward for it.
    eval   one forward without autograd under 'flex' (FlexAttention's CPU forward, eager)
           vs 'sdpa': what FlexAttention would cost on this device.

Every round times each arm once, in alternating order, after a warm-up; each ratio is taken
within its round (noise hits both arms alike); the table gives the min and median over rounds
of the per-step CPU time (``time.process_time``, 1 thread) and of the ratio. The process uses
the tuned CPU allocator the training jobs use. CUDA is measured by benchmarks/device_check.py.

    .venv/bin/python benchmarks/bench_flex_attention.py [--repeats 7] [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

import torch

from mor.config import ModelConfig, RouterConfig, load_scales
from mor.cpu_allocator import tune_cpu_allocator
from mor.model import layers
from mor.model.transformer import build_model
from mor.train.execution import apply_execution


def configs() -> dict[str, ModelConfig]:
    base = dict(scale="small", tying="middle_cycle", num_recursions=3)
    return {
        "MoR-EC kv=shared": ModelConfig(variant="mor", kv="shared", router=RouterConfig(type="expert_choice"), **base),
        "Recursive prefix=8": ModelConfig(variant="recursive", relaxation="prefix", relaxation_rank=8, **base),
    }


def count_paths() -> dict[str, int]:
    """Masked attention calls per path, counted from here on (proves which path each arm took)."""
    calls = {"flex": 0, "sdpa": 0}
    flex, sdpa = layers.flex_masked_attention, layers.masked_attention

    def on_flex(*a):
        calls["flex"] += 1
        return flex(*a)

    def on_sdpa(*a):
        calls["sdpa"] += 1
        return sdpa(*a)

    layers.flex_masked_attention, layers.masked_attention = on_flex, on_sdpa
    return calls


def timed(fn) -> float:
    t0 = time.process_time()
    fn()
    return time.process_time() - t0


def measure(cfg: ModelConfig, batch: int, seq: int, mode: str, arms: tuple[str, str], repeats: int, calls):
    shape = load_scales()["small"]
    torch.manual_seed(0)
    model = build_model(cfg, shape, 512)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randint(0, 512, (batch, seq), generator=torch.Generator().manual_seed(0))

    def train():
        opt.zero_grad(set_to_none=True)
        model(x, x).loss.backward()
        opt.step()

    def evaluate():
        with torch.no_grad():
            model(x, x)

    step = train if mode == "train" else evaluate
    times: dict[str, list[float]] = {a: [] for a in arms}
    ratios = []
    for r in range(repeats + 1):  # round 0: warm-up
        order = arms if r % 2 else arms[::-1]
        got = {}
        for arm in order:
            apply_execution(model, attention=arm)
            got[arm] = timed(step)
        if r:
            for arm in arms:
                times[arm].append(got[arm])
            ratios.append(got[arms[1]] / got[arms[0]])
    before = dict(calls)
    apply_execution(model, attention=arms[1])
    step()
    took = {p: calls[p] - before[p] for p in calls}
    return times, ratios, took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    tune_cpu_allocator()
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", message=".*flex_attention.*")  # eager FlexAttention's advice to compile
    calls = count_paths()
    print(f"torch {torch.__version__}, {args.threads} thread(s), {args.repeats} rounds; CPU ms per step, min / median")
    print("| model | batch x seq | step | before | after | ms before | ms after | ratio after/before | masked calls of 'after' |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, cfg in configs().items():
        for batch, seq in ((16, 128), (4, 512)):
            for mode, arms in (("train", ("sdpa", "auto")), ("eval", ("sdpa", "flex"))):
                times, ratios, took = measure(cfg, batch, seq, mode, arms, args.repeats, calls)
                ms = {a: f"{min(t) * 1e3:.0f} / {statistics.median(t) * 1e3:.0f}" for a, t in times.items()}
                print(f"| {name} | {batch} x {seq} | {mode} | {arms[0]} | {arms[1]} | {ms[arms[0]]} | {ms[arms[1]]} | "
                      f"{min(ratios):.2f} / {statistics.median(ratios):.2f} | flex {took['flex']}, sdpa {took['sdpa']} |",
                      flush=True)


if __name__ == "__main__":
    main()
