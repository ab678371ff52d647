"""Device check: every model variant trains on this device, in its precision, at a real scale.

What CPU tests cannot show: the flash-attn path, bf16 autocast, and the custom autograd
Functions of the routers on a GPU. For each variant (vanilla, Recursive, MoR expert- and
token-choice under each KV strategy) it runs ``--steps`` training steps (forward + backward
+ AdamW) at ``--scale`` under autocast and reports loss, tokens/s, peak memory and how many
attention calls went to flash-attn. Two equivalence checks run on the device in fp32:

  * the same ``tiny`` model's logits and loss on the device and on the CPU (every variant);
  * chunked masked attention (``mor.model.layers.masked_attention``) against one SDPA call.

    python benchmarks/device_check.py                       # cuda if present, 135M, bf16
    python benchmarks/device_check.py --device cpu --scale tiny --seq 64 --batch 2 --dtype float32

Memory: each run reports the peak ``torch.cuda.max_memory_allocated`` next to the memory
model's (``mor.memory.training_memory``, one GPU, the run's dtype, checkpointing and loss
chunk) and their ratio. ``--fit`` adds, per variant, a run at the micro-batch the memory
model picks for this GPU (largest divisor of ``--fit-batch`` sequences that fits); a run that
runs out of memory is reported as such, not fatal. The paper's setting and the presets' are

    python benchmarks/device_check.py --scale 360M --batch 16 --fit            # plain path
    python benchmarks/device_check.py --scale 360M --batch 16 --fit --loss-chunk 4096 --checkpointing

Writes ``device_check.json`` into ``$OUT`` (or ``--out``) when given. Exit status 1 when a
loss is not finite or an equivalence check fails.

Decoding engine (``--engine``, or ``--engine-only``): flash-attn's paged
``flash_attn_with_kvcache`` against SDPA over the gathered blocks (bf16), the engine against
``decode.generate`` (graphs on and off), and App. E's protocol at ``--engine-scale`` (360M):
MoR-2/3/4 and their same-depth Vanillas at 32 rows per pass (graphs on and off) and at the
relative maximum batch, printing passes per token against Σc/B, fill and tokens/s in the
waiting window, and the speed-up over the same-depth Vanilla (paper: up to ~2x; relative
maximum batch 42/48/51). Install first, on the GPU machine (CUDA 12 wheels):

    pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cu126   # a CUDA torch
    pip install flash-attn --no-build-isolation   # a wheel built for that torch and CUDA (paged KV)

then, one prepared command (sized for < 8 min on one H200: 96 requests of ~256 tokens,
5 models x 3 settings):

    python benchmarks/device_check.py --engine-only --out "$OUT"

``benchmarks/bench_engine.py --scale 360M --protocol cluster --device cuda --dtype bfloat16
--memory-gib 0 --requests 256 --rounds 1`` measures the same with more requests and rounds.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from mor.config import ExecConfig, ModelConfig, RouterConfig, RunConfig, TrainConfig, load_scales
from mor.memory import GiB, pick_micro_batch, training_memory
from mor.model import layers
from mor.model.transformer import build_model

VOCAB = 49152  # the SmolLM vocabulary of the paper's scales


def variants() -> dict[str, ModelConfig]:
    base = dict(tying="middle_cycle", num_recursions=3)
    ec = RouterConfig(type="expert_choice")
    tc = RouterConfig(type="token_choice", func="softmax", alpha=1.0)
    out = {"vanilla": {}, "recursive": dict(variant="recursive", **base)}
    for kv in ("recursion_wise", "shared", "shared_dagger"):
        out[f"mor-ec {kv}"] = dict(variant="mor", router=ec, kv=kv, **base)
        out[f"mor-tc {kv}"] = dict(variant="mor", router=tc, kv=kv, **base)
    return out


FLASH_CALLS = [0]  # attention calls that went to flash-attn (counted once installed)


def count_flash_calls() -> None:
    """Route flash-attn (when installed) through a counter; call once per process."""
    inner = layers._flash_attn_func
    if inner is None or getattr(inner, "counted", False):
        return

    def counted(*args, **kwargs):
        FLASH_CALLS[0] += 1
        return inner(*args, **kwargs)

    counted.counted = True
    layers._flash_attn_func = counted


def modelled_gib(cfg: ModelConfig, a, batch: int) -> float:
    """The memory model's peak for this run on one GPU."""
    shape = load_scales()[a.scale]
    est = training_memory(cfg, shape, shape.vocab or VOCAB, a.seq, batch, "fp32" if a.dtype == "float32" else "bf16",
                          checkpointing=a.checkpointing, loss_chunk=a.loss_chunk)
    return est.total / GiB


def fitted_batch(cfg: ModelConfig, a, device: torch.device) -> int:
    """The micro-batch the memory model fits into this device's memory (``--fit-batch`` sequences a step)."""
    memory = torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" else a.cpu_memory_gib * GiB
    run = RunConfig(grid="device-check", model=cfg, train=TrainConfig(tokens=a.fit_batch * a.seq, seq_len=a.seq,
                                                                      global_batch=a.fit_batch, micro_batch=a.fit_batch))
    execution = ExecConfig(activation_checkpointing=a.checkpointing, loss_chunk=a.loss_chunk)
    return pick_micro_batch(run, VOCAB, memory, execution=execution,
                            dtype="fp32" if a.dtype == "float32" else "bf16").micro_batch


def train_variant(name: str, kw: dict, a, device: torch.device, dtype, batch: int | None = None) -> dict:
    """``a.steps`` optimizer steps at ``a.scale``; loss, speed and memory of the last ones."""
    shape = load_scales()[a.scale]
    vocab = VOCAB if shape.vocab == 0 else shape.vocab
    batch = batch or a.batch
    cfg = ModelConfig(scale=a.scale, **kw)
    try:
        return _train(name, cfg, shape, vocab, a, device, dtype, batch)
    except torch.cuda.OutOfMemoryError:
        torch.cuda.empty_cache()
        return {"variant": name, "batch": batch, "oom": True, "finite": True, "loss": float("nan"),
                "tokens_per_s": 0.0, "peak_mem_gib": None, "model_mem_gib": modelled_gib(cfg, a, batch),
                "flash_calls": 0, "params": None}


def _train(name, cfg, shape, vocab, a, device, dtype, batch) -> dict:
    torch.manual_seed(0)
    model = build_model(cfg, shape, vocab, device=device).train()
    from mor.train.execution import apply_execution  # how it trains: mor.train.execution
    apply_execution(model, "auto", a.checkpointing, a.loss_chunk)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")
    x = torch.randint(0, vocab, (batch, a.seq), device=device)
    FLASH_CALLS[0] = 0
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    losses, times = [], []
    for _ in range(a.steps):
        t0 = time.perf_counter()
        with torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
            loss = model(x, x).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        model.after_optimizer_step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
    steady = times[1:] or times  # the first step includes allocation and kernel selection
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
    modelled = modelled_gib(cfg, a, batch)
    del model, opt
    return {
        "variant": name, "batch": batch, "oom": False, "loss": losses[-1],
        "finite": all(math.isfinite(v) for v in losses), "tokens_per_s": batch * a.seq / (sum(steady) / len(steady)),
        "peak_mem_gib": peak, "model_mem_gib": modelled, "model_over_measured": modelled / peak if peak else None,
        "flash_calls": FLASH_CALLS[0], "params": sum(p.numel() for p in build_params(cfg, shape, vocab)),
    }


def build_params(cfg, shape, vocab):
    """The model's parameters on the meta device (a count without memory)."""
    return build_model(cfg, shape, vocab, device="meta").parameters()


def device_matches_cpu(kw: dict, device: torch.device) -> float:
    """Max |logit difference| of one tiny model in fp32 on the device and on the CPU."""
    shape = load_scales()["tiny"]
    torch.manual_seed(0)
    cpu = build_model(ModelConfig(scale="tiny", **kw), shape, 64).eval()
    dev = build_model(ModelConfig(scale="tiny", **kw), shape, 64, device=device).eval()
    dev.load_state_dict(cpu.state_dict())
    x = torch.randint(0, 64, (2, 48), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        return (dev(x.to(device), x.to(device)).logits.cpu() - cpu(x, x).logits).abs().max().item()


def chunked_attention_error(device: torch.device) -> float:
    """Max |difference| of chunked masked attention and one SDPA call (staircase mask, fp32)."""
    g = torch.Generator().manual_seed(0)
    B, H, Hkv, hd, S, k = 2, 4, 2, 16, 300, 150
    pos = torch.rand(B, S, generator=g).topk(k, dim=1).indices.sort(1).values
    mask = (torch.arange(S) <= pos.unsqueeze(-1)).unsqueeze(1).to(device)  # (B, 1, k, S)
    q, kk, v = (torch.randn(B, h, n, hd, generator=g).to(device) for h, n in ((H, k), (Hkv, S), (Hkv, S)))
    ref = F.scaled_dot_product_attention(q, kk, v, attn_mask=mask, enable_gqa=True)
    return (layers.masked_attention(q, kk, v, mask, gqa=True) - ref).abs().max().item()


# ------------------------------------------------------------------ the decoding engine (App. E)
def paged_attention_error(device: torch.device) -> float | None:
    """flash-attn's paged ``flash_attn_with_kvcache`` against SDPA over the gathered blocks, in
    bf16 on the device (None where flash-attn is not installed or the device is no GPU)."""
    from mor.engine import cache as kvc

    if not kvc.flash_paged(device):
        return None
    torch.manual_seed(0)
    n, H, Hkv, hd, bs, nb = 6, 8, 2, 64, kvc.FLASH_PAGE, 12
    pool = kvc.PagedCache(nb, bs, Hkv, hd, torch.bfloat16, device)
    pool.k.normal_()
    pool.v.normal_()
    table = torch.randperm(nb, device=device)[: n * 2].view(n, 2).to(torch.int32)  # (n, 2) blocks per row
    lengths = torch.tensor([1, 17, 256, 300, 511, 512], device=device, dtype=torch.int32)
    q = torch.randn(n, H, 1, hd, device=device, dtype=torch.bfloat16)
    view = kvc.PagedView(pool, table, lengths)
    fast = view.attend(q)
    flash, kvc._flash_with_kvcache = kvc._flash_with_kvcache, None
    try:
        ref = view.attend(q)  # the SDPA fallback over the same blocks
    finally:
        kvc._flash_with_kvcache = flash
    return (fast.float() - ref.float()).abs().max().item()


def engine_matches_decode(device: torch.device) -> dict[str, bool]:
    """The engine's greedy tokens equal decode.generate's on the device (tiny models, fp32, a
    mixed queue; graphs on and off)."""
    from mor.engine import Engine, Request
    from mor.model.decode import generate

    out = {}
    for name, kw in {"mor-ec": dict(variant="mor", tying="middle_cycle", num_recursions=3,
                                    router=RouterConfig(aux="aux_router")),
                     "mor-tc": dict(variant="mor", tying="middle_cycle", num_recursions=3,
                                    router=RouterConfig(type="token_choice", func="softmax", alpha=1.0)),
                     "vanilla": {}}.items():
        torch.manual_seed(0)
        model = build_model(ModelConfig(scale="tiny", **kw), load_scales()["tiny"], 50).eval().to(device)
        reqs = [Request(i, [(3 * i + j) % 50 for j in range(1 + i % 4)], 3 + i % 6) for i in range(9)]
        want = {r.id: generate(model, torch.tensor([r.prompt], device=device), r.max_new_tokens)[0, len(r.prompt):].tolist()
                for r in reqs}
        for graphs in (False, True):
            got = Engine(model, batch=3, max_len=16, dtype=torch.float32, graphs=graphs).run(reqs).outputs
            out[f"{name} graphs={graphs}"] = got == want
    return out


def engine_protocol(a, device: torch.device) -> list[dict]:
    """App. E's protocol at ``--engine-scale``: MoR-2/3/4 Middle-Cycle (routers steered to their
    design shares, bench_engine.steer_routers) and the same-depth Vanillas, in bf16, live
    sequences admitted by the GPU's memory (flops.max_batch, paged blocks), at 32 rows per pass
    and at the relative maximum batch, graphs on (and off at 32 rows): passes per token, fill
    and tokens/s in the waiting window, and tokens/s over the same-depth Vanilla's."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import bench_engine as be

    from mor.engine import Engine, Request
    from mor.flops import relative_max_batch_exact
    from mor.throughput_protocol import baseline, load_protocol

    p = load_protocol(a.engine_protocol)
    be.V = load_scales()[a.engine_scale].vocab or be.V
    dtype = getattr(torch, a.dtype)
    # the memory the engine may fill: most of what is free now (the pool is really allocated)
    memory = 0.8 * torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else a.cpu_memory_gib * 2**30
    max_len = p["gen_max"]  # one prompt token + gen_max - 1 fed tokens
    reqs = be.make_requests(p, a.engine_requests, p["seed"])
    calib = torch.randint(0, be.V, (8, 64), generator=torch.Generator().manual_seed(0))
    cfgs = be.configs(a.engine_scale)
    allc = dict(cfgs)
    for c in cfgs.values():
        van = baseline(c)
        allc[f"Vanilla-{van.layers or be.shape_of(van).layers}"] = van
    rows, speed = [], {}
    for name, cfg in allc.items():
        m = be.build(cfg, calib, device, dtype)  # built and steered on the CPU, then moved
        van = baseline(cfg)
        rel = 32.0 if cfg.variant == "vanilla" else relative_max_batch_exact(
            cfg, van, be.shape_of(cfg), be.V, max_len, memory, 32, torch.tensor([], dtype=dtype).element_size())
        for batch, graphs in ((32, True), (32, False), (max(1, int(rel)), True)):
            if graphs is False and device.type != "cuda":
                continue
            eng = Engine(m, batch=batch, max_len=max_len, device=device, dtype=dtype, memory_bytes=memory, graphs=graphs)
            eng.run([Request(-1 - i, [1], p["warmup_tokens"]) for i in range(batch)])
            res = eng.run(reqs)
            w = res.window(True)
            caps = be.realised(res)
            row = {"model": name, "batch": batch, "graphs": graphs, "max_live": res.max_live,
                   "passes_per_token": w["passes_per_token"], "bound": sum(caps) / batch, "fill": w["row_fill"],
                   "tokens_per_s": w["tokens_per_s"], "tokens_per_s_run": res.tokens / res.forward_s,
                   "preempted": len(res.preempted), "relative_max_batch": rel}
            speed[name, batch if batch == 32 else "max", graphs] = row["tokens_per_s"] or row["tokens_per_s_run"]
            rows.append(row)
            print(f"{name:11s} b={batch:3d} graphs={graphs!s:5s} live {row['max_live']:5d} passes/token "
                  f"{row['passes_per_token']:.4f} (Σc/B {row['bound']:.4f}) fill {row['fill']:.3f} "
                  f"tok/s {row['tokens_per_s']:.0f} (run {row['tokens_per_s_run']:.0f}) preempted {row['preempted']}", flush=True)
            del eng, res
            if device.type == "cuda":
                torch.cuda.empty_cache()  # one engine's KV pool at a time
        del m
    for row in rows:
        cfg = allc[row["model"]]
        van = baseline(cfg)
        vname = f"Vanilla-{van.layers or be.shape_of(van).layers}"
        key = 32 if row["batch"] == 32 else "max"
        base = speed.get((vname, 32, row["graphs"]))  # Vanilla's maximum batch is the base batch (32)
        row["vs_vanilla"] = speed[row["model"], key, row["graphs"]] / base if base else None
    print("speed-up over the same-depth Vanilla (paper: up to ~2x; relative maximum batch 42/48/51):")
    for row in rows:
        if not row["model"].startswith("Vanilla"):
            print(f"  {row['model']} b={row['batch']} graphs={row['graphs']}: {row['vs_vanilla']:.3f}x "
                  f"(relative maximum batch {row['relative_max_batch']:.1f})")
    return rows


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--scale", default="135M")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--only", nargs="*", help="variant names to run (default: all)")
    ap.add_argument("--checkpointing", action="store_true", help="activation checkpointing per layer call")
    ap.add_argument("--loss-chunk", type=int, default=0, help="tokens per cross-entropy chunk (0 = all at once)")
    ap.add_argument("--fit", action="store_true", help="also run each variant at the memory model's micro-batch")
    ap.add_argument("--fit-batch", type=int, default=128, help="sequences per GPU and step that --fit divides")
    ap.add_argument("--cpu-memory-gib", type=float, default=2.0, help="--fit on CPU: the memory to fit into")
    ap.add_argument("--out", default=os.environ.get("OUT"), help="folder for device_check.json")
    ap.add_argument("--engine", action="store_true", help="also check the decoding engine (App. E; see the docstring)")
    ap.add_argument("--engine-only", action="store_true", help="the engine checks alone (no training variants)")
    ap.add_argument("--engine-scale", default="360M")
    ap.add_argument("--engine-protocol", default="cluster", help="section of workflows/config/throughput.yaml")
    ap.add_argument("--engine-requests", type=int, default=96)
    a = ap.parse_args(argv)
    device, dtype = torch.device(a.device), getattr(torch, a.dtype)
    count_flash_calls()
    chosen = {n: kw for n, kw in variants().items() if (not a.only or n in a.only) and not a.engine_only}
    report = {"device": str(device), "name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "torch": torch.__version__, "flash_attn": layers.flash_available(), "dtype": a.dtype,
              "scale": a.scale, "batch": a.batch, "seq": a.seq, "checkpointing": a.checkpointing,
              "loss_chunk": a.loss_chunk, "runs": [], "checks": {}}
    report["checks"]["chunked_attention_max_err"] = chunked_attention_error(device)
    print(f"{'variant':24s} {'batch':>5} {'loss':>8} {'tok/s':>10} {'flash':>5} {'peak GiB':>8} {'model GiB':>9}",
          flush=True)
    for name, kw in chosen.items():
        report["checks"][f"{name} device_vs_cpu_max_err"] = device_matches_cpu(kw, device)
        batches = [a.batch]
        if a.fit:
            fit = fitted_batch(ModelConfig(scale=a.scale, **kw), a, device)
            batches += [fit] if fit != a.batch else []
        for batch in batches:
            report["runs"].append(train_variant(name, kw, a, device, dtype, batch))
            r = report["runs"][-1]
            peak = "OOM" if r["oom"] else f"{r['peak_mem_gib'] or 0:.2f}"
            print(f"{name:24s} {batch:>5} {r['loss']:8.4f} {r['tokens_per_s']:10.0f} {r['flash_calls']:5d} {peak:>8} "
                  f"{r['model_mem_gib']:9.2f}", flush=True)
    if a.engine or a.engine_only:
        err = paged_attention_error(device)
        report["engine"] = {"paged_attention_max_err": err, "matches_decode": engine_matches_decode(device)}
        print(f"engine: flash paged vs SDPA over gathered blocks (bf16) max err {err}; "
              f"engine == decode.generate: {report['engine']['matches_decode']}", flush=True)
        report["engine"]["protocol"] = engine_protocol(a, device)
    ok = all(r["finite"] for r in report["runs"]) and all(v < 1e-3 for v in report["checks"].values())
    if "engine" in report:
        e = report["engine"]
        ok = ok and all(e["matches_decode"].values()) and (e["paged_attention_max_err"] is None
                                                           or e["paged_attention_max_err"] < 2e-2)
    report["ok"] = ok
    print(json.dumps(report["checks"], indent=1))
    if a.out:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        (Path(a.out) / "device_check.json").write_text(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    sys.exit(0 if main()["ok"] else 1)
