"""Benchmark: continuous depth-wise batching (App. E) against the lockstep policy, and MoR's
decoding speed-up over the same-depth Vanilla, measured vs FLOPs-predicted, in one process.

Models (random weights, CPU by default): MoR-2/3/4 Middle-Cycle expert-choice with
recursion-wise caching, and for each the Vanilla of its effective depth (App. E's baseline;
``mor.throughput_protocol.baseline``). Untrained routers do not keep the capacities trained ones
learn, so each router's causal decision is steered to the design capacities: its logit is
shifted by a constant so that the share of tokens continuing is c_r / c_{r-1} on a
calibration batch (a bias on the router head, added here only).

Part 1, policies (``--policy-scale``, default ``small``: passes are bound by per-pass
overhead, a stand-in for a GPU's weight-read-bound decoding passes). The same request set
through the engine twice per model, in one process, alternating order per round:

    old  'lockstep': B live sequences, one depth per pass, the head when all have exited
    new  'depthwise': up to ``--live`` live sequences, B rows per shared-block pass from any
         depth (deepest first), exits refilled at once

  passes/token   shared-block passes per generated token; bound Σ c_r / B (every pass full,
                 realised capacities), lockstep needs about Nr / B
  fill           mean rows per shared-block pass / B while the queue is non-empty (the
                 engine's one window, EngineResult.window; passes/token over the same window)
  pass cost      median seconds of a block pass with >= B rows over one with <= 8 (the
                 engine's per-pass clock): ~1 where a pass costs the same at 8 rows as at 32,
                 the setting where tokens/s new/old should reach 0.9 x passes old/new
  tok/s new/old  tokens per second of the whole run (CPU seconds on a CPU, wall time on a
                 GPU), new over old (median over rounds)
  beside them    all passes (enter, block, head) old/new, and the block passes' share of the
                 pass time: the head and enter passes, about as many under either policy,
                 bound tokens/s new/old below the block passes' ratio unless they are cheap

Part 2, speed-up (``--scale``, default ``engine``: a 32-row pass is compute-bound on a CPU
core). Each MoR model and its same-depth Vanilla through the new policy at batch B:
measured = MoR tokens/s over Vanilla's (forward time on a GPU; on a CPU the process's
CPU time, which other jobs on a shared machine do not inflate); predicted = the FLOPs ratio
(mor.flops.decode_flops_per_token) at the capacities the routers realised in that run,
beside the design one; the table gives measured / realised-predicted, and the paged cache's
peak blocks relative to the Vanilla's (memory that follows the routers). Beside it: the same
ratio in the engine's one window (requests waiting or >= 2B live; CPU seconds inside the
window's passes), the drain tail's share of the pass time and its speed-up, and a second,
labelled prediction ('pass model'): FLOPs plus a constant per layer call (kappa rows' worth,
fitted on both runs' block passes), applied to every pass the two runs made. Where one call's
fixed cost is worth many rows (eager CPU ops, a GPU's launches), the drain tail's small passes
cost MoR more than FLOPs say: that, not the full passes, is what the whole-run figure loses.
Each round runs every MoR model next to its Vanilla (``paired_order``), so both runs of a
ratio share the machine's state of the moment. Per model and Vanilla: rows per pass, real
and after padding (the row shape a pass ran at), per pass kind, in the window and over the
whole run (``EngineResult.rows_per_pass``): what padding a static pass computed.

Part 3, context (``--context-scale``, default ``small``): a pass's cost follows its rows'
context, not the allocation. The same short requests (32 prompts of one token, 48 new tokens,
batch 16) through a Vanilla's engine at ``max_len`` 256 and 2,048, graphs on (the static
path: every pass at a fixed table width), alternating per round: the process's CPU seconds
inside the passes at 2,048 over 256 (median over rounds; target <= 1.3), the K/V bytes the
passes' attention reads (EngineResult.attn_bytes) at the two lengths, and the static shapes
captured inside the measured runs (0: all before).

    .venv/bin/python benchmarks/bench_engine.py [--rounds 3] [--threads 1] [--models MoR-4]
    .venv/bin/python benchmarks/bench_engine.py --skip policy,speedup      # part 3 only

On a GPU, App. E's own setting (360M, bf16, the cluster protocol). Part 2 keeps its six
engines (3 MoR, 3 Vanillas) alive together to interleave their rounds, each with its own KV
pool of ``--memory-gib``, so give each a sixth of the GPU at most (``--memory-gib 0``, the
whole GPU per engine, fits one); ``device_check.py --engine-only`` runs one engine at a time:

    .venv/bin/python benchmarks/bench_engine.py --scale 360M --policy-scale 360M --protocol cluster \
        --device cuda --dtype bfloat16 --memory-gib 12 --requests 256 --policy-requests 256 --rounds 1
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import random
import statistics
import time

import torch

from mor.capacity import capacities
from mor.config import ModelConfig, RouterConfig, load_scales
from mor.cpu_allocator import tune_cpu_allocator
from mor.engine import Engine, Request
from mor.throughput_protocol import baseline, load_protocol, sequence_len
from mor.flops import decode_flops_per_token
from mor.model.transformer import build_model

V = 4096


def configs(scale: str, layers: int = 0) -> dict[str, ModelConfig]:
    router = RouterConfig(type="expert_choice", func="sigmoid", alpha=0.1, arch="linear", aux="aux_loss")
    return {f"MoR-{nr}": ModelConfig(scale=scale, variant="mor", tying="middle_cycle", num_recursions=nr, router=router,
                                     layers=layers) for nr in (2, 3, 4)}


def shape_of(cfg: ModelConfig):
    s = load_scales()[cfg.scale]
    return dataclasses.replace(s, layers=cfg.layers or s.layers)


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


def build(cfg: ModelConfig, calib, dev, dtype):
    torch.manual_seed(0)
    m = build_model(cfg, shape_of(cfg), V).eval()
    steer_routers(m, calib)
    return m.to(device=dev, dtype=dtype)


def realised(res) -> tuple[float, ...]:
    ran = res.recursion_tokens()
    return tuple(n / ran[0] for n in ran)


def steady(res) -> tuple[float, float]:
    """(shared-block passes per generated token, mean row fill) in the engine's one window:
    the passes run while the queue is non-empty (EngineResult.window, the job's)."""
    w = res.window(True)
    return w["passes_per_token"], w["row_fill"]


def pass_cost(results, lo: int, hi: int) -> tuple[float, float, int, int]:
    """Median seconds of a shared-block pass with <= lo rows and with >= hi rows, over the
    runs' per-pass times (the engine's clock), and how many passes each median is over."""
    small, big = [], []
    for res in results:
        for k, n, t in zip(res.kinds, res.rows, res.pass_s):
            if k == "block":
                (small if n <= lo else big if n >= hi else []).append(t)
    med = lambda xs: statistics.median(xs) if xs else float("nan")  # noqa: E731
    return med(small), med(big), len(small), len(big)


def all_passes(res) -> int:
    """Decoding passes of a run: enter, shared-block and head (prefills are admission)."""
    return sum(k in ("enter", "block", "head") for k in res.kinds)


def block_share(res) -> float:
    """The shared-block passes' share of the time inside a run's passes (the engine's clock)."""
    return sum(t for k, t in zip(res.kinds, res.pass_s) if k == "block") / sum(res.pass_s)


def pass_fit(runs) -> tuple[float, float]:
    """Least-squares (alpha, beta) of one layer call's seconds = alpha + beta x rows over the
    shared-block passes of ``runs`` [(result, layers per block pass)], each pass's time
    divided by its layers (CPU seconds on a CPU, the pass clock on a GPU). A MoR run's block
    passes span 1..B rows (the Vanilla's are nearly all B), so kappa = alpha / beta, the
    rows one call's fixed cost is worth, is measured on both."""
    pts = []
    for res, layers in runs:
        ts = res.pass_cpu_s or res.pass_s
        pts += [(n, t / layers) for k, n, t in zip(res.kinds, res.rows, ts) if k == "block"]
    mx = statistics.mean(n for n, _ in pts)
    my = statistics.mean(t for _, t in pts)
    sxx = sum((n - mx) ** 2 for n, _ in pts)
    beta = sum((n - mx) * (t - my) for n, t in pts) / sxx if sxx else my / mx
    return my - beta * mx, beta


def pass_units(res, model, kappa: float) -> float:
    """A run's cost in row-layer units under 'FLOPs + a constant per layer call': every call
    of a decoder layer over n rows costs kappa + n, the LM head kappa + n x (its FLOPs over a
    layer's); the routers, norms and embedding are left out (under 1 % of the FLOPs here).
    kappa = 0 gives the FLOPs count of the run's passes (attention's context term aside)."""
    from mor.flops import layer_params

    plan, s = model.plan, model.shape
    lm = s.hidden * model.vocab_size / (layer_params(s) - 2 * s.hidden)
    pre, per, suf = len(plan.prefix), len(plan.recursions[0]), len(plan.suffix)
    units, cont = 0.0, iter(res.head_cont)
    for kind, n in zip(res.kinds, res.rows):
        if kind == "enter":
            units += pre * (kappa + n) if pre else 0.0
        elif kind == "block":
            units += per * (kappa + n)
        elif kind == "head":
            c = next(cont)
            units += suf * (kappa + n) + kappa + lm * n + (pre * (kappa + c) if c and pre else 0.0)
    return units


def run_policies(m, batch: int, reqs, max_len: int, dev, dtype, new_admit: dict, graphs, buckets, rounds: int,
                 warmup: list[Request]):
    """The same requests through the engine under 'depthwise' (admitted by ``new_admit``:
    max_live or memory_bytes) and 'lockstep' (B live), each warmed up on ``warmup`` first,
    ``rounds`` times in alternating order: -> (the last results per policy 'new' / 'old',
    tokens/s per round per policy (the process's CPU seconds on a CPU, wall seconds on a GPU),
    every result)."""
    engines = {"new": Engine(m, batch=batch, max_len=max_len, device=dev, dtype=dtype, graphs=graphs, buckets=buckets,
                             **new_admit),
               "old": Engine(m, batch=batch, max_len=max_len, device=dev, dtype=dtype, policy="lockstep",
                             graphs=graphs, buckets=buckets)}
    for eng in engines.values():
        eng.run(warmup)
    tps, res, every = {k: [] for k in engines}, {}, []
    for rd in range(rounds):
        for k in (("new", "old") if rd % 2 == 0 else ("old", "new")):
            t = time.process_time()
            res[k] = engines[k].run(reqs)
            cpu = time.process_time() - t
            every.append(res[k])
            tps[k].append(res[k].tokens / (cpu if torch.device(dev).type == "cpu" else res[k].wall_s))
    return res, tps, every


def policy_figures(res: dict, tps: dict, every: list, batch: int) -> dict:
    """The lockstep target's figures from run_policies: tokens/s new / old (median over rounds)
    beside 0.9 x the passes' ratio old / new (shared-block passes: the target as written; all
    passes: what tokens/s follows when every pass costs the same), the median block pass at
    >= B rows over <= 8 (~1 where a pass costs the same at 8 rows as at 32) and the block
    passes' share of the pass time."""
    new, old = res["new"], res["old"]
    lo, hi, n_lo, n_hi = pass_cost(every, 8, batch)
    return {"tokens_per_s_new": statistics.median(tps["new"]), "tokens_per_s_old": statistics.median(tps["old"]),
            "speedup": statistics.median(n / o for n, o in zip(tps["new"], tps["old"])),
            "block_passes_new": new.block_passes, "block_passes_old": old.block_passes,
            "target_block": 0.9 * old.block_passes / new.block_passes,
            "all_passes_new": all_passes(new), "all_passes_old": all_passes(old),
            "target_all": 0.9 * all_passes(old) / all_passes(new),
            "pass_cost_ratio": hi / lo if n_lo and n_hi else None, "pass_s_full": hi, "pass_s_small": lo,
            "passes_full": n_hi, "passes_small": n_lo,
            "block_share_new": block_share(new), "block_share_old": block_share(old)}


def context_cost(scale: str, rounds: int, dev, dtype, lengths=(256, 2048), batch: int = 16) -> dict:
    """Part 3: pass cost at each ``max_len`` of ``lengths`` for the same short requests (graphs
    on) -> {'ratio': median over rounds of CPU seconds (GPU: seconds) inside the passes at the
    longest over the shortest, 'bytes': attention bytes per pass at each length, 'captures':
    shapes captured inside measured runs, 'tokens_equal': both lengths gave the same tokens}."""
    cfg = ModelConfig(scale=scale, variant="vanilla")
    torch.manual_seed(0)
    shape = dataclasses.replace(shape_of(cfg), max_seq_len=max(max(lengths), shape_of(cfg).max_seq_len))
    m = build_model(cfg, shape, V).eval().to(device=dev, dtype=dtype)
    reqs = [Request(i, [1 + i], 48) for i in range(32)]
    engines = {n: Engine(m, batch=batch, max_len=n, device=dev, dtype=dtype, graphs=True) for n in lengths}
    for eng in engines.values():
        eng.run([Request(-1, [1], 2)])  # captures every shape (warm-up) and touches the allocator
    secs = {n: [] for n in lengths}
    res, captures = {}, 0
    for rd in range(rounds):
        for n in (lengths if rd % 2 == 0 else lengths[::-1]):
            res[n] = engines[n].run(reqs)
            secs[n].append(sum(res[n].pass_cpu_s) if dev.type == "cpu" else res[n].forward_s)
            captures += res[n].captures
    lo, hi = min(lengths), max(lengths)
    return {"ratio": statistics.median(a / b for a, b in zip(secs[hi], secs[lo])),
            "seconds": {n: statistics.median(v) for n, v in secs.items()},
            "bytes": {n: sum(r.attn_bytes) / len(r.attn_bytes) for n, r in res.items()},
            "captures": captures, "attention": res[lo].attention,
            "tokens_equal": res[lo].outputs == res[hi].outputs}


def paired_order(groups: dict[str, list[str]], rnd: random.Random, rd: int) -> list[str]:
    """One round's run order for part 2: each Vanilla next to every MoR model measured against
    it (MoR, Vanilla, MoR), the groups shuffled and every group reversed on odd rounds, so the
    two runs of each speed-up ratio are adjacent in time and a slow spell of a shared machine
    (other jobs, lasting seconds) falls on both rather than on one."""
    order = []
    items = list(groups.items())
    rnd.shuffle(items)
    for van, mors in items:
        mors = list(mors)
        rnd.shuffle(mors)
        seq = mors[:1] + [van] + mors[1:]
        order += seq[::-1] if rd % 2 else seq
    return order


def rows_figure(res) -> str:
    """Rows per pass, real / after padding (the row shape the pass ran at), per pass kind, in
    the engine's window and over the whole run (EngineResult.rows_per_pass): where the two
    differ, a static pass computed padding rows."""
    def one(ww: bool) -> str:
        return ", ".join(f"{k} {n} x {r:.1f}/{q:.1f}" for k, (n, r, q) in res.rows_per_pass(ww).items())
    return f"window {one(True)}; whole run {one(False)}"


def token_agreement(a: dict, b: dict) -> float:
    """Share of the generated tokens equal position by position (request by request)."""
    same = sum(x == y for k in a for x, y in zip(a[k], b[k]))
    return same / max(1, sum(len(v) for v in a.values()))


def make_requests(p: dict, n: int, seed: int) -> list[Request]:
    rnd = random.Random(seed)
    return [Request(i, [rnd.randrange(V)], max(1, min(p["gen_max"], round(rnd.gauss(p["gen_mean"], p["gen_std"])))))
            for i in range(n)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--scale", default="engine", help="part 2 (speed-up vs Vanilla)")
    ap.add_argument("--policy-scale", default="small", help="part 1 (policies; overhead-bound)")
    ap.add_argument("--requests", type=int, default=0, help="override the protocol's request count")
    ap.add_argument("--policy-requests", type=int, default=384)
    ap.add_argument("--policy-layers", type=int, default=0,
                    help="part 1: the models' depth instead of the scale's (e.g. 32, 360M's: a block pass of "
                         "many layers beside a head pass of few, as at App. E's scale)")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--live", type=int, default=0, help="live sequences of the new policy (default 2 x batch)")
    ap.add_argument("--memory-gib", type=float, default=None,
                    help="admit the new policy's live sequences by memory instead (mor.flops.max_batch of this "
                         "budget, the paged cache the rest after the parameters); 0 = the GPU's memory")
    ap.add_argument("--protocol", default="local", help="section of workflows/config/throughput.yaml")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--skip", default="", help="parts to skip, comma-separated: 'policy', 'speedup', 'context'")
    ap.add_argument("--context-scale", default="small", help="part 3 (pass cost at max_len 2048 / 256)")
    ap.add_argument("--models", default="", help="part 2: comma-separated MoR models only (e.g. MoR-4; default all)")
    ap.add_argument("--graphs", choices=["auto", "on", "off"], default="auto",
                    help="static buffers / CUDA graphs per row bucket (auto: on a GPU)")
    ap.add_argument("--buckets", default="",
                    help="row counts padded passes run at: 'batch' (every pass at B rows: a pass costs the same "
                         "whatever rows are live, as a launch-bound GPU pass does) or e.g. 1,2,4,8,16,32 "
                         "(default: the engine's, powers of two, and only where it pads)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    tune_cpu_allocator()
    p = load_protocol(a.protocol)
    dev, dtype = torch.device(a.device), getattr(torch, a.dtype)
    B, live = a.batch, a.live or 2 * a.batch
    memory = None
    if a.memory_gib is not None:
        memory = a.memory_gib * 2**30 if a.memory_gib else torch.cuda.get_device_properties(dev).total_memory
    admit = {"memory_bytes": memory} if memory else {"max_live": live}
    admit["graphs"] = {"auto": None, "on": True, "off": False}[a.graphs]
    buckets = (a.batch,) if a.buckets == "batch" else tuple(int(x) for x in a.buckets.split(",")) if a.buckets else None
    admit["buckets"] = buckets
    global V
    V = load_scales()[a.scale].vocab or V
    max_len = sequence_len(p)  # the throughput job's: one prompt token + gen_max - 1 fed tokens
    torch.manual_seed(0)
    calib = torch.randint(0, V, (8, 64))
    print(f"batch {B}, new policy live sequences {'by memory' if memory else live}, {a.threads} thread(s), {a.device} {a.dtype}, "
          f"gen ~ N({p['gen_mean']}, {p['gen_std']}), row buckets {buckets or 'default'}, graphs {a.graphs}")

    skips = set(a.skip.split(","))
    if "context" not in skips:
        c = context_cost(a.context_scale, a.rounds, dev, dtype)
        lo, hi = sorted(c["seconds"])
        print(f"\n## context at scale {a.context_scale} (Vanilla, 32 requests x 48 tokens, batch 16, graphs on, "
              f"{a.rounds} rounds, attention {c['attention']})")
        print(f"pass seconds max_len {hi} / {lo}: {c['ratio']:.3f} (target <= 1.3; {c['seconds'][hi]:.3f} / "
              f"{c['seconds'][lo]:.3f} s); attention bytes per pass {c['bytes'][hi] / 1e6:.2f} / "
              f"{c['bytes'][lo] / 1e6:.2f} MB; captures inside measured runs {c['captures']}; "
              f"same tokens {c['tokens_equal']}")

    if "policy" not in skips:
        reqs = make_requests(p, a.policy_requests, p["seed"])
        print(f"\n## policies at scale {a.policy_scale}{f' ({a.policy_layers} layers)' if a.policy_layers else ''}, "
              f"{len(reqs)} requests")
        print("model   passes/token new  old    bound Σc/B  Nr/B    new/bound  fill new  fill old  tok/s new/old  "
              "0.9 x passes old/new  pass cost >=32 / <=8 rows")
        for name, cfg in configs(a.policy_scale, a.policy_layers).items():
            m = build(cfg, calib, dev, dtype)
            new_admit = {k: v for k, v in admit.items() if k not in ("graphs", "buckets")}
            res, tps, every = run_policies(m, B, reqs, max_len, dev, dtype, new_admit, admit["graphs"], buckets,
                                           a.rounds, [Request(-1 - i, [1], p["warmup_tokens"]) for i in range(B)])
            agree = token_agreement(res["new"].outputs, res["old"].outputs)
            if dtype == torch.float32:  # in bf16 a row's rounding may follow its pass's row count: a figure
                assert agree == 1.0, "the policies must generate the same tokens (fp32)"
            f = policy_figures(res, tps, every, B)
            caps = realised(res["new"])
            bound = sum(caps) / B
            ppt_new, fill_new = steady(res["new"])
            ppt_old, fill_old = steady(res["old"])
            hi, lo = f["pass_s_full"], f["pass_s_small"]
            print(f"{name:7s} {ppt_new:16.4f}  {ppt_old:.4f} {bound:10.4f}  {cfg.num_recursions / B:.4f}  "
                  f"{ppt_new / bound:9.3f}  {fill_new:8.3f}  {fill_old:8.3f}  {f['speedup']:13.3f}  "
                  f"{f['target_block']:20.3f}  {hi / lo:.3f} ({hi * 1e3:.2f} / {lo * 1e3:.2f} ms, "
                  f"{f['passes_full']} / {f['passes_small']} passes)")
            print(f"{'':7s} realised capacities {tuple(round(c, 3) for c in caps)}; whole run: passes/token "
                  f"new {res['new'].passes_per_token():.4f} old {res['old'].passes_per_token():.4f}, "
                  f"mixed-depth passes {res['new'].mixed_passes()} of {res['new'].block_passes}")
            print(f"{'':7s} tokens equal between the policies: {agree:.4f}; "
                  f"all passes (enter, block, head) old/new {f['target_all'] / 0.9:.3f}; "
                  f"block passes' share of the pass time new {f['block_share_new']:.2f} old {f['block_share_old']:.2f}")

    if "speedup" not in skips:
        reqs = make_requests(p, a.requests or p["requests"], p["seed"])
        cfgs = configs(a.scale)
        if a.models:
            cfgs = {k: v for k, v in cfgs.items() if k in a.models.split(",")}
        names = list(cfgs) + sorted({f"Vanilla-{baseline(c).layers or shape_of(baseline(c)).layers}" for c in cfgs.values()})
        allc = dict(cfgs)
        for c in cfgs.values():
            van = baseline(c)
            allc[f"Vanilla-{van.layers or shape_of(van).layers}"] = van
        models = {n: build(allc[n], calib, dev, dtype) for n in names}
        engines = {n: Engine(models[n], batch=B, max_len=max_len, device=dev, dtype=dtype, **admit) for n in names}
        for eng in engines.values():
            eng.run([Request(-1 - i, [1], p["warmup_tokens"]) for i in range(B)])
        fwd = {n: [] for n in names}
        win = {n: [] for n in names}  # tokens/s in the engine's one window
        last, captures = {}, 0
        rnd = random.Random(1)
        groups: dict[str, list[str]] = {}  # each Vanilla and the MoR models measured against it
        for n, c in cfgs.items():
            groups.setdefault(f"Vanilla-{baseline(c).layers or shape_of(baseline(c)).layers}", []).append(n)
        for rd in range(a.rounds):
            for n in paired_order(groups, rnd, rd):
                t = time.process_time()
                last[n] = engines[n].run(reqs)
                cpu = time.process_time() - t  # CPU seconds of this process: robust to other jobs on a shared CPU
                captures += last[n].captures
                fwd[n].append(last[n].tokens / (cpu if dev.type == "cpu" else last[n].forward_s))
                w = last[n].window(True)
                win[n].append(w["tokens_per_cpu_s"] if dev.type == "cpu" else w["tokens_per_s"])
            print(f"round {rd}: tokens/s whole run / window: " + ", ".join(
                f"{n} {fwd[n][-1]:.0f} / {win[n][-1]:.0f}" for n in names), flush=True)
        print(f"\n## speed-up over the same-depth Vanilla at scale {a.scale}, {len(reqs)} requests, {a.rounds} rounds, "
              f"graphs {a.graphs}; static shapes captured inside the measured runs: {captures}")
        print("measured: whole run (as before); window: the engine's one window (requests waiting or >= 2B live).\n"
              "pass model: a second prediction, FLOPs plus a constant per layer call measured on both runs' block passes\n"
              "(a layer call's seconds = alpha + beta x rows; kappa = alpha / beta, in rows), applied to every pass of both runs\n"
              "rows per pass real/padded: mean rows of each pass kind and the rows it ran at (its row bucket: static shapes\n"
              "pad, step.row_buckets; a CPU's default pads none), in the window and over the whole run. Each round runs every\n"
              "MoR model next to its Vanilla (paired_order).")
        print("model   vs          measured  predicted(realised)  predicted(design)  measured/realised  fill  "
              "passes/token  bound Σc/B  ratio")
        for name, cfg in cfgs.items():
            van = baseline(cfg)
            vname = f"Vanilla-{van.layers or shape_of(van).layers}"
            s, vs, ctx = shape_of(cfg), shape_of(van), p["gen_mean"] / 2
            rc = dataclasses.replace(cfg, router=dataclasses.replace(cfg.router, capacity=realised(last[name])))
            pred_real = decode_flops_per_token(van, vs, V, ctx) / decode_flops_per_token(rc, s, V, ctx)
            pred = decode_flops_per_token(van, vs, V, ctx) / decode_flops_per_token(cfg, s, V, ctx)
            meas = statistics.median(f / g for f, g in zip(fwd[name], fwd[vname]))
            ppt, fill = steady(last[name])
            bound = sum(realised(last[name])) / B
            print(f"{name:7s} {vname:10s}  {meas:8.3f}  {pred_real:19.3f}  {pred:17.3f}  {meas / pred_real:17.3f}  "
                  f"{fill:.3f}  {ppt:12.4f}  {bound:10.4f}  {ppt / bound:.3f}")
            empty = not all(win[name]) or not all(win[vname])  # no pass with requests waiting or >= 2B live
            wmeas = math.nan if empty else statistics.median(f / g for f, g in zip(win[name], win[vname]))
            alpha, beta = pass_fit([(last[k], len(models[k].plan.recursions[0])) for k in (name, vname)])
            kappa = alpha / beta
            pm = pass_units(last[vname], models[vname], kappa) / pass_units(last[name], models[name], kappa)
            pf = pass_units(last[vname], models[vname], 0.0) / pass_units(last[name], models[name], 0.0)
            ts = lambda r: r.pass_cpu_s or r.pass_s  # noqa: E731
            tail = lambda r: sum(t for t, w_, l_ in zip(ts(r), r.waiting, r.live) if w_ == 0 and l_ < 2 * B)  # noqa: E731
            tail_tok = lambda r: r.tokens - r.window(True)["tokens"]  # noqa: E731
            speed = lambda r: tail_tok(r) / tail(r) if tail(r) else math.nan  # noqa: E731 (no drain tail: nan)
            tail_speed = speed(last[name]) / speed(last[vname]) if speed(last[vname]) else math.nan
            window = (f"EMPTY ({len(reqs)} requests at batch {B}: no pass had requests waiting or >= 2B live; "
                      f"run >= 3B = {3 * B} requests)" if empty else
                      f"measured {wmeas:.3f} = {wmeas / pred_real:.3f} of realised-predicted")
            print(f"{'':7s} window: {window}; pass model "
                  f"(kappa {kappa:.1f} rows per layer call): predicted {pm:.3f} (kappa 0: {pf:.3f}), measured/pass model "
                  f"{meas / pm:.3f}; drain tail (no request waiting, < 2B live): {tail(last[name]) / sum(ts(last[name])):.2f} "
                  f"of {name}'s pass time, {tail(last[vname]) / sum(ts(last[vname])):.2f} of {vname}'s, "
                  f"tokens/s there {tail_speed:.3f} x {vname}'s (last round)")
            for n in (name, vname):
                print(f"{'':7s} rows per pass real/padded, {n} (passes x rows; last round): {rows_figure(last[n])}")
            kv = last[name].peak_blocks / last[vname].peak_blocks
            print(f"{'':7s} realised capacities {tuple(round(c, 3) for c in realised(last[name]))}; peak KV blocks "
                  f"{last[name].peak_blocks} = {kv:.3f} of {vname}'s (paper's recursion-wise cost: (Nr+1)/(2Nr) = "
                  f"{(cfg.num_recursions + 1) / (2 * cfg.num_recursions):.3f} of the recursion stack at design capacities)")


if __name__ == "__main__":
    main()
