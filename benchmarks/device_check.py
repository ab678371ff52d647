"""Device check: every model variant trains on this device, in its precision, at a real scale.

What CPU tests cannot show: the flash-attn path, bf16 autocast, and the custom autograd
Functions of the routers on a GPU. For each variant (vanilla, Recursive, MoR expert- and
token-choice under each KV strategy) it runs ``--steps`` training steps (forward + backward
+ AdamW) at ``--scale`` under autocast and reports loss, tokens/s, peak memory and how many
attention calls went to flash-attn. Two equivalence checks run on the device in fp32:

  * the same ``tiny`` model's logits and loss on the device and on the CPU (every variant);
  * chunked masked attention (``mor.model.layers.masked_attention``) against one SDPA call;
  * on CUDA, FlexAttention (``mor.model.flex``, the masked path of CUDA training) against the
    chunked SDPA path: outputs and q/k/v gradients (fp32), and the forward + backward time of
    each at 135M's attention shape in bf16 as a ratio (``flex_attention``; not run on CPU,
    where torch has no FlexAttention backward).

    python benchmarks/device_check.py                       # cuda if present, 135M, bf16
    python benchmarks/device_check.py --device cpu --scale tiny --seq 64 --batch 2 --dtype float32

Memory: each run reports the peak ``torch.cuda.max_memory_allocated`` next to the memory
model's (``mor.memory.training_memory``, one GPU, the run's dtype, checkpointing and loss
chunk) and their ratio. ``--fit`` adds, per variant, a run at the micro-batch the memory
model picks for this GPU (largest divisor of ``--fit-batch`` sequences that fits); a run that
runs out of memory is reported as such, not fatal. The paper's setting and the presets' are

    python benchmarks/device_check.py --scale 360M --batch 16 --fit            # plain path
    python benchmarks/device_check.py --scale 360M --batch 16 --fit --loss-chunk 4096 --checkpointing

Writes ``device_check.json`` into ``$OUT`` (or ``--out``) when given, after every measured
row. Each check is a pass, a failure or not run (named in ``not_run`` with why): ``ok`` is
"no check that ran failed" (exit status 1 otherwise), ``status`` is ``pass`` (all ran and
passed), ``fail`` or ``incomplete`` (nothing failed, something did not run).

Decoding engine (``--engine``, or ``--engine-only``): flash-attn's paged
``flash_attn_with_kvcache`` against SDPA over the gathered blocks (bf16), the engine against
``decode.generate`` (graphs on and off), the state every pass leaves (hidden state, router
weights, KV pool; fp32, tiny models) with CUDA graphs against graphs off, shapes captured
inside the run and before it (``state_graphs_vs_eager``: a capture bug the tokens may not
show), and App. E's protocol at ``--engine-scale`` (360M). Each protocol row first captures
every static pass shape (``Engine.warmup``: ``shapes_captured``, ``capture_s``; a capture
inside the measured run, ``captures_in_run``, is a failure) and records the attention backend
its passes used (``attention``: flash_paged or sdpa_gathered) and the K/V bytes a decoding
pass's attention reads on average (``attn_mb_per_pass``) beside its tokens/s:
MoR-2/3/4 and their same-depth Vanillas at 32 rows per pass (graphs on and off) and at the
relative maximum batch (graphs on), printing per model passes per token against Σc/B, row
fill and tokens/s in the waiting window, and tokens/s over the same-depth Vanilla (paper: up
to ~2x; relative maximum batch 42/48/51), with the whole run's figures beside (``*_run``).
Last, the lockstep target per MoR model (``policy``): the same requests under 'lockstep' and
'depthwise' (graphs on, B = 32, each engine warmed up on the whole request set), tokens/s new
/ old against 0.9 x the passes' ratio old / new, beside the median time of a block pass at
>= B rows over one at <= 8 (the setting the target needs: ~1) and the block passes' share of
the time.

On the GPU machine this project is lent (image 'cuda': no network, python3 with torch
2.11.0+cu130, no flash-attn), install nothing: from the repository root,

    PYTHONUNBUFFERED=1 PYTHONPATH=src python3 benchmarks/device_check.py --engine-only --out "$OUT"

(``PYTHONPATH=src`` may be left out: the script finds ``src/`` itself when ``mor`` is not
installed). Every module it imports is in that image (torch, numpy, pyyaml, tqdm).
The paged flash check then reads ``flash paged attention: NOT RUN (flash-attn not
installed)``: neither a pass nor a failure (``status: incomplete``); a flash-attn wheel is
too large to carry there. Optional, on a cluster with network, for that check too: a CUDA
build of the pinned torch for the node's CUDA, then flash-attn built against it

    pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cu126
    pip install '.[gpu]' --no-build-isolation      # flash-attn 2.8.3.post2 (paged KV)

Sizing: each row runs at least ``--engine-requests`` (96) and ``--engine-requests-per-row``
(3) x its rows per pass requests (126/144/153 at B = 42/48/51), so that requests wait or at
least 2B sequences are live for part of every run: the waiting window is never empty by
construction; a row whose window is empty anyway prints ``no window`` and records null,
never the whole run's figures under the window's name. 6 models (3 MoR, 3 Vanillas), 15
rows, graphs-on rows first (each Vanilla before its MoR), then graphs off. ``--budget-s``
(420) starts no row that would end past it (estimated from the slowest seconds per
request of its kind so far) and names the rows it skipped; ``device_check.json`` is written
(atomically) after every measured row, so a command cut off at the lease's limit still
returns every finished row. Not yet run on a GPU: the 8-minute sizing is an estimate, the
budget is what holds it (420 s by default with ``--engine-only``; no limit otherwise).

``benchmarks/bench_engine.py --scale 360M --protocol cluster --device cuda --dtype bfloat16
--memory-gib 12 --requests 256 --rounds 1`` measures the same with more requests and rounds (its six
engines hold a pool each at once: a sixth of the GPU each at most).
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

SRC = Path(__file__).resolve().parents[1] / "src"
if importlib.util.find_spec("mor") is None and SRC.is_dir():  # a bare copy of the repo (the lent GPU image)
    sys.path.insert(0, str(SRC))

from mor.atomic import write_text_atomic  # noqa: E402
from mor.config import ExecConfig, ModelConfig, RouterConfig, RunConfig, TrainConfig, load_scales  # noqa: E402
from mor.memory import GiB, pick_micro_batch, training_memory  # noqa: E402
from mor.model import layers  # noqa: E402
from mor.model.transformer import build_model  # noqa: E402

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


def _staircase(device, B, H, Hkv, hd, S, k, dtype, seed=0):
    """q (B, H, k, hd), k/v (B, Hkv, S, hd) requiring grad, and KV sharing's mask (B, 1, k, S)."""
    g = torch.Generator().manual_seed(seed)
    pos = torch.rand(B, S, generator=g).topk(k, dim=1).indices.sort(1).values
    mask = (torch.arange(S) <= pos.unsqueeze(-1)).unsqueeze(1).to(device)  # (B, 1, k, S)
    qkv = [torch.randn(B, h, n, hd, generator=g).to(device, dtype).requires_grad_() for h, n in ((H, k), (Hkv, S), (Hkv, S))]
    return (*qkv, mask)


def _fwd_bwd(fn, q, kk, v, mask, w):
    """Output and q/k/v gradients of ``sum(fn(...) * w)``."""
    y = fn(q, kk, v, mask, True)
    return (y, *torch.autograd.grad((y * w).sum(), (q, kk, v)))


def flex_attention_check(device: torch.device, reps: int = 10) -> dict:
    """FlexAttention against the chunked SDPA path on the device (module docstring)."""
    from mor.model.flex import flex_available, flex_masked_attention

    if device.type != "cuda" or not flex_available():
        why = "no FlexAttention in this torch" if not flex_available() else f"device {device}: no FlexAttention backward"
        return {"state": NOT_RUN, "why": why, "max_err": None}
    q, kk, v, mask = _staircase(device, 2, 4, 2, 16, 300, 150, torch.float32)
    w = torch.randn(2, 4, 150, 16, generator=torch.Generator().manual_seed(1)).to(device)
    ref = _fwd_bwd(layers.masked_attention, q, kk, v, mask, w)
    got = _fwd_bwd(flex_masked_attention, q, kk, v, mask, w)
    err = max((a - b).abs().max().item() for a, b in zip(got, ref))
    # 135M's attention (9 heads, 3 KV heads, width 64), micro-batch 8, 2/3 of 2048 tokens routed
    q, kk, v, mask = _staircase(device, 8, 9, 3, 64, 2048, 1365, torch.bfloat16)
    w = torch.randn_like(q)
    ms = {"sdpa": [], "flex": []}
    for i in range(reps + 3):  # 3 warm-up rounds: FlexAttention compiles on its first call
        for name, fn in (("sdpa", layers.masked_attention), ("flex", flex_masked_attention))[:: 1 if i % 2 else -1]:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            _fwd_bwd(fn, q, kk, v, mask, w)
            end.record()
            torch.cuda.synchronize(device)
            if i >= 3:
                ms[name].append(start.elapsed_time(end))
    med = {n: statistics.median(t) for n, t in ms.items()}
    return {"state": PASS if err < 1e-3 else FAIL, "why": None, "max_err": err, "sdpa_ms": med["sdpa"],
            "flex_ms": med["flex"], "flex_over_sdpa": med["flex"] / med["sdpa"]}


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


PASS, FAIL, NOT_RUN = "pass", "fail", "not run"  # a check's three states: not run is neither of the others
FLASH_TOL = 2e-2  # bf16: paged flash and SDPA over the same blocks differ by rounding only


def flash_paged_skip_reason(device: torch.device) -> str | None:
    """Why the paged flash check cannot run here, or None: flash-attn is not installed (the lent
    GPU image has none, and its wheel is too large to carry there), or the device is no GPU."""
    from mor.engine import cache as kvc

    if kvc._flash_with_kvcache is None:
        return "flash-attn not installed"
    if torch.device(device).type != "cuda":
        return f"device {device} is not a GPU"
    return None


def flash_paged_check(device: torch.device) -> dict:
    """The paged flash check as one of three states, so an absent flash-attn is visible and
    never counted as a pass: pass / fail against FLASH_TOL, or not run with the reason."""
    why = flash_paged_skip_reason(device)
    if why:
        return {"state": NOT_RUN, "why": why, "max_err": None}
    err = paged_attention_error(device)
    return {"state": PASS if err < FLASH_TOL else FAIL, "why": None, "max_err": err}


def flash_text(flash: dict) -> str:
    """'NOT RUN (flash-attn not installed)', 'pass (max err ...)' or 'FAIL (max err ...)'."""
    if flash["state"] == NOT_RUN:
        return f"NOT RUN ({flash['why']})"
    word = "pass" if flash["state"] == PASS else "FAIL"
    return f"{word} (max err {flash['max_err']:.3g} vs SDPA over the gathered blocks, bf16; tolerance {FLASH_TOL})"

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


STATE_TOL = 1e-4  # fp32: graphs on and off differ by padded rows, table widths and kernel choice only


def engine_state_check(device: torch.device) -> dict[str, float]:
    """Capture checked by state on the device: tiny models in fp32, the engine with graphs on
    (CUDA graphs on a GPU; shapes captured inside the run, then with every shape captured
    first) against graphs off; the largest difference of the per-slot state and the KV pool
    after any pass (mor.engine.check; a state the tokens do not show)."""
    from mor.engine import Engine, Request
    from mor.engine.check import pass_states, state_deviation

    out = {}
    for name, kw in {"mor-ec": dict(variant="mor", tying="middle_cycle", num_recursions=3,
                                    router=RouterConfig(aux="aux_router")),
                     "mor-tc": dict(variant="mor", tying="middle_cycle", num_recursions=3,
                                    router=RouterConfig(type="token_choice", func="softmax", alpha=1.0)),
                     "mor-seq": dict(variant="mor", tying="sequence", num_recursions=2, kv="shared",
                                     router=RouterConfig(aux="aux_router"))}.items():
        torch.manual_seed(0)
        model = build_model(ModelConfig(scale="tiny", **kw), load_scales()["tiny"], 50).eval().to(device)
        reqs = [Request(i, [(3 * i + j) % 50 for j in range(1 + i % 4)], 3 + i % 6) for i in range(9)]
        eager = Engine(model, batch=3, max_len=16, dtype=torch.float32, graphs=False)
        want = pass_states(eager)
        eager.run(reqs)
        for warm in (False, True):
            eng = Engine(model, batch=3, max_len=16, dtype=torch.float32, graphs=True, warmup=warm)
            if warm:
                eng.warmup((False,))
            got = pass_states(eng)
            eng.run(reqs)
            out[f"{name} {'pre-captured' if warm else 'captured in run'}"] = state_deviation(got, want)
    return out


def _bench_engine():
    """benchmarks/bench_engine.py as a module (the protocol's models, requests and router steering)."""
    here = str(Path(__file__).resolve().parent)
    if here not in sys.path:
        sys.path.insert(0, here)
    import bench_engine

    return bench_engine


def requests_for(batch: int, a) -> int:
    """Requests a row at ``batch`` rows per pass decodes: at least ``--engine-requests`` and
    ``--engine-requests-per-row`` x batch. The window (EngineResult.window) is the passes run
    while requests wait or >= 2B sequences are live; with 96 requests and B = 42-51 it is
    empty or a few passes, and 3B keeps >= 2B live until a third of the requests are done."""
    return max(a.engine_requests, math.ceil(a.engine_requests_per_row * batch))


def window_figures(res) -> dict:
    """A row's passes per token, fill and tokens/s in the waiting window, None where the window
    is empty (printed 'no window'), never the whole run's under the window's name; the whole
    run's beside them, named ``*_run`` (as the throughput job's, mor.engine.job)."""
    win, run = res.window(True), res.window(False)
    has = win["tokens"] > 0 and win["forward_s"] > 0
    return {"window_passes": win["passes"], "window_tokens": win["tokens"],
            "passes_per_token": win["passes_per_token"] if has else None,
            "fill": win["row_fill"] if has else None,
            "tokens_per_s": win["tokens_per_s"] if has else None,
            "passes_per_token_run": run["passes_per_token"], "fill_run": run["row_fill"],
            "tokens_per_s_run": res.tokens / res.forward_s if res.forward_s > 0 else None}


def _ratio(x: float | None, y: float | None) -> float | None:
    return x / y if x is not None and y else None


def attach_ratios(rows: list[dict], vanilla_of: dict[str, str], base: int) -> None:
    """Each row's tokens/s over its same-depth Vanilla's at the base batch with the same graphs
    setting (a Vanilla's relative maximum batch is the base batch): in the window
    (``vs_vanilla``, None when either window is empty) and over the whole runs
    (``vs_vanilla_run``), never one standing in for the other."""
    ref = {(r["model"], r["graphs"]): r for r in rows if r["batch"] == base and r["model"] == vanilla_of[r["model"]]}
    for r in rows:
        v = ref.get((vanilla_of[r["model"]], r["graphs"]), {})
        r["vs_vanilla"] = _ratio(r["tokens_per_s"], v.get("tokens_per_s"))
        r["vs_vanilla_run"] = _ratio(r["tokens_per_s_run"], v.get("tokens_per_s_run"))


def protocol_models(scale: str) -> tuple[dict[str, ModelConfig], dict[str, str]]:
    """MoR-2/3/4 (bench_engine.configs) and their same-depth Vanillas, each Vanilla first (so a
    budget cut leaves ratios), and the Vanilla each model is measured against."""
    be = _bench_engine()
    from mor.throughput_protocol import baseline

    models, vanilla_of = {}, {}
    for name, cfg in be.configs(scale).items():
        van = baseline(cfg)
        vname = f"Vanilla-{van.layers or be.shape_of(van).layers}"
        models.setdefault(vname, van)
        models[name] = cfg
        vanilla_of[name] = vanilla_of[vname] = vname
    return models, vanilla_of


def protocol_plan(models, rel: dict[str, float], base: int, cuda: bool) -> list[tuple[str, int, bool]]:
    """(model, rows per pass, graphs) in the order they run: graphs on at the base batch and at
    the relative maximum batch, model by model, then graphs off at the base batch (a GPU's
    question only: on a CPU both settings are the same eager path). A batch is run once per
    setting: a Vanilla's relative maximum batch is the base batch."""
    on = [(name, b, True) for name in models for b in dict.fromkeys((base, max(1, int(rel[name]))))]
    return on + ([(name, base, False) for name in models] if cuda else [])


def _fmt(v: float | None, spec: str) -> str:
    return "n/a" if v is None else format(v, spec)


def print_row(r: dict) -> None:
    window = ("no window" if r["tokens_per_s"] is None else
              f"passes/token {r['passes_per_token']:.4f} (Σc/B {r['bound']:.4f}) fill {r['fill']:.3f} "
              f"tok/s {r['tokens_per_s']:.0f}")
    print(f"{r['model']:11s} b={r['batch']:3d} graphs={r['graphs']!s:5s} requests {r['requests']:4d} live "
          f"{r['max_live']:5d} window: {window} | run: passes/token {r['passes_per_token_run']:.4f} fill "
          f"{r['fill_run']:.3f} tok/s {_fmt(r['tokens_per_s_run'], '.0f')} | preempted {r['preempted']} "
          f"| {r['attention']} {r['attn_mb_per_pass']:.1f} MB K/V per pass | {r['shapes_captured']} shapes captured "
          f"first ({r['capture_s']:.1f} s), {r['captures_in_run']} in the run | {r['seconds']:.1f} s", flush=True)


def print_summary(rows: list[dict], rel: dict[str, float], vanilla_of: dict[str, str], scale: str) -> None:
    """Per model, graphs on and off: passes per token, fill, tokens/s in the window and the ratio
    over the same-depth Vanilla, whole-run values beside; then the paper's reference."""
    print(f"\nApp. E's protocol at {scale} (window: passes while requests wait or >= 2B sequences are "
          f"live; run: the whole run)")
    print(f"{'model':11s} {'vs':11s} {'B':>3} {'graphs':6s} {'pass/tok':>8} {'Σc/B':>6} {'fill':>5} {'tok/s':>9} "
          f"{'vs Van':>6} | {'pass/tok':>8} {'fill':>5} {'tok/s':>9} {'vs Van':>6}")
    print(f"{'':40s}{'window':^41s}| {'whole run':^32s}")
    order = list(dict.fromkeys(r["model"] for r in rows))
    for r in sorted(rows, key=lambda r: (order.index(r["model"]), not r["graphs"], r["batch"])):
        if r["tokens_per_s"] is None:
            window = f"{'no window':>44s}"
        else:
            window = (f"{r['passes_per_token']:8.4f} {r['bound']:6.4f} {r['fill']:5.3f} {r['tokens_per_s']:9.0f} "
                      f"{_fmt(r['vs_vanilla'], '6.3f'):>6}")
        print(f"{r['model']:11s} {vanilla_of[r['model']]:11s} {r['batch']:3d} {r['graphs']!s:6s} {window} | "
              f"{r['passes_per_token_run']:8.4f} {r['fill_run']:5.3f} {_fmt(r['tokens_per_s_run'], '9.0f'):>9} "
              f"{_fmt(r['vs_vanilla_run'], '6.3f'):>6}")
    mor = ", ".join(f"{n} {rel[n]:.1f}" for n in rel if n != vanilla_of[n])
    print(f"paper (App. E): tokens/s over the same-depth Vanilla up to ~2x at the relative maximum batch; "
          f"relative maximum batch 42/48/51 (MoR-2/3/4). Here: {mor}", flush=True)


def protocol_row(m, name: str, batch: int, graphs: bool, reqs, p: dict, a, device, dtype, memory: float) -> dict:
    """One measured row: warm-up (graph capture, allocation), then the requests; the row's
    figures (window_figures) and its seconds, construction and warm-up included."""
    be = _bench_engine()
    from mor.engine import Engine, Request

    t0 = time.perf_counter()
    n = requests_for(batch, a)
    eng = Engine(m, batch=batch, max_len=p["gen_max"], device=device, dtype=dtype, memory_bytes=memory, graphs=graphs)
    captured = eng.warmup((False,))  # every static shape, largest first, before any request
    t_cap = time.perf_counter() - t0
    eng.run([Request(-1 - i, [1], p["warmup_tokens"]) for i in range(batch)])
    res = eng.run(reqs[:n])
    decoding = [b for b, k in zip(res.attn_bytes, res.kinds) if k != "prefill"]
    row = {"model": name, "batch": batch, "graphs": graphs, "requests": n, "max_live": res.max_live,
           "bound": sum(be.realised(res)) / batch, **window_figures(res), "preempted": len(res.preempted),
           "attention": res.attention, "attn_mb_per_pass": sum(decoding) / max(1, len(decoding)) / 1e6,
           "shapes_captured": captured, "capture_s": t_cap, "captures_in_run": res.captures}
    del eng, res
    free_device(device)  # one engine's KV pool at a time
    row["seconds"] = time.perf_counter() - t0
    return row


def free_device(device: torch.device) -> None:
    """Give a finished engine's memory back before the next one allocates its pool (a second
    pool of 0.8 x the free memory would not fit beside the first): a deleted engine releases
    its stepper (Engine.__del__); the collector runs too, for anything else left in a cycle,
    and the caching allocator hands the blocks back."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()


def policy_row(m, name: str, batch: int, reqs, p: dict, device, dtype) -> dict:
    """The lockstep target for one MoR model: the same requests through the engine under
    'lockstep' (B live, one depth per pass) and 'depthwise' (2B live, B rows from any depth),
    graphs on at the engine's default row buckets. Each engine first runs the whole request
    set unmeasured (every row bucket's graph captured then, none inside the measured run),
    then again, measured. Tokens/s new / old (wall seconds on a GPU, the process's CPU
    seconds on a CPU) beside 0.9 x the passes' ratio old / new (shared-block passes, and all
    passes: the head and enter passes are about as many under either policy), and what
    decides which of the two tokens/s can reach: the median time of a block pass with >= B
    rows over one with <= 8 (the engine's pass clock, CUDA events from each pass's launch on a
    GPU; ~1 where a pass costs the same at 8 rows as at 32) and the block passes' share of the
    pass time. ``same_tokens``: the share of requests whose tokens agree under both policies
    (1 in fp32, tested; in bf16 a row's rounding may follow its pass's row count, so a near
    tie may flip: a figure there, not a check)."""
    be = _bench_engine()

    t0 = time.perf_counter()
    res, tps, every = be.run_policies(m, batch, reqs, p["gen_max"], device, dtype, {"max_live": 2 * batch}, True, None,
                                      1, reqs)  # warmed up on the requests themselves
    same = sum(res["new"].outputs[r.id] == res["old"].outputs[r.id] for r in reqs) / len(reqs)
    row = {"model": name, "batch": batch, "requests": len(reqs), "same_tokens": same,
           **be.policy_figures(res, tps, every, batch)}
    del res, every
    free_device(device)
    row["seconds"] = time.perf_counter() - t0
    return row


def print_policy_row(r: dict) -> None:
    cost = "n/a" if r["pass_cost_ratio"] is None else f"{r['pass_cost_ratio']:.3f}"
    print(f"{r['model']:7s} policy b={r['batch']} requests {r['requests']}: tok/s depth-wise / lockstep "
          f"{r['speedup']:.3f} vs 0.9 x passes old/new: block {r['target_block']:.3f}, all {r['target_all']:.3f} | "
          f"block pass >= B / <= 8 rows {cost} ({r['passes_full']} / {r['passes_small']} passes), block share of "
          f"pass time {r['block_share_new']:.2f} / {r['block_share_old']:.2f} | same tokens {r['same_tokens']:.2f} "
          f"| {r['seconds']:.1f} s", flush=True)


def policy_check(a, device: torch.device, budget: "Budget", rows: list[dict], built: dict, models, p: dict,
                 calib, save=lambda: None) -> None:
    """The lockstep target (policy_row) per MoR model at ``--engine-scale``, the rows per pass
    the protocol's base batch, ``--engine-requests`` requests; rows the budget does not start
    are named in ``budget.skipped``."""
    be = _bench_engine()
    dtype = getattr(torch, a.dtype)
    batch = p["base_batch"]
    reqs = be.make_requests(p, a.engine_requests, p["seed"])
    for name, cfg in models.items():
        if not name.startswith("MoR"):
            continue
        kind, work = "engine policy", 5 * len(reqs)  # four runs, lockstep's the longer: priced as the engine rows'
        if not budget.allows(f"{name} policy b={batch}", kind, work):
            continue
        if name not in built:
            built[name] = be.build(cfg, calib, device, dtype)
        row = policy_row(built[name], name, batch, reqs, p, device, dtype)
        budget.ran(kind, row["seconds"], work)
        rows.append(row)
        print_policy_row(row)
        save()


def engine_protocol(a, device: torch.device, budget: "Budget", rows: list[dict], save=lambda: None,
                    policy_rows: list[dict] | None = None) -> list[dict]:
    """App. E's protocol at ``--engine-scale``: MoR-2/3/4 Middle-Cycle (routers steered to their
    design shares, bench_engine.steer_routers) and the same-depth Vanillas, in ``--dtype``, live
    sequences admitted by the device's memory (flops.max_batch, paged blocks), rows as
    protocol_plan orders them, then the lockstep target (policy_check, into ``policy_rows``). Appends each row to ``rows`` and calls
    ``save`` after it (the report on disk is never more than one row behind); rows the budget
    does not start are named in ``budget.skipped``."""
    be = _bench_engine()
    from mor.flops import relative_max_batch_exact
    from mor.throughput_protocol import baseline, load_protocol

    p = load_protocol(a.engine_protocol)
    be.V = load_scales()[a.engine_scale].vocab or be.V
    dtype = getattr(torch, a.dtype)
    # the memory the engine may fill: most of what is free now (the pool is really allocated)
    memory = 0.8 * torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else a.cpu_memory_gib * 2**30
    base, elem = p["base_batch"], torch.tensor([], dtype=dtype).element_size()
    models, vanilla_of = protocol_models(a.engine_scale)
    rel = {n: float(base) if n == vanilla_of[n] else relative_max_batch_exact(
        cfg, baseline(cfg), be.shape_of(cfg), be.V, p["gen_max"], memory, base, elem) for n, cfg in models.items()}
    plan = protocol_plan(models, rel, base, device.type == "cuda")
    reqs = be.make_requests(p, max(requests_for(b, a) for _, b, _ in plan), p["seed"])  # each row takes a prefix
    calib = torch.randint(0, be.V, (8, 64), generator=torch.Generator().manual_seed(0))
    built = {}  # built once, kept on the device (6 x 360M in bf16: ~4.5 GB beside a pool of 0.8 x free)
    for name, batch, graphs in plan:
        kind, n = f"engine graphs={graphs}", requests_for(batch, a)
        if not budget.allows(f"{name} b={batch} graphs={graphs}", kind, n):
            continue
        if name not in built:
            built[name] = be.build(models[name], calib, device, dtype)  # built and steered on the CPU, then moved
        row = protocol_row(built[name], name, batch, graphs, reqs, p, a, device, dtype, memory)
        row["relative_max_batch"] = rel[name]
        budget.ran(kind, row["seconds"], n)
        rows.append(row)
        attach_ratios(rows, vanilla_of, base)
        print_row(row)
        save()
    if policy_rows is not None:  # last: App. E's rows first under the budget
        policy_check(a, device, budget, policy_rows, built, models, p, calib, save)
    built.clear()
    print_summary(rows, rel, vanilla_of, a.engine_scale)
    if policy_rows:
        print("\nThe lockstep target (issue: tokens/s depth-wise / lockstep >= 0.9 x passes lockstep / depth-wise, "
              "where a pass costs the same at 8 rows as at B)")
        for r in policy_rows:
            print_policy_row(r)
    return rows


# ------------------------------------------------------------------ the run's clock, checks and report
class Budget:
    """Starts a measured row only while it should end inside ``--budget-s``: the lent GPU
    machine kills a command at its limit and a row cut off yields nothing. A row's estimate is
    the slowest seconds per unit of work of its kind so far (requests for an engine row, one
    for a training run); the first of a kind takes its family's slowest (graphs off after
    graphs on: still an underestimate, the margin below the lease's limit covers it), or
    none; a row that would end past the budget is skipped and named."""

    def __init__(self, seconds: float):
        self.seconds, self.t0 = seconds, time.perf_counter()
        self.rate: dict[str, float] = {}
        self.skipped: list[str] = []

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def allows(self, name: str, kind: str, work: float = 1.0) -> bool:
        family = [r for k, r in self.rate.items() if k.split()[0] == kind.split()[0]]
        if self.elapsed() + self.rate.get(kind, max(family, default=0.0)) * work <= self.seconds:
            return True
        self.skipped.append(name)
        print(f"{name}: SKIPPED (--budget-s {self.seconds:g}; {self.elapsed():.0f} s elapsed)", flush=True)
        return False

    def ran(self, kind: str, seconds: float, work: float = 1.0) -> None:
        self.rate[kind] = max(self.rate.get(kind, 0.0), seconds / work)


def save(report: dict, out: str | None) -> None:
    """device_check.json, written whole or not at all (temp file + os.replace,
    mor.atomic): called after every measured row, so a command killed at its limit still
    returns every row it finished."""
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        write_text_atomic(Path(out) / "device_check.json", json.dumps(report, indent=1))


def outcome(report: dict) -> dict:
    """The verdict over every check, three ways: ``failed`` (a check that ran and failed),
    ``not_run`` (a check or row that did not run, with why: the paged flash check without
    flash-attn, rows past ``--budget-s``) and the rest passed. ``ok`` (the exit status) is
    "nothing failed": a check not run is no failure; ``status`` is ``pass`` only when
    everything ran and passed, ``incomplete`` when nothing failed but something did not run,
    so a skipped check never reads as a pass."""
    failed = [f"{r['variant']} b={r['batch']}: loss not finite" for r in report["runs"] if not r["finite"]]
    failed += [f"{k} = {v:.3g}" for k, v in report["checks"].items() if not v < 1e-3]  # NaN fails too
    not_run = []
    e = report.get("engine")
    if e:
        failed += [f"engine != decode.generate ({k})" for k, same in e["matches_decode"].items() if not same]
        failed += [f"state graphs on vs off ({k}) = {d:.3g}" for k, d in e.get("state_graphs_vs_eager", {}).items()
                   if not d <= STATE_TOL]  # NaN / inf fail too
        failed += [f"{r['model']} b={r['batch']}: {r['captures_in_run']} shapes captured inside the measured run"
                   for r in e.get("protocol", []) if r.get("captures_in_run")]
        if report.get("dtype") == "float32":  # bf16 rounding may follow a pass's row count
            failed += [f"{r['model']}: depth-wise and lockstep tokens differ" for r in e.get("policy", [])
                       if r["same_tokens"] < 1]
        flash = e["flash_paged"]
        if flash["state"] == FAIL:
            failed.append(f"flash paged attention max err {flash['max_err']:.3g} >= {FLASH_TOL}")
        elif flash["state"] == NOT_RUN:
            not_run.append(f"flash paged attention ({flash['why']})")
    flex = report.get("flex_attention")
    if flex and flex["state"] == NOT_RUN:
        not_run.append(f"FlexAttention vs chunked SDPA ({flex['why']})")
    not_run += [f"{name} (--budget-s)" for name in report.get("skipped_rows", [])]
    status = "fail" if failed else "incomplete" if not_run else "pass"
    return {"ok": not failed, "status": status, "failed": failed, "not_run": not_run}


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
    ap.add_argument("--budget-s", type=float, default=None,
                    help="start no measured row that would end past this many seconds (inf: no limit; default "
                         "420 with --engine-only, the lent GPU's one-command protocol, else no limit)")
    ap.add_argument("--engine", action="store_true", help="also check the decoding engine (App. E; see the docstring)")
    ap.add_argument("--engine-only", action="store_true", help="the engine checks alone (no training variants)")
    ap.add_argument("--engine-scale", default="360M")
    ap.add_argument("--engine-protocol", default="cluster", help="section of workflows/config/throughput.yaml")
    ap.add_argument("--engine-requests", type=int, default=96, help="requests per protocol row, at least")
    ap.add_argument("--engine-requests-per-row", type=float, default=3.0,
                    help="and at least this many per row of a pass (keeps the waiting window non-empty)")
    a = ap.parse_args(argv)
    if a.budget_s is None:  # the lent machine's command is --engine-only; a --fit sweep on a cluster is not cut
        a.budget_s = 420.0 if a.engine_only else math.inf
    budget = Budget(a.budget_s)
    device, dtype = torch.device(a.device), getattr(torch, a.dtype)
    count_flash_calls()
    chosen = {n: kw for n, kw in variants().items() if (not a.only or n in a.only) and not a.engine_only}
    report = {"device": str(device), "name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "torch": torch.__version__, "flash_attn": layers.flash_available(), "dtype": a.dtype,
              "scale": a.scale, "batch": a.batch, "seq": a.seq, "checkpointing": a.checkpointing,
              "loss_chunk": a.loss_chunk, "budget_s": a.budget_s if math.isfinite(a.budget_s) else None, "status": "running", "runs": [], "checks": {},
              "skipped_rows": budget.skipped}
    report["checks"]["chunked_attention_max_err"] = chunked_attention_error(device)
    flex = report["flex_attention"] = flex_attention_check(device)
    if flex["state"] != NOT_RUN:
        report["checks"]["flex_vs_chunked_max_err"] = flex["max_err"]
        print(f"FlexAttention vs chunked SDPA: max err {flex['max_err']:.3g} (fp32, output and grads); fwd+bwd "
              f"{flex['flex_ms']:.2f} ms vs {flex['sdpa_ms']:.2f} ms (bf16, 135M shape): {flex['flex_over_sdpa']:.2f}x",
              flush=True)
    if chosen:
        print(f"{'variant':24s} {'batch':>5} {'loss':>8} {'tok/s':>10} {'flash':>5} {'peak GiB':>8} "
              f"{'model GiB':>9} {'s':>6}", flush=True)
    for name, kw in chosen.items():
        report["checks"][f"{name} device_vs_cpu_max_err"] = device_matches_cpu(kw, device)
        batches = [a.batch]
        if a.fit:
            fit = fitted_batch(ModelConfig(scale=a.scale, **kw), a, device)
            batches += [fit] if fit != a.batch else []
        for batch in batches:
            if not budget.allows(f"{name} b={batch}", "train"):
                continue
            t0 = time.perf_counter()
            r = train_variant(name, kw, a, device, dtype, batch)
            r["seconds"] = time.perf_counter() - t0
            budget.ran("train", r["seconds"])
            report["runs"].append(r)
            peak = "OOM" if r["oom"] else f"{r['peak_mem_gib'] or 0:.2f}"
            print(f"{name:24s} {batch:>5} {r['loss']:8.4f} {r['tokens_per_s']:10.0f} {r['flash_calls']:5d} {peak:>8} "
                  f"{r['model_mem_gib']:9.2f} {r['seconds']:6.1f}", flush=True)
            save(report, a.out)
    if a.engine or a.engine_only:
        flash = flash_paged_check(device)
        report["engine"] = {"flash_paged": flash, "paged_attention_max_err": flash["max_err"],
                            "matches_decode": engine_matches_decode(device),
                            "state_graphs_vs_eager": engine_state_check(device), "protocol": [], "policy": []}
        print(f"flash paged attention: {flash_text(flash)}", flush=True)
        print(f"engine == decode.generate: {report['engine']['matches_decode']}", flush=True)
        print("engine state (h, router weights, KV) after every pass, graphs on vs off, fp32, max |diff| "
              f"(tolerance {STATE_TOL}): " + ", ".join(f"{k} {v:.2g}" for k, v in
                                                      report["engine"]["state_graphs_vs_eager"].items()), flush=True)
        save(report, a.out)
        engine_protocol(a, device, budget, report["engine"]["protocol"], lambda: save(report, a.out),
                        report["engine"]["policy"])
    report.update(outcome(report))
    print(json.dumps(report["checks"], indent=1))
    print(f"result: {report['status'].upper()} ({budget.elapsed():.0f} s)"
          + "".join(f"\n  failed: {f}" for f in report["failed"])
          + "".join(f"\n  NOT RUN: {n}" for n in report["not_run"]), flush=True)
    save(report, a.out)
    return report


if __name__ == "__main__":
    sys.exit(0 if main()["ok"] else 1)
