"""The continuous depth-wise batching engine equals decoding each request alone.

For every model variant of grids tables 10, 13, 14 and 15 (mapped to the ``tiny`` scale), a
mixed queue with staggered prompt and generation lengths runs through an engine with fewer
rows per pass than requests; each request's greedy tokens must equal ``decode.generate`` on
its prompt alone (fp32, CPU), token for token. MoR routers get std-1 weights so the causal
decision really sends tokens out early in the engine (asserted), otherwise a model that
never routes would pass trivially. Scheduling is tested on its own: the live sequences stay
at the admission limit while the queue is non-empty, shared-block passes mix depths, and no
request is lost, duplicated or reordered. The paged KV cache holds exactly what the routed
tokens need, equals the decode cache entry by entry with refills at several live
sequences, and a queue larger than the memory is served by waiting and preemption.
No test here times anything: speed is the benchmark's (benchmarks/bench_engine.py).
"""

import dataclasses
import random

import pytest
import torch

import typing

from mor.config import ModelConfig, RouterConfig, Tying
from mor.engine import Engine, Request
from mor.grids import grid_path, load_grid

from helpers.engine import TINY, V, FakeGraphs, make, pass_states, solo, state_deviation

MAX_LEN = 16
GRIDS = ("table10", "table13", "table14", "table15")


def grid_variants() -> list[ModelConfig]:
    """Every distinct model config of the grids, at the tiny scale."""
    seen: dict[ModelConfig, None] = {}
    for name in GRIDS:
        for run in load_grid(grid_path(name), "local").runs:
            seen.setdefault(dataclasses.replace(run.config.model, scale="tiny"))
    return list(seen)


VARIANTS = grid_variants()


def cfg_id(c: ModelConfig) -> str:
    parts = [c.variant, c.tying, f"nr{c.num_recursions}", c.kv]
    if c.variant == "vanilla" and c.reduced:
        parts.append("reduced")
    if c.variant == "mor":
        r = c.router
        parts += [r.type, r.aux if r.type == "expert_choice" else r.balancing, r.func, r.arch, r.gating,
                  f"a{r.alpha}", f"z{r.z_loss_coeff}"]
    return "-".join(str(p) for p in parts)


def requests(n: int, seed: int = 0) -> list[Request]:
    """Staggered prompt (1..6) and generation (1..9) lengths."""
    rnd = random.Random(seed)
    return [Request(i, [rnd.randrange(V) for _ in range(rnd.randint(1, 6))], rnd.randint(1, 9)) for i in range(n)]


def early_exits(res) -> bool:
    """Some recursion ran on fewer tokens than the first one."""
    ran = res.recursion_tokens()
    return len(ran) > 1 and min(ran) < ran[0]


def test_grids_give_many_variants():
    kinds = {(c.variant, c.router.type if c.variant == "mor" else None, c.kv) for c in VARIANTS}
    assert len(VARIANTS) >= 30 and ("mor", "token_choice", "recursion_wise") in kinds
    assert {c.kv for c in VARIANTS} == {"recursion_wise", "shared", "shared_dagger"}


@pytest.mark.parametrize("cfg", VARIANTS, ids=cfg_id)
def test_engine_equals_each_request_generated_alone(cfg):
    reqs = requests(7)
    for seed in range(10):  # the first seed whose routing sends a token out early in the engine
        model = make(cfg, seed)
        res = Engine(model, batch=3, max_len=MAX_LEN).run(reqs)
        if cfg.variant != "mor" or early_exits(res):
            break
    else:
        raise AssertionError(f"no seed makes {cfg_id(cfg)} exit a token early")
    assert sorted(res.outputs) == [r.id for r in reqs]
    for r in reqs:
        assert res.outputs[r.id] == solo(model, r), f"request {r.id}"
    assert res.forward_s > 0 and res.wall_s >= res.forward_s


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "static"])
def test_a_router_that_keeps_every_token_still_weighs_them(graphs):
    """Explicit capacities with recursion 2 at 1: its router drops nothing but its weight still
    gates the recursion (additive gating: out + g), so a block pass runs it too, and its rows
    continue where they share a pass with a dropping router's (a pass once skipped it, gating
    with the previous recursion's weight, and sent such rows out)."""
    cfg = ModelConfig(scale="tiny", variant="mor", tying="middle_cycle", num_recursions=3,
                      router=RouterConfig(capacity=(1.0, 1.0, 0.5), gating="additive"))
    model = make(cfg, 0)
    reqs = requests(7)
    res = Engine(model, batch=3, max_len=MAX_LEN, graphs=graphs).run(reqs)
    assert early_exits(res)
    for r in reqs:
        assert res.outputs[r.id] == solo(model, r), f"request {r.id}"


def test_live_sequences_stay_at_the_limit_while_the_queue_is_not_empty():
    model = make(ModelConfig(scale="tiny", variant="mor", tying="middle_cycle", num_recursions=3,
                             router=RouterConfig(aux="aux_router")))
    batch, reqs = 4, requests(13, seed=1)
    res = Engine(model, batch=batch, max_len=MAX_LEN, max_live=6).run(reqs)
    assert res.max_live == 6 and len(res.occupancy) == res.steps == len(res.waiting)
    busy = [occ for occ, w, k in zip(res.occupancy, res.waiting, res.kinds) if w > 0 and k == "block"]
    assert len(busy) > 10 and all(occ == 1.0 for occ in busy)  # every shared-block pass while requests wait
    assert res.waiting[-1] == 0 and min(res.occupancy) < 1.0  # the queue drained, then sequences finished
    assert all(n <= batch for n in res.rows)


def test_no_request_lost_or_duplicated_and_fifo_admission():
    model = make(ModelConfig(scale="tiny", variant="mor", tying="cycle", num_recursions=2, kv="shared"))
    reqs = requests(11, seed=2) + [Request(11, [3], 0)]  # one with nothing to generate
    res = Engine(model, batch=4, max_len=MAX_LEN).run(reqs)
    assert sorted(res.outputs) == list(range(12)) and not res.rejected and not res.preempted
    assert [len(res.outputs[r.id]) for r in reqs] == [r.max_new_tokens for r in reqs]
    assert res.admitted == list(range(11))  # FIFO, each once (the empty request takes no slot)
    assert res.tokens == sum(r.max_new_tokens for r in reqs)


def test_static_cache_is_never_reallocated_and_misuse_fails():
    model = make(ModelConfig(scale="tiny", variant="mor", tying="middle_cycle", num_recursions=3, kv="shared_dagger"))
    eng = Engine(model, batch=2, max_len=MAX_LEN)
    ptrs = (eng.cache.k.data_ptr(), eng.cache.v.data_ptr())
    eng.run(requests(5))
    assert ptrs == (eng.cache.k.data_ptr(), eng.cache.v.data_ptr())
    assert eng.blocks.used == 0  # every finished sequence gave its blocks back
    with pytest.raises(ValueError, match="max_len"):
        eng.run([Request(0, [1] * 10, MAX_LEN)])
    with pytest.raises(ValueError, match="unique"):
        eng.run([Request(0, [1], 2), Request(0, [2], 2)])


def reference_kv(model, prompt: list[int], out: list[int]):
    """decode.prefill + decode_step's cache after feeding prompt + out[:-1]."""
    from mor.model.decode import decode_step, prefill

    cache, _ = prefill(model, torch.tensor([prompt]), MAX_LEN)
    with torch.no_grad():
        for tok in out[:-1]:
            decode_step(model, cache, torch.tensor([tok]))
    ref = {}
    for e, s in cache.slots.items():
        if cache.specs[e].kind == "dagger":
            s.mirror(cache.slots[cache.specs[e].source])
        n = int(s.length[0])
        ref[e] = (s.k[0, :, :n].transpose(0, 1), s.v[0, :, :n].transpose(0, 1))  # (n, Hkv, hd) each
    return ref


def assert_kv_equal(got, ref, what: str) -> set[int]:
    assert sorted(got) == sorted(ref), what
    for e in ref:
        assert got[e][0].shape == ref[e][0].shape, f"{what} e{e}: {got[e][0].shape[0]} entries, decode has {ref[e][0].shape[0]}"
        torch.testing.assert_close(got[e][0], ref[e][0], rtol=1e-5, atol=1e-6, msg=f"{what} keys e{e}")
        torch.testing.assert_close(got[e][1], ref[e][1], rtol=1e-5, atol=1e-6, msg=f"{what} values e{e}")
    return {g[0].shape[0] for g in got.values()}


@pytest.mark.parametrize("kv", ["recursion_wise", "shared", "shared_dagger"])
def test_engine_cache_rows_equal_the_decode_cache(kv):
    """Beyond the greedy tokens: as a request finishes, its blocks hold the keys and values
    ``decode.prefill`` + ``decode_step`` cache for the same tokens (a stale or missing write
    that does not flip an argmax still fails here)."""
    model = make(ModelConfig(scale="tiny", variant="mor", tying="middle_cycle", num_recursions=3, kv=kv,
                             router=RouterConfig(aux="aux_router")))
    req = Request(0, [3, 1, 4, 1, 5], 10)
    eng = Engine(model, batch=1, max_len=MAX_LEN, block_size=4)
    got = {}
    out = eng.run([req], on_finish=lambda rid, slot: got.update(eng.sequence_kv(slot))).outputs[0]
    lengths = assert_kv_equal(got, reference_kv(model, req.prompt, out), "request 0")
    if kv == "recursion_wise":  # tokens exited early: deeper layers hold fewer of them
        assert len(lengths) > 1


@pytest.mark.parametrize("kv", ["recursion_wise", "shared_dagger"])
def test_kv_contents_with_refills_at_several_live_sequences(kv):
    """Nine requests through 3 live sequences and 2 rows per pass, blocks of 4 entries: freed
    slots and blocks are refilled while other sequences are mid-generation, and every
    request's KV still equals the decode cache of that request alone."""
    model = make(ModelConfig(scale="tiny", variant="mor", tying="middle_cycle", num_recursions=3, kv=kv,
                             router=RouterConfig(aux="aux_router")))
    reqs = requests(9, seed=3)
    eng = Engine(model, batch=2, max_len=MAX_LEN, max_live=3, block_size=4)
    seen = {}
    res = eng.run(reqs, on_finish=lambda rid, slot: seen.__setitem__(rid, eng.sequence_kv(slot)))
    assert max(res.live) == 3 and res.mixed_passes() > 0
    assert len(res.admitted) == 9 and sorted(seen) == [r.id for r in reqs if r.max_new_tokens > 0]
    for r in reqs:
        assert res.outputs[r.id] == solo(model, r), f"request {r.id}"
        assert_kv_equal(seen[r.id], reference_kv(model, r.prompt, res.outputs[r.id]), f"request {r.id}")


MIXED = {
    "expert_choice": ModelConfig(scale="tiny", variant="mor", tying="middle_cycle", num_recursions=3,
                                 router=RouterConfig(aux="aux_router")),
    "token_choice": ModelConfig(scale="tiny", variant="mor", tying="middle_cycle", num_recursions=3,
                                router=RouterConfig(type="token_choice", func="softmax", alpha=1.0)),
    "sequence_tying": ModelConfig(scale="tiny", variant="mor", tying="sequence", num_recursions=2, kv="shared",
                                  router=RouterConfig(aux="aux_router")),
    "lora": ModelConfig(scale="tiny", variant="mor", tying="middle_cycle", num_recursions=3, kv="shared",
                        relaxation="lora", relaxation_rank=2, router=RouterConfig(aux="aux_router")),
    "dora": ModelConfig(scale="tiny", variant="mor", tying="middle_cycle", num_recursions=3, kv="shared",
                        relaxation="dora", relaxation_rank=2, router=RouterConfig(aux="aux_router")),
    "recursion_pe": ModelConfig(scale="tiny", variant="mor", tying="middle_cycle", num_recursions=3,
                                relaxation="recursion_pe", router=RouterConfig(aux="aux_router")),
}


@pytest.mark.parametrize("name", list(MIXED))
def test_shared_block_passes_mix_depths(name):
    """Rows from two or more recursion depths run in one shared-block pass (counted), and the
    outputs still equal decode.generate: each row's recursion picked its KV region, router,
    LoRA / DoRA adapter and recursion PE. Relaxation parameters are perturbed so that every
    recursion's adapter differs (at init LoRA / DoRA / PE are the identity)."""
    reqs = requests(9)
    for seed in range(10):  # the first seed whose routers send some tokens deep, others out early
        model = make(MIXED[name], seed)
        if model.relax is not None:
            with torch.no_grad():
                for p in model.relax.parameters():
                    p.add_(torch.randn_like(p) * 0.5)
        res = Engine(model, batch=3, max_len=MAX_LEN).run(reqs)
        if res.mixed_passes() >= 3:
            break
    assert res.mixed_passes() >= 3 and early_exits(res) and min(res.recursion_tokens()) > 0
    for r in reqs:
        assert res.outputs[r.id] == solo(model, r), f"request {r.id}"
    lock = Engine(model, batch=3, max_len=MAX_LEN, policy="lockstep").run(reqs)
    assert lock.mixed_passes() == 0 and lock.outputs == res.outputs


def test_padded_passes_equal_unpadded():
    """Rows padded to fixed sizes (the GPU default): padded rows write the trash block only."""
    model = make(MIXED["expert_choice"])
    reqs = requests(7)
    a = Engine(model, batch=3, max_len=MAX_LEN, pad=False).run(reqs)
    b = Engine(model, batch=3, max_len=MAX_LEN, pad=True).run(reqs)
    assert a.outputs == b.outputs == {r.id: solo(model, r) for r in reqs}


@pytest.mark.parametrize("name", ["expert_choice", "token_choice", "sequence_tying", "lora"])
def test_static_buffers_equal_outputs_and_are_reused(monkeypatch, name):
    """The graph path (static buffers per row bucket, CUDA graphs on a GPU) run on the CPU
    at a GPU's row buckets (1, 2, 4: padded rows beside real ones): the tokens equal
    decode.generate, and every pass of one shape reads its inputs from and returns its
    outputs in the same storage (the buffers a CUDA graph replays over)."""
    from mor.engine.graphs import StaticPass
    from mor.engine.shapes import row_buckets

    seen: dict[int, set] = {}
    run = StaticPass.run

    def spy(self, arrays):
        out = run(self, arrays)
        leaves = [t for t in (out if isinstance(out, tuple) else (out,)) if t is not None]
        seen.setdefault(id(self), set()).add((self.inp.data_ptr(), *(t.data_ptr() for t in leaves)))
        return out

    monkeypatch.setattr(StaticPass, "run", spy)
    reqs = requests(7)
    for seed in range(10):  # sequence tying: the first seed whose block passes mix both unique layers
        seen.clear()
        model = make(MIXED[name], seed)
        eng = Engine(model, batch=4, max_len=MAX_LEN, graphs=True, buckets=row_buckets(4, device="cuda"))
        res = eng.run(reqs)
        if name != "sequence_tying" or res.mixed_passes() > 0:
            break
    assert res.outputs == {r.id: solo(model, r) for r in reqs}
    assert res.outputs == Engine(model, batch=4, max_len=MAX_LEN, graphs=False).run(reqs).outputs  # the eager path
    assert eng.stepper.static and all(len(ptrs) == 1 for ptrs in seen.values())
    assert max(sp.runs for sp in eng.stepper.static.values()) > 5  # buffers reused, not remade
    kinds = {k[0] for k in eng.stepper.static}
    assert {"enter", "head", "block"} <= kinds  # sequence tying's block passes too (one index vector per layer)
    blocks = [sp for k, sp in eng.stepper.static.items() if k[0] == "block"]
    assert sum(sp.runs - 1 for sp in blocks) == res.block_passes  # every block pass over static buffers (+ warm-up)
    assert res.captures == 0  # every shape captured before the run's first pass
    assert name != "sequence_tying" or res.mixed_passes() > 0  # rows of both unique layers in one pass
    assert len(eng.stepper.static) <= 3 * 3 + 3  # one entry per kind and row bucket (1, 2, 4)
    assert any(N > n for N, n in zip(res.padded, res.rows))  # some pass ran padded rows


def test_row_buckets_follow_the_device():
    """Default row buckets: a GPU's are nano-vllm's capture sizes (1, 2, 4, 8, then every 16)
    and the batch; a CPU runs every row count (a padded row costs its compute there, and
    there is no capture to amortise), so a static pass on a CPU pads no rows and the result
    says so pass by pass (EngineResult.padded, rows_per_pass)."""
    from mor.engine.shapes import row_buckets

    assert row_buckets(32, device="cuda") == (1, 2, 4, 8, 16, 32)
    assert row_buckets(51, device="cuda") == (1, 2, 4, 8, 16, 32, 48, 51)
    assert row_buckets(3, device="cuda") == (1, 2, 3)
    assert row_buckets(5, device="cpu") == (1, 2, 3, 4, 5)
    assert row_buckets(32, device="cpu", compiled=True) == row_buckets(32)  # a compilation per shape: few
    assert row_buckets(5, (2, 5), "cpu") == (2, 5)  # given buckets win on any device
    model = make(MIXED["expert_choice"])
    reqs = requests(7)
    res = Engine(model, batch=4, max_len=MAX_LEN, graphs=True).run(reqs)
    assert res.padded == res.rows and min(res.rows) < 4  # partial passes, none padded
    padded = Engine(model, batch=4, max_len=MAX_LEN, graphs=True, buckets=(4,)).run(reqs)
    assert {N for k, N in zip(padded.kinds, padded.padded) if k != "prefill"} == {4} and padded.rows == res.rows
    per = padded.rows_per_pass(False)
    assert per["block"][2] == 4 and per["block"][1] < 4 and per["block"][0] == padded.block_passes


@pytest.mark.parametrize("graphs", [False, True], ids=["padded", "static"])
def test_one_row_bucket_runs_every_pass_at_the_batch(monkeypatch, graphs):
    """buckets=(B,): every pass, whatever rows are live, runs at B rows (one static shape per
    pass kind, the flat-cost pass of a launch-bound GPU), and the tokens do not change."""
    from mor.engine.step import Stepper

    shapes = []
    for name in ("_enter", "_block", "_head"):
        fn = getattr(Stepper, name)

        def spy(self, idx, *a, _fn=fn, **k):
            shapes.append(idx.shape[0])
            return _fn(self, idx, *a, **k)

        monkeypatch.setattr(Stepper, name, spy)
    model = make(MIXED["expert_choice"])
    reqs = requests(7)
    eng = Engine(model, batch=4, max_len=MAX_LEN, graphs=graphs, buckets=(4,))
    res = eng.run(reqs)
    assert res.outputs == {r.id: solo(model, r) for r in reqs}
    assert min(res.rows[i] for i, k in enumerate(res.kinds) if k == "block") < 4  # some passes had fewer rows
    assert shapes and set(shapes) == {4}
    if graphs:
        assert sorted({k[:2] for k in eng.stepper.static}) == [("block", 4), ("enter", 4), ("head", 4)]


@pytest.mark.parametrize("buckets, why", [((), "ascending"), ((4, 2), "ascending"), ((0, 4), "ascending"),
                                          ((1, 2), "stop below the batch")])
def test_bad_row_buckets_are_refused(buckets, why):
    with pytest.raises(ValueError, match=why):
        Engine(make(MIXED["expert_choice"]), batch=4, max_len=MAX_LEN, buckets=buckets)


def _static_shapes_only(gm, inputs):
    """An aot backend that refuses a graph with a data-dependent shape (a boolean mask index,
    nonzero: an unbacked size) or a value the host reads back (a symbolic scalar): what a
    CUDA graph cannot capture."""
    bad = []
    for node in gm.graph.nodes:
        val = node.meta.get("val")
        for t in val if isinstance(val, (tuple, list)) else [val]:
            if isinstance(t, torch.Tensor) and not all(isinstance(d, int) for d in t.shape):
                bad.append(f"{node.target}: shape {tuple(t.shape)}")
            elif isinstance(t, (torch.SymInt, torch.SymFloat, torch.SymBool)):
                bad.append(f"{node.target}: a host scalar")
    assert not bad, "not capturable: " + "; ".join(bad[:3])
    return gm.forward


@pytest.mark.slow
@pytest.mark.parametrize("name", ["expert_choice", "token_choice", "sequence_tying"])
def test_static_passes_trace_as_one_graph_each(monkeypatch, name):
    """What a CUDA graph capture needs, checked on the CPU: every function a StaticPass would
    capture traces as ONE graph (torch.compile fullgraph=True: no graph break) whose every
    shape is static (no boolean mask index or nonzero, no value read back to the host;
    _static_shapes_only), sampling rows included; and the traced passes give the eager
    path's tokens."""
    from torch._dynamo.backends.common import aot_autograd

    from mor.engine.graphs import StaticPass

    init, backend = StaticPass.__init__, aot_autograd(fw_compiler=_static_shapes_only)

    def traced(self, shapes, fn, *a, **k):
        init(self, shapes, torch.compile(fn, fullgraph=True, backend=backend, dynamic=False), *a, **k)

    torch._dynamo.reset()
    monkeypatch.setattr(StaticPass, "__init__", traced)
    model = make(MIXED[name])
    rnd = random.Random(0)
    reqs = [Request(i, [rnd.randrange(V) for _ in range(rnd.randint(1, 4))], rnd.randint(1, 7),
                    temperature=0.7 if i % 2 else 0.0, top_p=0.9, seed=i) for i in range(7)]
    eng = Engine(model, batch=4, max_len=MAX_LEN, graphs=True)
    with torch._dynamo.config.patch(cache_size_limit=256):  # one compiled entry per static shape
        res = eng.run(reqs)
    assert {k[0] for k in eng.stepper.static} == {"enter", "block", "head"}
    monkeypatch.undo()
    assert res.outputs == Engine(model, batch=4, max_len=MAX_LEN, graphs=False).run(reqs).outputs


@pytest.mark.parametrize("backend", ["aot_eager", pytest.param("inductor", marks=pytest.mark.slow)])
def test_compiled_passes_equal_decode(backend):
    """torch.compile of the passes' device part (padded rows: a few fixed shapes) gives the same
    tokens. 'aot_eager' checks the trace; 'inductor' (the GPU default) also generates code and
    is skipped where no C++ compiler is found."""
    import shutil

    if backend == "inductor" and shutil.which("g++") is None and shutil.which("c++") is None:
        pytest.skip("inductor needs a C++ compiler on CPU")
    torch._dynamo.reset()
    model = make(MIXED["expert_choice"])
    reqs = requests(5)
    res = Engine(model, batch=4, max_len=MAX_LEN, pad=True, compile=backend).run(reqs)
    assert res.mixed_passes() > 0
    assert res.outputs == {r.id: solo(model, r) for r in reqs}


@pytest.mark.parametrize("kv", ["recursion_wise", "shared", "shared_dagger"])
def test_paged_cache_peak_is_what_the_routed_tokens_need(kv):
    """One request alone, blocks of 4 entries: the peak number of blocks equals the sum over
    layers of ceil(tokens routed to that layer / 4), from the decode cache's lengths, and is
    below a full-length cache's for recursion-wise caching; after the run nothing is held."""
    model = make(ModelConfig(scale="tiny", variant="mor", tying="middle_cycle", num_recursions=3, kv=kv,
                             router=RouterConfig(aux="aux_router")))
    req = Request(0, [3, 1, 4, 1, 5], 11)
    eng = Engine(model, batch=1, max_len=MAX_LEN, block_size=4)
    res = eng.run([req])
    ref = reference_kv(model, req.prompt, res.outputs[0])
    need = sum(-(-k.shape[0] // 4) for k, _ in ref.values())
    assert res.peak_blocks == need == max(res.blocks)
    full = len(ref) * -(-(len(req.prompt) + req.max_new_tokens - 1) // 4)
    assert need < full if kv == "recursion_wise" else need == full
    assert eng.blocks.used == 0


def test_a_queue_larger_than_memory_is_served_completely():
    """Blocks for about one full-length sequence, up to six live: sequences wait for blocks and
    are preempted (recomputed on readmission) as their KV grows; every request comes back
    exactly once with the tokens it gets alone. A request that can never fit is rejected on
    its own, with its id in the message, and the others are served."""
    model = make(MIXED["expert_choice"])
    reqs = [Request(i, [(7 * i) % V, (3 * i + 1) % V], 9 + i % 4) for i in range(14)]
    big = Request(99, [1] * 3, MAX_LEN - 2)
    eng = Engine(model, batch=3, max_len=MAX_LEN, max_live=6, num_blocks=36, block_size=2)
    assert eng.blocks.worst_case(3 + MAX_LEN - 3) == 40 > 36 >= eng.blocks.worst_case(2 + 12 - 1)
    res = eng.run(reqs + [big])
    assert res.preempted, "the test should force preemption"
    assert list(res.rejected) == [99] and "request 99" in res.rejected[99]
    assert sorted(res.outputs) == [r.id for r in reqs]
    for r in reqs:
        assert res.outputs[r.id] == solo(model, r), f"request {r.id}"
    assert sorted(set(res.admitted)) == [r.id for r in reqs]
    assert len(res.admitted) == len(reqs) + len(res.preempted)
    assert eng.blocks.used == 0 and max(res.blocks) <= 36


TYINGS = typing.get_args(Tying)
ROUTERS = {"expert_choice": RouterConfig(aux="aux_router"),
           "token_choice": RouterConfig(type="token_choice", func="softmax", alpha=1.0)}


@pytest.mark.parametrize("graphs", [False, True], ids=["padded", "static"])
@pytest.mark.parametrize("tying", TYINGS)
@pytest.mark.parametrize("router", list(ROUTERS))
def test_no_host_sync_inside_a_pass(monkeypatch, tying, router, graphs):
    """Inside the device part of enter / block / head nothing reads a tensor back to the host
    (.item, .tolist, .numpy, .cpu, bool(), int(), float()) and nothing crosses devices
    (.to with a device or tensor, torch.tensor / torch.from_numpy of host data): the host's
    part of a pass uploads what it needs in ONE copy (counted), the decisions the scheduler
    needs are read after the next pass is launched (one pass outstanding, at most). The host
    part of a pass may upload but never reads a tensor back either (a read there would stall
    the device as surely). Padded passes and the static path (graphs: the passes a GPU
    captures, whose one copy goes into the shape's input buffer)."""
    from mor.engine.engine import Readback
    from mor.engine.graphs import StaticPass
    from mor.engine.step import Stepper

    def forbid(*a, **k):
        raise AssertionError("host sync inside a pass")

    real_to = torch.Tensor.to

    def to(self, *a, **k):
        if "device" in k or any(isinstance(x, (torch.device, str, torch.Tensor)) for x in a):
            raise AssertionError(f"device transfer inside a pass: .to{a}")
        return real_to(self, *a, **k)

    cfg = ModelConfig(scale="tiny", variant="mor", tying=tying, num_recursions=2 if "sequence" in tying else 3,
                      kv="shared" if "sequence" in tying else "recursion_wise", router=ROUTERS[router])
    passes, uploads, outstanding, launched_pending = [0], [0], [0], [0]
    for name in ("_enter", "_block", "_head"):
        fn = getattr(Stepper, name)

        def wrapped(self, *a, _fn=fn, **k):
            with monkeypatch.context() as m:
                for attr in ("item", "tolist", "numpy", "cpu", "__bool__", "__int__", "__float__", "__index__"):
                    m.setattr(torch.Tensor, attr, forbid)
                m.setattr(torch.Tensor, "to", to)
                m.setattr(torch, "tensor", forbid)
                m.setattr(torch, "from_numpy", forbid)
                return _fn(self, *a, **k)

        monkeypatch.setattr(Stepper, name, wrapped)
    for name in ("enter", "block", "head"):
        fn = getattr(Stepper, name)

        def outer(self, *a, _fn=fn, **k):
            passes[0] += 1
            launched_pending[0] += outstanding[0] > 0
            assert outstanding[0] <= 1
            with monkeypatch.context() as m:  # the host part too: it may upload, never read back
                for attr in ("item", "tolist", "numpy", "cpu", "__bool__", "__int__", "__float__", "__index__"):
                    m.setattr(torch.Tensor, attr, forbid)
                return _fn(self, *a, **k)

        monkeypatch.setattr(Stepper, name, outer)
    up, start, get = Stepper._upload, Readback.start, Readback.get
    monkeypatch.setattr(Stepper, "_upload", lambda self, arrays: (uploads.__setitem__(0, uploads[0] + 1), up(self, arrays))[1])
    load = StaticPass._load  # the static path's one copy into its pass's input buffer
    monkeypatch.setattr(StaticPass, "_load", lambda self, arrays: (uploads.__setitem__(0, uploads[0] + 1), load(self, arrays))[1])

    def counted_start(self, *a):
        h = start(self, *a)
        outstanding[0] += 1
        return h

    def counted_get(h):
        outstanding[0] -= 1
        return get(h)

    monkeypatch.setattr(Readback, "start", counted_start)
    monkeypatch.setattr(Readback, "get", staticmethod(counted_get))
    reqs = requests(9)
    for seed in range(10):  # the first seed whose passes mix depths
        model = make(cfg, seed)
        eng = Engine(model, batch=3, max_len=MAX_LEN, pad=True, graphs=graphs)
        eng.warmup()  # static shapes captured first (their passes are not the run's)
        passes[0] = uploads[0] = launched_pending[0] = 0
        res = eng.run(reqs)
        if res.mixed_passes() > 0:
            break
    assert res.tokens == sum(r.max_new_tokens for r in reqs) and res.mixed_passes() > 0
    assert uploads[0] == passes[0] == sum(k != "prefill" for k in res.kinds)  # one upload per pass
    assert launched_pending[0] > 0  # some passes launched before the previous one's results were read
    monkeypatch.undo()
    assert res.outputs == {r.id: solo(model, r) for r in reqs}


@pytest.mark.parametrize("graphs", [False, True], ids=["padded", "static"])
def test_gpu_pass_clock_starts_when_the_pass_launches(monkeypatch, graphs):
    """On a GPU a pass's start event is recorded when its device work starts (the upload),
    after the host planned it, so a pass planned while the device idled does not count its
    planning. Run on the CPU with the clock's CUDA branch and a stand-in event that records
    which phase of the pass the host was in: every decoding pass's start is in 'device'
    (before the fix it was recorded before the stepper was even called: 'between')."""
    from mor.engine import engine as eng_mod
    from mor.engine.step import Stepper

    phase = ["between"]

    class Event:
        def __init__(self, enable_timing=False):
            self.at = None

        def record(self):
            self.at = phase[0]

        def synchronize(self):
            pass

        def elapsed_time(self, other):
            return 0.0

    monkeypatch.setattr(torch.cuda, "Event", Event)
    init = eng_mod.PassClock.__init__

    def cuda_clock(self, device):
        init(self, device)
        self.cuda = True
        clocks.append(self)

    clocks = []
    monkeypatch.setattr(eng_mod.PassClock, "__init__", cuda_clock)
    for name in ("enter", "block", "head"):
        fn = getattr(Stepper, name)

        def outer(self, *a, _fn=fn, **k):
            phase[0] = "host"
            try:
                return _fn(self, *a, **k)
            finally:
                phase[0] = "between"

        monkeypatch.setattr(Stepper, name, outer)
    for name in ("_upload", "_static"):
        fn = getattr(Stepper, name)

        def device(self, *a, _fn=fn, **k):
            phase[0] = "device"
            return _fn(self, *a, **k)

        monkeypatch.setattr(Stepper, name, device)
    model = make(MIXED["expert_choice"])
    res = Engine(model, batch=3, max_len=MAX_LEN, pad=True, graphs=graphs).run(requests(7))
    (clock,) = clocks
    starts = [a.at for (a, _), k in zip(clock.marks, res.kinds) if k != "prefill"]
    assert len(starts) == sum(k != "prefill" for k in res.kinds) > 10
    assert set(starts) == {"device"}


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "static"])
def test_a_deleted_engine_frees_its_kv_pool_at_once(graphs):
    """The stepper's pass functions (static passes, compiled ones) close over it; a deleted
    engine releases them, so its KV pool is freed by reference counts, not when the collector
    next runs (on a GPU a second engine asks for the same memory)."""
    import gc
    import weakref

    model = make(MIXED["expert_choice"])
    gc.disable()
    try:
        eng = Engine(model, batch=3, max_len=MAX_LEN, graphs=graphs)
        eng.run(requests(5))
        assert not graphs or eng.stepper.static  # the static passes exist to be released
        pool, stepper = weakref.ref(eng.cache.k), weakref.ref(eng.stepper)
        del eng
        assert stepper() is None and pool() is None
    finally:
        gc.enable()


def test_variable_length_prompts_are_prefilled_together():
    """Prompts of 2..6 tokens admitted together are prefilled in one pass (right-padded, up to
    B of them): fewer prefill passes than prompts, and the tokens and KV still equal decoding
    each request alone."""
    model = make(ModelConfig(scale="tiny", variant="mor", tying="middle_cycle", num_recursions=3,
                             router=RouterConfig(aux="aux_router")))
    reqs = [Request(i, [(5 * i + j) % V for j in range(2 + i % 5)], 4 + i % 3) for i in range(8)]
    eng = Engine(model, batch=4, max_len=MAX_LEN, max_live=8)
    seen = {}
    res = eng.run(reqs, on_finish=lambda rid, slot: seen.__setitem__(rid, eng.sequence_kv(slot)))
    pre = [n for k, n in zip(res.kinds, res.rows) if k == "prefill"]
    assert pre == [4, 4]  # 8 prompts admitted at once, B = 4 per prefill pass
    for r in reqs:
        assert res.outputs[r.id] == solo(model, r), f"request {r.id}"
        assert_kv_equal(seen[r.id], reference_kv(model, r.prompt, res.outputs[r.id]), f"request {r.id}")


STATE_TOL = 1e-5  # fp32: padded rows, wider tables and another summation order, nothing more


PADDING = (2, 4)  # row buckets of the state checks: 1 and 3 live rows run padded, as a GPU's 1, 2, 4, 8 ... do


def _graph_states(model, reqs, warmup: bool, batch: int = 3):
    """(engine, FakeGraphs, its states after every pass) of the static path driven through its
    device branch on the CPU (helpers.engine.FakeGraphs), at row buckets that pad (a CPU's own
    pad nothing, a GPU's do), and the eager path's states."""
    eager = Engine(model, batch=batch, max_len=MAX_LEN, graphs=False, pad=False)
    want = pass_states(eager)
    eager.run(reqs)
    eng = Engine(model, batch=batch, max_len=MAX_LEN, graphs=True, warmup=warmup, buckets=PADDING)
    fake = eng.stepper.graph_backend = FakeGraphs(eng.stepper)
    if warmup:
        eng.warmup()  # before the record: its passes run over padding rows only
    got = pass_states(eng)
    res = eng.run(reqs)
    return res, fake, state_deviation(got, want)


@pytest.mark.parametrize("tying", TYINGS)
@pytest.mark.parametrize("router", list(ROUTERS))
def test_captured_passes_leave_the_eager_state(tying, router):
    """Capture checked by state, not only by tokens: StaticPass's device branch (warm-up,
    state restore, capture, replay) driven by a CPU double of the CUDA graph, shapes captured
    lazily inside the run (the branch a capture bug hides in); after every pass the hidden
    state, router weights, token-choice state and the KV pool equal the eager path's within
    fp32 rounding (helpers.engine.state_deviation), and the tokens equal decode.generate."""
    cfg = ModelConfig(scale="tiny", variant="mor", tying=tying, num_recursions=2 if "sequence" in tying else 3,
                      kv="shared" if "sequence" in tying else "recursion_wise", router=ROUTERS[router])
    model = make(cfg)
    reqs = requests(9)
    res, fake, dev = _graph_states(model, reqs, warmup=False)
    assert res.captures == len(fake.graphs) > 3 and sum(g.replays for g in fake.graphs) == res.steps - res.kinds.count("prefill")
    assert sum(p > r for p, r in zip(res.padded, res.rows)) > 0  # the state above was checked over padded passes
    assert {p for k, p in zip(res.kinds, res.padded) if k != "prefill"} <= set(PADDING)
    assert dev <= STATE_TOL, f"state after a captured pass differs from the eager path's by {dev:.3g}"
    assert res.outputs == {r.id: solo(model, r) for r in reqs}


def test_a_capture_that_applies_its_warm_up_fails_the_state_check(monkeypatch):
    """The planted mutant: StaticPass skips the state restore after its warm-up run, so the
    first pass of every new shape is applied twice. The tokens of a tiny model may still
    match; the state check must not."""
    from mor.engine.graphs import StaticPass

    model = make(MIXED["expert_choice"])
    reqs = requests(9)
    monkeypatch.setattr(StaticPass, "_restore", lambda self, saved: None)
    _, _, dev = _graph_states(model, reqs, warmup=False)
    assert dev > 100 * STATE_TOL


@pytest.mark.parametrize("name", ["expert_choice", "token_choice", "sequence_tying"])
def test_every_shape_is_captured_before_the_measured_run(name):
    """Engine.warmup captures every static shape (Stepper.shapes: each kind, row bucket, table
    width, continuation and sampling), largest first, over padding rows only (the run after it
    gives the eager path's state pass by pass); the measured run captures nothing (counted by
    the graph double's captures, and EngineResult.captures), greedy and sampling requests
    alike. Without warm-up the same run captures inside itself: the count is live."""
    model = make(MIXED[name])
    reqs = requests(9) + [Request(100 + i, [i + 1], 5, temperature=0.8, top_p=0.9, seed=i) for i in range(3)]
    eng = Engine(model, batch=3, max_len=MAX_LEN, graphs=True)
    fake = eng.stepper.graph_backend = FakeGraphs(eng.stepper)
    assert eng.warmup() == len(fake.graphs) == len(eng.stepper.shapes()) and eng.warmup() == 0
    keys = list(eng.stepper.static)
    assert keys == eng.stepper.shapes() and keys[0][1] == max(k[1] for k in keys)  # largest first
    res = eng.run(reqs)
    assert res.captures == 0 and len(fake.graphs) == len(keys)
    assert res.outputs == Engine(model, batch=3, max_len=MAX_LEN, graphs=False).run(reqs).outputs
    lazy = Engine(model, batch=3, max_len=MAX_LEN, graphs=True, warmup=False)
    assert lazy.run(reqs).captures > 0
    if name == "expert_choice":  # warm-up leaves every sequence's state alone
        _, _, dev = _graph_states(model, requests(9), warmup=True)
        assert dev <= STATE_TOL
