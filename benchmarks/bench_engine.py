"""Benchmark: decoding throughput of MoR relative to Vanilla through the engine, measured vs
FLOPs-predicted, in one process.

Models (random weights, fp32, CPU): Vanilla, MoR-2/3/4 Middle-Cycle expert-choice with
recursion-wise caching, and the Vanilla of MoR-4's effective depth (App. E's 34-layer
baseline; here 10 layers), at the ``engine`` CPU scale (grids/scales.yaml: d=512, 8
layers; a 32-token step is compute-bound there, where ``small`` / ``medium`` are bound by
the Python per stage). The request set follows workflows/throughput.yaml's local protocol.

Untrained routers do not keep the capacities trained ones learn, so the causal decision is
steered to the design capacities: every router's logit is shifted by a per-recursion
constant so that the share of tokens continuing is c_r / c_{r-1} on a calibration batch
(a bias on the router head, added here only). The FLOPs-predicted ratio is
``mor.flops.decode_flops_per_token`` (vanilla / model) for the capacities the engine
actually realised (counted from its per-stage rows), beside the design-capacity ratio.

Rounds: every round runs each model once in a shuffled order at the fixed batch (32) and
at the relative maximum batch (mor.flops.max_batch in the protocol's stated memory); each
ratio is taken within its round, the table gives medians.

    .venv/bin/python benchmarks/bench_engine.py [--rounds 3] [--threads 1] [--scale engine]

On a GPU, App. E's own setting (360M, bf16, the cluster protocol, the device's memory):

    .venv/bin/python benchmarks/bench_engine.py --scale 360M --protocol cluster --device cuda \
        --dtype bfloat16 --memory-gib 0 --requests 256 --rounds 1
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import statistics

import torch

from mor.config import ModelConfig, RouterConfig, capacities, load_scales
from mor.cpu_allocator import tune_cpu_allocator
from mor.engine import Engine, Request
from mor.engine.job import baseline, load_protocol
from mor.flops import decode_flops_per_token, max_batch, relative_max_batch_exact
from mor.model.transformer import build_model

V = 4096


def configs(scale: str) -> dict[str, ModelConfig]:
    router = RouterConfig(type="expert_choice", func="sigmoid", alpha=0.1, arch="linear", aux="aux_loss")
    out = {"Vanilla": ModelConfig(scale=scale, variant="vanilla")}
    for nr in (2, 3, 4):
        out[f"MoR-{nr}"] = ModelConfig(scale=scale, variant="mor", tying="middle_cycle", num_recursions=nr, router=router)
    deep = baseline(out["MoR-4"])
    if deep != out["Vanilla"]:
        out["Vanilla (MoR-4 depth)"] = deep
    return out


def steer_routers(model, calib: torch.Tensor) -> None:
    """Give each expert-choice router head a bias so that its causal decision keeps the design
    share of the tokens that reach it (a calibration forward per recursion)."""
    if not model.routers:
        return
    caps = capacities(model.cfg.num_recursions, model.cfg.router.capacity)
    with torch.no_grad():
        h = model.embed_tokens(calib)  # (B, T, C)
        pos = torch.arange(calib.shape[1]).expand_as(calib)
        for layer_id in model.plan.prefix:
            h = model.run_layer(layer_id, h, pos, None)
        keep = torch.ones(calib.shape, dtype=torch.bool)
        for r, router in enumerate(model.routers):
            lin = router.head
            logits = lin(h).squeeze(-1)[keep]  # (N,) logits of the tokens that reach r
            share = caps[r] / (caps[r - 1] if r else 1.0)
            if share < 1:
                thr = torch.quantile(logits, 1 - share)
                bias = torch.nn.Linear(lin.in_features, 1)
                bias.weight.copy_(lin.weight)
                bias.bias.fill_(-float(thr))
                router.head = bias
            keep = keep & (router.head(h).squeeze(-1) > 0) if share < 1 else keep
            for layer_id in model.plan.recursions[r]:
                h = model.run_layer(layer_id, h, pos, r)


def realised_capacity(res, nr: int) -> tuple[float, ...]:
    """Share of the tokens that ran each recursion in an engine run (its per-stage counts)."""
    ran = [0] * nr
    for stage, n in zip(res.stages, res.ran):
        if stage.startswith("depth"):
            ran[int(stage[5:])] += n
    return tuple(c / ran[0] for c in ran)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--scale", default="engine")
    ap.add_argument("--requests", type=int, default=0, help="override the protocol's request count")
    ap.add_argument("--protocol", default="local", help="section of workflows/throughput.yaml")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--memory-gib", type=float, default=0.5,
                    help="memory the maximum batches fill (the protocol's 0.05 GiB is sized for `medium`; the "
                         "engine scale's fp32 parameters alone take 0.1 GiB); 0 = the GPU's memory")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    tune_cpu_allocator()
    p = load_protocol(a.protocol)
    dev, dtype = torch.device(a.device), getattr(torch, a.dtype)
    elem = torch.tensor([], dtype=dtype).element_size()
    if a.requests:
        p["requests"] = a.requests
    shapes = load_scales()
    global V
    V = shapes[a.scale].vocab or V  # the paper scales' SmolLM vocabulary; CPU scales: 4096
    cfgs = configs(a.scale)
    rnd = random.Random(p["seed"])
    reqs = [Request(i, [rnd.randrange(V)], max(1, min(p["gen_max"], round(rnd.gauss(p["gen_mean"], p["gen_std"])))))
            for i in range(p["requests"])]
    max_len = p["gen_max"] + 1
    memory = a.memory_gib * 2**30 if a.memory_gib else torch.cuda.get_device_properties(dev).total_memory
    torch.manual_seed(0)
    calib = torch.randint(0, V, (8, 64))
    models, batches, predicted = {}, {}, {}
    for name, cfg in cfgs.items():
        s = dataclasses.replace(shapes[cfg.scale], layers=cfg.layers or shapes[cfg.scale].layers)
        torch.manual_seed(0)
        m = build_model(cfg, s, V).eval()
        steer_routers(m, calib)
        m.to(device=dev, dtype=dtype)
        models[name] = m
        van = baseline(cfg)
        vs = dataclasses.replace(shapes[van.scale], layers=van.layers or shapes[van.scale].layers)
        batches[name] = {"fixed": p["fixed_batch"],
                         "max": max(1, int(relative_max_batch_exact(cfg, van, s, V, max_len, memory, p["base_batch"], elem)))}
        predicted[name] = decode_flops_per_token(van, vs, V, p["gen_mean"] / 2) / decode_flops_per_token(cfg, s, V, p["gen_mean"] / 2)
        print(f"{name}: max batch {max_batch(cfg, s, V, max_len, memory, elem)}, relative max batch {batches[name]['max']}, "
              f"FLOPs-predicted speedup (design capacities) {predicted[name]:.3f}")
    base_of = {name: ("Vanilla (MoR-4 depth)" if baseline(cfg) != cfgs["Vanilla"] else "Vanilla") for name, cfg in cfgs.items()}
    tps = {(n, k): [] for n in cfgs for k in ("fixed", "max")}
    fwd = {(n, k): [] for n in cfgs for k in ("fixed", "max")}
    real: dict[str, tuple] = {}
    order = list(cfgs)
    for rd in range(a.rounds):
        rnd.shuffle(order)
        for name in order:
            for k in ("fixed", "max"):
                eng = Engine(models[name], capacity=batches[name][k], max_len=max_len, device=dev, dtype=dtype)
                eng.run([Request(-1 - i, [1], p["warmup_tokens"]) for i in range(batches[name][k])])  # warm-up
                res = eng.run(reqs)
                tps[name, k].append(res.tokens / res.wall_s)
                fwd[name, k].append(res.tokens / res.forward_s)
                if k == "fixed":
                    real[name] = realised_capacity(res, cfgs[name].num_recursions)
        print(f"round {rd + 1}/{a.rounds} done")
    print()
    print(f"scale {a.scale}, {p['requests']} requests, gen ~ N({p['gen_mean']}, {p['gen_std']}), {a.threads} thread(s), {a.device} {a.dtype}")
    print("model                  setting  batch  tok/s(fwd)  measured(fwd)  measured(wall)  predicted(realised)  "
          "predicted(design)  measured/predicted")
    for name, cfg in cfgs.items():
        van = baseline(cfg)
        vs = dataclasses.replace(shapes[van.scale], layers=van.layers or shapes[van.scale].layers)
        s = dataclasses.replace(shapes[cfg.scale], layers=cfg.layers or shapes[cfg.scale].layers)
        rc = dataclasses.replace(cfg, router=dataclasses.replace(cfg.router, capacity=real[name])) if cfg.variant == "mor" else cfg
        pred_real = decode_flops_per_token(van, vs, V, p["gen_mean"] / 2) / decode_flops_per_token(rc, s, V, p["gen_mean"] / 2)
        b = base_of[name]
        for k in ("fixed", "max"):
            rel = statistics.median(f / g for f, g in zip(fwd[name, k], fwd[b, k]))
            rel_wall = statistics.median(f / g for f, g in zip(tps[name, k], tps[b, k]))
            print(f"{name:22s} {k:7s}  {batches[name][k]:5d}  {statistics.median(fwd[name, k]):10.0f}  {rel:13.3f}  "
                  f"{rel_wall:14.3f}  {pred_real:19.3f}  {predicted[name]:17.3f}  {rel / pred_real:18.3f}")
        if cfg.variant == "mor":
            print(f"{'':22s} realised capacities {tuple(round(c, 3) for c in real[name])}")


if __name__ == "__main__":
    main()
