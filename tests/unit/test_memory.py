"""The memory model (mor.memory) against what autograd really saves, and its micro-batch pick.

Measured with ``torch.autograd.graph.saved_tensors_hooks``: every tensor saved for backward
during one training forward, counted once per storage, parameters and autocast's cached
weight casts (the model's ``weight_casts`` part) left out. Deterministic, unlike RSS."""

import dataclasses

import pytest
import torch
import yaml

from mor.config import ExecConfig, ModelConfig, RouterConfig, RunConfig, TrainConfig, load_scales
from mor.memory import GiB, activation_bytes, divisors, pick_micro_batch, training_memory
from mor.model.transformer import build_model
from mor.train.execution import apply_execution

SCALES = load_scales()
VARIANTS = {
    "vanilla": ModelConfig(scale="small"),
    "recursive": ModelConfig(scale="small", variant="recursive", num_recursions=2),
    "mor-ec": ModelConfig(scale="small", variant="mor", num_recursions=2),
    "mor-ec-3": ModelConfig(scale="small", variant="mor", num_recursions=3),
    "mor-tc": ModelConfig(scale="small", variant="mor", num_recursions=2, router=RouterConfig(type="token_choice")),
}


def is_weight_cast(t: torch.Tensor) -> bool:
    """A parameter cast by autocast (ToCopy of a leaf, perhaps through a transpose/view)."""
    fn = t.grad_fn
    for _ in range(3):
        if fn is None:
            return False
        if fn.name() == "ToCopyBackward0":
            return any(type(f).__name__ == "AccumulateGrad" for f, _ in fn.next_functions if f is not None)
        if fn.name() not in ("TBackward0", "ViewBackward0", "TransposeBackward0", "PermuteBackward0"):
            return False
        fn = fn.next_functions[0][0]
    return False


def saved_activation_bytes(model, x, y, bf16: bool) -> int:
    """Bytes of the distinct storages autograd saves in one forward (parameters and their bf16
    casts excluded: those are the static and weight-cast parts of the model)."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t):
        st = t.untyped_storage()
        if st.data_ptr() not in params and not is_weight_cast(t):
            seen[st.data_ptr()] = st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            model(x, y)
    return sum(seen.values())


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_activations_match_what_autograd_saves(variant):
    """Vanilla and recursive within 3% for both precisions, with and without checkpointing
    and loss chunking, at the CPU scale 'small' (96 wide, 6 layers, vocabulary 4096, 2 x 128
    tokens). Routed variants within 15%: the model assumes the balanced split of tokens over
    depths (as mor.flops does), an untrained token-choice router splits them as it happens to."""
    cfg, shape, vocab, B, T = VARIANTS[variant], SCALES["small"], 4096, 2, 128
    torch.manual_seed(0)
    model = build_model(cfg, shape, vocab)
    model.train()
    x, y = torch.randint(0, vocab, (B, T)), torch.randint(0, vocab, (B, T))
    tol = 0.03 if variant in ("vanilla", "recursive") else 0.15
    for dtype in ("fp32", "bf16"):
        for checkpointing, loss_chunk in ((False, 0), (True, 0), (False, 96), (True, 96)):
            apply_execution(model, "auto", checkpointing, loss_chunk)
            got = saved_activation_bytes(model, x, y, dtype == "bf16")
            want = activation_bytes(cfg, shape, vocab, T, B, 2 if dtype == "bf16" else 4, checkpointing,
                                    loss_chunk)["activations"]
            assert want == pytest.approx(got, rel=tol), (dtype, checkpointing, loss_chunk, got, want)


def test_checkpointing_and_chunking_shrink_what_is_saved():
    cfg, shape, vocab, B, T = VARIANTS["vanilla"], SCALES["small"], 4096, 4, 128
    torch.manual_seed(0)
    model = build_model(cfg, shape, vocab)
    model.train()
    x, y = torch.randint(0, vocab, (B, T)), torch.randint(0, vocab, (B, T))
    sizes = {}
    for ckpt, chunk in ((False, 0), (True, 0), (True, 64)):
        apply_execution(model, "auto", ckpt, chunk)
        sizes[(ckpt, chunk)] = saved_activation_bytes(model, x, y, bf16=True)
    assert sizes[(True, 0)] < sizes[(False, 0)] / 2 and sizes[(True, 64)] < sizes[(True, 0)] / 2


# ------------------------------------------------------------------ paper scales
def paper_run(scale: str, variant: str = "vanilla", global_batch: int = 1024) -> RunConfig:
    model = ModelConfig(scale=scale) if variant == "vanilla" else ModelConfig(scale=scale, variant=variant, num_recursions=3)
    return RunConfig(grid="t", model=model, train=TrainConfig(tokens=10**10, seq_len=2048, global_batch=global_batch,
                                                              micro_batch=16, precision="bf16"))


def test_paper_batch_does_not_fit_80gb_without_execution_settings_and_fits_with_them():
    """The issue's arithmetic: at 16 x 2048 in bf16 without checkpointing 360M needs well over
    80 GB; with checkpointing and a chunked loss every scale fits a micro-batch on 80 GB."""
    s360 = SCALES["360M"]
    plain = training_memory(ModelConfig(scale="360M"), s360, 49152, 2048, 16, world=8)
    assert plain.total > 80e9
    assert plain.logits > 10 * GiB  # the unchunked fp32 logits alone
    lean = ExecConfig(activation_checkpointing=True, loss_chunk=4096)
    for scale, parallel in (("135M", "ddp"), ("360M", "ddp"), ("730M", "ddp"), ("1.7B", "fsdp")):
        fit = pick_micro_batch(paper_run(scale), 49152, 80 * GiB, world=8, parallel=parallel, execution=lean)
        assert fit.fits and fit.micro_batch >= 8, (scale, fit.describe())


def test_fsdp_shards_the_static_part_and_ddp_adds_buckets():
    s, cfg = SCALES["1.7B"], ModelConfig(scale="1.7B")
    one = training_memory(cfg, s, 49152, 2048, 1)
    ddp = training_memory(cfg, s, 49152, 2048, 1, world=8, parallel="ddp")
    fsdp = training_memory(cfg, s, 49152, 2048, 1, world=8, parallel="fsdp")
    assert ddp.static == pytest.approx(one.static * 1.25)  # + 4P of buckets on 16P
    assert fsdp.params == pytest.approx(one.params / 8) and fsdp.optimizer == pytest.approx(one.optimizer / 8)
    assert fsdp.static < ddp.static / 3 and fsdp.activations == one.activations


def test_pick_is_the_largest_fitting_divisor():
    run = paper_run("360M", global_batch=64)
    lean = ExecConfig(activation_checkpointing=True, loss_chunk=4096)
    for gb in (24, 40, 80, 141):
        fit = pick_micro_batch(run, 49152, gb * GiB, world=8, execution=lean)
        assert fit.micro_batch in divisors(8)
        if fit.fits and fit.micro_batch < 8:  # the next divisor up would not fit
            nxt = training_memory(run.model, SCALES["360M"], 49152, 2048, fit.micro_batch * 2, world=8,
                                  checkpointing=True, loss_chunk=4096)
            assert nxt.total > fit.usable
    tiny = pick_micro_batch(paper_run("1.7B"), 49152, 4 * GiB, world=1)
    assert not tiny.fits and tiny.micro_batch == 1 and "DOES NOT FIT" in tiny.describe()


def test_mor_needs_less_activation_memory_than_vanilla_at_the_same_depth():
    s = dataclasses.replace(SCALES["360M"])
    van = activation_bytes(ModelConfig(scale="360M", variant="recursive", num_recursions=3), s, 49152, 2048, 16)
    mor = activation_bytes(ModelConfig(scale="360M", variant="mor", num_recursions=3), s, 49152, 2048, 16)
    assert mor["activations"] < van["activations"]


# ------------------------------------------------------------------ site profiles and the plan
SITES = {"a100-80gb": (312, 80), "h100-80gb": (989, 79.6), "h200": (989, 140.4)}


@pytest.mark.parametrize("site", list(SITES))
def test_a_site_sets_the_mfu_peak_memory_and_throughput_of_every_gpu_entry(site, monkeypatch):
    from mor.launch.presets import DEFAULT_PRESETS, load_presets, load_site

    monkeypatch.delenv("MOR_SITE", raising=False)
    profile = load_site(site)
    assert profile.gpus_per_node == 8 and profile.throughput_source == "assumed until measured" and not profile.measured
    presets = load_presets(DEFAULT_PRESETS, site=site)
    peak, mem = SITES[site]
    for scale in ("135M", "360M", "730M", "1.7B"):
        for kind in ("train", "eval", "lmeval", "throughput"):
            p = presets.get(scale, kind)
            assert (p.peak_tflops_per_gpu, p.gpu_memory_gib) == (peak, mem)
            assert p.tflops_per_gpu == profile.tflops_per_gpu[kind]
    cpu = presets.get("tiny", "train")  # CPU entries keep their own numbers
    assert cpu.peak_tflops_per_gpu == 0 and cpu.tflops_per_gpu == yaml.safe_load(DEFAULT_PRESETS.read_text())["scales"]["tiny"]["train"]["tflops_per_gpu"]
    monkeypatch.setenv("MOR_SITE", site)  # the environment wins over the file's `site:`
    assert load_presets(DEFAULT_PRESETS).site.name == site


def test_the_site_changes_the_plans_gpu_hours_and_micro_batch(monkeypatch):
    from mor.grids import load_grid
    from mor.launch.cost import plan_grid
    from mor.launch.plan import format_plan
    from mor.launch.presets import DEFAULT_PRESETS, load_presets

    monkeypatch.delenv("MOR_SITE", raising=False)
    grid = load_grid("grids/table10.yaml", "cluster")
    by_site = {}
    for site in SITES:
        presets = load_presets(DEFAULT_PRESETS, site=site)
        jobs = plan_grid(grid, presets)
        train = [j for j in jobs if j.kind == "train"]
        assert all(j.fits and j.micro_batch >= 16 and 0 < j.memory_gib < SITES[site][1] for j in train)
        by_site[site] = (sum(j.gpu_hours for j in train), max(j.micro_batch for j in train))
        text = format_plan(grid, jobs, presets)
        assert f"site: {site}" in text and "assumed until measured" in text and "GiB/GPU" in text
    assert by_site["h100-80gb"][0] < by_site["a100-80gb"][0] / 3  # 989 vs 312 peak, 400 vs 120 assumed
    assert by_site["h200"][1] > by_site["h100-80gb"][1]  # more memory, larger micro-batch


def test_plan_warns_where_a_run_does_not_fit(tmp_path, monkeypatch):
    from mor.grids import load_grid
    from mor.launch.cost import plan_grid
    from mor.launch.plan import format_plan
    from mor.launch.presets import load_presets

    monkeypatch.delenv("MOR_SITE", raising=False)
    small = tmp_path / "small-gpu.yaml"
    small.write_text("gpu: T4\ngpu_memory_gib: 4\ngpus_per_node: 4\npeak_tflops_per_gpu: 65\n"
                     "tflops_per_gpu: {train: 20}\nthroughput_source: assumed until measured\n")
    presets_file = tmp_path / "presets.yaml"
    entries = "".join(f"  {scale}:\n    train: {{gpus_per_node: 1, time_min: 600, execution: {{micro_batch: auto}}}}\n"
                      "    eval: {gpus_per_node: 1}\n" for scale in ("135M", "360M", "730M", "1.7B"))
    presets_file.write_text(f"site: {small}\nscales:\n{entries}")
    presets = load_presets(presets_file)
    grid = load_grid("grids/table10.yaml", "cluster")
    text = format_plan(grid, plan_grid(grid, presets), presets)
    assert "WARNING: 22 train job(s) do not fit the GPU's memory even at micro-batch 1" in text
    assert text.count("DOES NOT FIT") == 22


@pytest.mark.parametrize("text, message", [
    ("site: nowhere\nscales: {135M: {train: {gpus_per_node: 1}}}", "site profile not found"),
    ("site: h200\nscales: {135M: {train: {gpus_per_node: 16}}}", "gpus_per_node: 16 > the H200 nodes' 8"),
    ("scales: {135M: {train: {gpus_per_node: 1, execution: {micro_batch: some}}}}", "execution.micro_batch='some'"),
    ("scales: {135M: {train: {gpus_per_node: 1, execution: {checkpointing: true}}}}", "unknown key(s) ['checkpointing']"),
])
def test_bad_sites_and_execution_settings_name_the_key(tmp_path, monkeypatch, text, message):
    from mor.launch.presets import PresetError, load_presets

    monkeypatch.delenv("MOR_SITE", raising=False)
    path = tmp_path / "p.yaml"
    path.write_text(text)
    with pytest.raises(PresetError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        load_presets(path)
