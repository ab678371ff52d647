"""Benchmark: cost of token-choice routing and packing, and of a full MoR training step.

Part 1 isolates the routing machinery of ``run_token_choice`` (router head, top-1, stable
partition, row permutations, padding reset, inverse permutation, gating, balancing loss)
by replacing every shared layer with the identity: forward + backward at d=256, seq 512,
Nr=3, batch 1 / 4 / 16 / 32. The cost should grow linearly with the batch (constant ms
per sequence). It is memory-bound on a CPU (a few row copies of the (B, T, C) state per
recursion), so on a machine shared with other jobs the process CPU time is the steadier
number; the wall time includes waiting for a core.

Part 2 times one forward + backward of the whole model at the ``small`` CPU scale for
recursive, expert-choice MoR and token-choice MoR (ratios to recursive).

    .venv/bin/python benchmarks/bench_token_choice.py [--repeats 15] [--threads 2] [--part routing]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from mor.config import ModelConfig, RouterConfig, ScaleShape, load_scales
from mor.cpu_allocator import tune_cpu_allocator
from mor.model.token_choice import run_token_choice
from mor.model.transformer import RoutingTrace, build_model

NR = 3


def timed(fn, repeats: int, warmup: int = 3) -> tuple[float, float]:
    """Median wall time and median process CPU time of fn(), in ms, after ``warmup`` calls.

    On a shared machine the wall time includes waiting for a core; the CPU time (all
    threads of this process) does not, so it shows the cost the code itself has.
    """
    for _ in range(warmup):
        fn()
    wall, cpu = [], []
    for _ in range(repeats):
        w0, c0 = time.perf_counter(), time.process_time()
        fn()
        wall.append((time.perf_counter() - w0) * 1e3)
        cpu.append((time.process_time() - c0) * 1e3)
    return statistics.median(wall), statistics.median(cpu)


def routing_model(hidden: int, seq: int):
    """Token-choice model whose shared layers are the identity; router spread over all depths."""
    shape = ScaleShape(name="bench", hidden=hidden, layers=NR, heads=4, kv_heads=2, mlp=4 * hidden, vocab=0,
                       max_seq_len=seq)
    cfg = ModelConfig(scale="bench", variant="mor", tying="cycle", num_recursions=NR,
                      router=RouterConfig(type="token_choice", func="softmax", alpha=1.0, balancing="loss"))
    torch.manual_seed(0)
    model = build_model(cfg, shape, vocab_size=64).train()
    with torch.no_grad():  # a random router at init picks one depth; spread it for a realistic load
        model.routers[0].head.weight.mul_(3.0 / model.routers[0].head.weight.std())
    model.run_layer = lambda layer_id, h, positions, recursion, kv=None, attn_mask=None: h
    return model


def bench_routing(repeats: int, hidden: int = 256, seq: int = 512, batches=(1, 4, 16, 32)) -> list[dict]:
    model = routing_model(hidden, seq)
    rows = []
    for B in batches:
        h = torch.randn(B, seq, hidden, requires_grad=True)
        positions = torch.arange(seq).expand(B, seq)  # (B, T)

        def step():
            trace = RoutingTrace()
            out, aux = run_token_choice(model, h, positions, trace)
            (out.float().sum() + aux).backward()  # sum: its backward materialises nothing
            h.grad = None
            model.zero_grad(set_to_none=True)
            return trace

        hist = torch.bincount(step().assignment.flatten(), minlength=NR).tolist()
        ms, cpu = timed(step, repeats)
        rows.append({"batch": B, "ms": ms, "cpu_ms": cpu, "depths": hist})
    for key in ("ms", "cpu_ms"):
        base = rows[0][key]
        for r in rows:
            r[f"{key}_ratio"] = r[key] / base
            r[f"{key}_per_seq_ratio"] = r[key] / r["batch"] / base
    return rows


def bench_full(repeats: int, batch: int = 16, seq: int = 128) -> list[dict]:
    shape = load_scales()["small"]
    vocab = 4096
    configs = {
        "recursive": ModelConfig(scale="small", variant="recursive", tying="middle_cycle", num_recursions=NR),
        "expert_choice": ModelConfig(scale="small", variant="mor", tying="middle_cycle", num_recursions=NR),
        "token_choice": ModelConfig(scale="small", variant="mor", tying="middle_cycle", num_recursions=NR,
                                    router=RouterConfig(type="token_choice", func="softmax", alpha=1.0)),
    }
    x = torch.randint(0, vocab, (batch, seq))
    rows = []
    for name, cfg in configs.items():
        torch.manual_seed(0)
        model = build_model(cfg, shape, vocab).train()
        if cfg.router.type == "token_choice":
            with torch.no_grad():
                model.routers[0].head.weight.mul_(3.0 / model.routers[0].head.weight.std())

        def step(model=model):
            model(x, x).loss.backward()
            model.zero_grad(set_to_none=True)

        ms, cpu = timed(step, repeats)
        rows.append({"model": name, "ms": ms, "cpu_ms": cpu})
    for r in rows:
        r["ratio"], r["cpu_ratio"] = r["ms"] / rows[0]["ms"], r["cpu_ms"] / rows[0]["cpu_ms"]
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch default)")
    ap.add_argument("--part", choices=["routing", "full", "all"], default="all")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    tuned = tune_cpu_allocator()  # as the train and eval jobs do (mor.jobs)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, median of {args.repeats}, "
          f"cpu allocator {'tuned' if tuned else 'default'}")
    if args.part in ("routing", "all"):
        print("\nrouting + packing only (shared layers = identity), fwd+bwd, d=256, seq=512, Nr=3")
        print("wall = elapsed ms; cpu = process CPU ms (all threads; no waiting for a busy core)")
        print(f"{'batch':>5} {'wall ms':>8} {'x b1':>6} {'/seq x':>7} {'cpu ms':>8} {'x b1':>6} {'/seq x':>7}"
              "  tokens per depth")
        for r in bench_routing(args.repeats):
            print(f"{r['batch']:>5} {r['ms']:>8.2f} {r['ms_ratio']:>6.2f} {r['ms_per_seq_ratio']:>7.2f} "
                  f"{r['cpu_ms']:>8.2f} {r['cpu_ms_ratio']:>6.2f} {r['cpu_ms_per_seq_ratio']:>7.2f}  {r['depths']}")
    if args.part in ("full", "all"):
        print("\nfull model fwd+bwd, scale 'small' (d=96, 6 layers), middle_cycle Nr=3, batch 16 x 128")
        print(f"{'model':>14} {'wall ms':>8} {'x rec':>6} {'cpu ms':>8} {'x rec':>6}")
        for r in bench_full(args.repeats):
            print(f"{r['model']:>14} {r['ms']:>8.2f} {r['ratio']:>6.2f} {r['cpu_ms']:>8.2f} {r['cpu_ratio']:>6.2f}")


if __name__ == "__main__":
    main()
