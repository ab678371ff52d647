"""Tied-layer initialisation and up-training from HF-layout (SmolLM) checkpoints."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from mor.config import ConfigError, ModelConfig, ScaleShape
from mor.checkpoints.hf import (
    InitCheckpointError,
    init_from_checkpoint,
    resolve_checkpoint,
    vanilla_layer_sources,
    write_llama_checkpoint,
)
from mor.model.transformer import build_model
from mor.model.tying import tying_plan, vanilla_plan

# 8 layers so Cycle / Sequence / Middle-* all have something to choose from
SHAPE = ScaleShape(name="t8", hidden=32, layers=8, heads=4, kv_heads=2, mlp=48, vocab=0, max_seq_len=64)
V = 40


def vanilla(seed=0, shape=SHAPE):
    torch.manual_seed(seed)
    return build_model(ModelConfig(scale=shape.name), shape, V).eval()


def model_of(variant="recursive", tying="cycle", nr=2, seed=1, **kw):
    torch.manual_seed(seed)
    return build_model(ModelConfig(scale="t8", variant=variant, tying=tying, num_recursions=nr, **kw), SHAPE, V).eval()


def logits(model, seed=3):
    x = torch.randint(0, V, (2, 12), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        return model(x).logits


# --------------------------------------------------------------------------------- mapping
def test_stepwise_and_average_by_hand_cycle_and_sequence():
    cycle, seq = tying_plan("cycle", 6, 2), tying_plan("sequence", 6, 2)  # 0,1,2,0,1,2 / 0,0,1,1,2,2
    # round(linspace(0, 5, 3)) = 0, 2 (2.5 rounds to even), 5
    assert vanilla_layer_sources("stepwise", 6, cycle) == {0: [0], 1: [2], 2: [5]}
    assert vanilla_layer_sources("stepwise", 6, seq) == {0: [0], 1: [2], 2: [5]}
    assert vanilla_layer_sources("average", 6, cycle) == {0: [0, 3], 1: [1, 4], 2: [2, 5]}
    assert vanilla_layer_sources("average", 6, seq) == {0: [0, 1], 1: [2, 3], 2: [4, 5]}
    assert vanilla_layer_sources("upcycle", 6, cycle) == vanilla_layer_sources("stepwise", 6, cycle)
    # 30 layers, Cycle Nr=3: u <- {u, u+10, u+20}
    assert vanilla_layer_sources("average", 30, tying_plan("cycle", 30, 3))[4] == [4, 14, 24]


def test_middle_cycle_30_layers_nr2_by_hand():
    plan = tying_plan("middle_cycle", 30, 2)  # 0 | 1..14 x2 | 15
    step = vanilla_layer_sources("stepwise", 30, plan)
    assert step[0] == [0] and step[15] == [29]
    # round(1 + 27 i / 13), i = 0..13
    assert [step[u][0] for u in range(1, 15)] == [1, 3, 5, 7, 9, 11, 13, 16, 18, 20, 22, 24, 26, 28]
    avg = vanilla_layer_sources("average", 30, plan)
    assert avg[0] == [0] and avg[15] == [29]
    assert all(avg[1 + i] == [1 + i, 15 + i] for i in range(14))
    mseq = vanilla_layer_sources("average", 30, tying_plan("middle_sequence", 30, 2))
    assert all(mseq[1 + i] == [1 + 2 * i, 2 + 2 * i] for i in range(14))
    assert mseq[0] == [0] and mseq[15] == [29]


def test_padded_depth_and_reduced_baseline():
    # MoR-4 at 360M pads 32 -> 34 layers (1 + 8x4 + 1); vanilla has 32: shared lo..hi = 1..30
    plan = tying_plan("middle_cycle", 34, 4)
    step = vanilla_layer_sources("stepwise", 32, plan)
    assert step[0] == [0] and step[9] == [31]
    assert [step[u][0] for u in range(1, 9)] == [1, 5, 9, 13, 18, 22, 26, 30]  # round(1 + 29 i / 7)
    avg = vanilla_layer_sources("average", 32, plan)
    # 32 shared positions onto 30 layers: p -> round(1 + 29 p / 31); unique 1 runs at p = 0, 8, 16, 24
    assert avg[1] == [1, 8, 16, 23]
    assert set().union(*(avg[u] for u in range(1, 9))) == set(range(1, 31))  # every vanilla layer used
    # the reduced vanilla baseline of Nr=2 over 30 layers: 15 evenly spaced layers
    red = vanilla_layer_sources("stepwise", 30, vanilla_plan(15))
    assert [v[0] for v in red.values()] == [0, 2, 4, 6, 8, 10, 12, 14, 17, 19, 21, 23, 25, 27, 29]
    assert vanilla_layer_sources("stepwise", 8, vanilla_plan(8)) == {i: [i] for i in range(8)}


def test_mapping_errors():
    with pytest.raises(ValueError, match="reads no checkpoint"):
        vanilla_layer_sources("random", 30, tying_plan("cycle", 30, 2))
    with pytest.raises(ValueError, match="cannot initialise"):
        vanilla_layer_sources("stepwise", 2, tying_plan("middle_cycle", 4, 2))


# --------------------------------------------------------------------------------- loading
@pytest.mark.parametrize("shard_bytes, lm_head", [(0, False), (40_000, True)])
def test_round_trip_gives_identical_logits(tmp_path, shard_bytes, lm_head):
    src = vanilla(seed=0)
    folder = write_llama_checkpoint(src, tmp_path / "ckpt", max_shard_bytes=shard_bytes, lm_head=lm_head)
    shards = sorted(p.name for p in folder.glob("*.safetensors"))
    if shard_bytes:
        assert len(shards) > 2 and (folder / "model.safetensors.index.json").exists()
    else:
        assert shards == ["model.safetensors"]
        keys = set(load_file(folder / "model.safetensors"))
        assert "model.layers.7.self_attn.q_proj.weight" in keys and "model.embed_tokens.weight" in keys
    dst = vanilla(seed=1)
    assert not torch.equal(logits(src), logits(dst))
    assert init_from_checkpoint(dst, str(folder), "stepwise") == {i: [i] for i in range(8)}
    assert torch.equal(logits(src), logits(dst))


def test_stepwise_and_average_load_the_mapped_layers(tmp_path):
    src = vanilla(seed=0)
    folder = write_llama_checkpoint(src, tmp_path / "ckpt")
    step = model_of(tying="cycle")
    assert init_from_checkpoint(step, str(folder), "stepwise") == {0: [0], 1: [2], 2: [5], 3: [7]}
    assert torch.equal(step.unique_layers[2].mlp.up_proj.weight, src.unique_layers[5].mlp.up_proj.weight)
    assert torch.equal(step.embed_tokens.weight, src.embed_tokens.weight)
    avg = model_of(tying="middle_sequence")  # 0 | 1,1,2,2,3,3 | 4 over 8 vanilla layers
    assert init_from_checkpoint(avg, str(folder), "average") == {0: [0], 1: [1, 2], 2: [3, 4], 3: [5, 6], 4: [7]}
    want = (src.unique_layers[3].self_attn.k_proj.weight + src.unique_layers[4].self_attn.k_proj.weight) / 2
    torch.testing.assert_close(avg.unique_layers[2].self_attn.k_proj.weight, want)
    assert torch.equal(avg.unique_layers[4].input_layernorm.weight, src.unique_layers[7].input_layernorm.weight)


def test_dora_model_starts_equal_to_the_tied_model_after_loading(tmp_path):
    folder = write_llama_checkpoint(vanilla(seed=0), tmp_path / "ckpt")
    dora = model_of(tying="middle_cycle", relaxation="dora", relaxation_rank=2)
    plain = model_of(tying="middle_cycle", seed=5)
    init_from_checkpoint(dora, str(folder), "average")
    init_from_checkpoint(plain, str(folder), "average")
    torch.testing.assert_close(logits(dora), logits(plain), rtol=0, atol=1e-6)


def test_native_final_weights_of_a_vanilla_run_load(tmp_path):
    """Locally, Table 12 starts from runs/<grid>/<id>/final/model.safetensors (our names)."""
    src = vanilla(seed=0)
    final = tmp_path / "run" / "final"
    final.mkdir(parents=True)
    save_file({n: p.detach().contiguous() for n, p in src.named_parameters()}, str(final / "model.safetensors"))
    dst = vanilla(seed=1)
    init_from_checkpoint(dst, str(final), "upcycle")
    assert torch.equal(logits(src), logits(dst))
    (tmp_path / "run" / "config.json").write_text(json.dumps({"config": {"model": {"variant": "recursive"}}}))
    with pytest.raises(InitCheckpointError, match="variant='recursive'"):
        init_from_checkpoint(vanilla(seed=1), str(final), "stepwise")


def test_initial_model_applies_the_init(tmp_path):
    from helpers.tiny import tiny_run
    from mor.train.trainer import initial_model
    from mor.config import load_scales
    from mor.model.build import make_model

    tiny = load_scales()["tiny"]
    # another seed than the run's (0): with common random numbers (mor.model.init) a model of the
    # run's own seed starts from the same embedding, so "untouched" below could not tell
    src = build_model(ModelConfig(scale="tiny"), tiny, 64, init_seed=1)
    torch.manual_seed(0)  # the run's models below draw from seed 0, as the trainer seeds them
    folder = write_llama_checkpoint(src, tmp_path / "ckpt")
    run = tiny_run("recursive", tying="cycle", nr=2, tied_init="stepwise", init_checkpoint=str(folder))
    model = initial_model(run, 64, torch.device("cpu"))
    # tiny: 4 layers, Cycle Nr=2 -> unique 0, 1 <- round(linspace(0, 3, 2)) = 0, 3
    assert torch.equal(model.unique_layers[1].self_attn.o_proj.weight, src.unique_layers[3].self_attn.o_proj.weight)
    untouched = make_model(run, 64, torch.device("cpu"))  # the network alone reads no checkpoint
    assert not torch.equal(untouched.embed_tokens.weight, src.embed_tokens.weight)


# --------------------------------------------------------------------------------- errors
def test_missing_key_names_file_and_key(tmp_path):
    folder = write_llama_checkpoint(vanilla(), tmp_path / "ckpt")
    tensors = load_file(folder / "model.safetensors")
    del tensors["model.layers.3.mlp.down_proj.weight"]
    save_file(tensors, str(folder / "model.safetensors"))
    with pytest.raises(InitCheckpointError, match=r"model\.safetensors: missing key 'model\.layers\.3\.mlp\.down_proj"):
        init_from_checkpoint(model_of(tying="sequence"), str(folder), "average")


def test_shape_mismatch_names_key_and_shapes(tmp_path):
    other = ScaleShape(name="t8", hidden=32, layers=8, heads=4, kv_heads=2, mlp=40, vocab=0, max_seq_len=64)
    folder = write_llama_checkpoint(vanilla(shape=other), tmp_path / "ckpt")
    (folder / "config.json").unlink()  # no config: the tensor shapes must catch it
    with pytest.raises(InitCheckpointError, match=r"'model\.layers\.0\.mlp\.gate_proj\.weight' has shape \(40, 32\), "
                                                  r"the model expects \(48, 32\)"):
        init_from_checkpoint(vanilla(), str(folder), "stepwise")


def test_config_json_mismatch_is_caught(tmp_path):
    """Head counts do not show in q_proj's shape; config.json catches them."""
    folder = write_llama_checkpoint(vanilla(), tmp_path / "ckpt")
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(dict(cfg, num_key_value_heads=4)))
    with pytest.raises(InitCheckpointError, match=r"config\.json: num_key_value_heads=4 but the model"):
        init_from_checkpoint(vanilla(), str(folder), "stepwise")
    (folder / "config.json").write_text(json.dumps(dict(cfg, rope_theta=100000.0)))
    with pytest.raises(InitCheckpointError, match="rope_theta"):
        init_from_checkpoint(vanilla(), str(folder), "stepwise")


def test_corrupt_and_inconsistent_files(tmp_path):
    folder = write_llama_checkpoint(vanilla(), tmp_path / "ckpt")
    (folder / "model.safetensors").write_bytes(b"\x00garbage" * 10)
    with pytest.raises(InitCheckpointError, match=r"model\.safetensors: not a readable safetensors file"):
        init_from_checkpoint(vanilla(), str(folder), "stepwise")
    sharded = write_llama_checkpoint(vanilla(), tmp_path / "sharded", max_shard_bytes=40_000)
    first = sorted(sharded.glob("model-*.safetensors"))[0]
    first.unlink()
    with pytest.raises(InitCheckpointError, match=rf"index\.json: key .* lives in {first.name}, which does not exist"):
        init_from_checkpoint(vanilla(), str(sharded), "stepwise")
    (tmp_path / "empty").mkdir()
    with pytest.raises(InitCheckpointError, match="no model.safetensors"):
        init_from_checkpoint(vanilla(), str(tmp_path / "empty"), "stepwise")


def test_unexpected_keys_and_untied_head_are_refused(tmp_path):
    folder = write_llama_checkpoint(vanilla(), tmp_path / "ckpt", lm_head=True)
    tensors = load_file(folder / "model.safetensors")
    tensors["lm_head.weight"] = tensors["lm_head.weight"] + 1
    save_file(tensors, str(folder / "model.safetensors"))
    with pytest.raises(InitCheckpointError, match="lm_head.weight' differs"):
        init_from_checkpoint(vanilla(), str(folder), "stepwise")
    tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"].clone()
    tensors["model.layers.2.self_attn.q_proj.bias"] = torch.zeros(32)
    save_file(tensors, str(folder / "model.safetensors"))
    with pytest.raises(InitCheckpointError, match=r"unexpected key 'model\.layers\.2\.self_attn\.q_proj\.bias'"):
        init_from_checkpoint(vanilla(), str(folder), "stepwise")


def test_hub_ids_resolve_only_when_no_local_path(tmp_path, monkeypatch):
    import huggingface_hub

    calls = []

    def fake_download(repo_id, allow_patterns=None):
        calls.append(repo_id)
        return str(tmp_path)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_download)
    assert resolve_checkpoint("HuggingFaceTB/SmolLM-135M") == tmp_path
    assert calls == ["HuggingFaceTB/SmolLM-135M"]
    local = tmp_path / "org" / "name"
    local.mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert resolve_checkpoint("org/name") == local.relative_to(tmp_path)  # exists locally: no hub call
    assert calls == ["HuggingFaceTB/SmolLM-135M"]
    with pytest.raises(InitCheckpointError, match="no such file or folder"):
        resolve_checkpoint("runs/table12/missing/final")

    def failing(repo_id, allow_patterns=None):
        raise OSError("offline")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", failing)
    with pytest.raises(InitCheckpointError, match="hub download failed: OSError: offline"):
        resolve_checkpoint("HuggingFaceTB/SmolLM-360M")


def test_config_requires_a_checkpoint_for_non_random_init():
    with pytest.raises(ConfigError, match="needs model.init_checkpoint"):
        ModelConfig(scale="tiny", variant="recursive", num_recursions=2, tied_init="stepwise")
    with pytest.raises(ConfigError, match="ignores it"):
        ModelConfig(scale="tiny", variant="recursive", num_recursions=2, init_checkpoint="x")


def test_export_refuses_recursive_models(tmp_path):
    with pytest.raises(ValueError, match="vanilla models only"):
        write_llama_checkpoint(model_of(), tmp_path)


def test_matches_transformers_llama(tmp_path):
    """Our vanilla model and HF LlamaForCausalLM agree on an exported checkpoint (RoPE layout)."""
    transformers = pytest.importorskip("transformers")
    src = vanilla(seed=0)
    folder = write_llama_checkpoint(src, tmp_path / "ckpt")
    hf = transformers.LlamaForCausalLM.from_pretrained(str(folder), torch_dtype=torch.float32).eval()
    x = torch.randint(0, V, (2, 12), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        torch.testing.assert_close(hf(x).logits, logits(src), rtol=1e-4, atol=1e-5)


def test_initial_model_reads_a_checkpoint_only_for_a_run_that_names_one(monkeypatch):
    """A run trained from scratch is built by the model layer alone: the up-training reader is
    never called (issue 59); a run naming ``model.init_checkpoint`` calls it once."""
    from helpers.tiny import tiny_run
    from mor.checkpoints import hf
    from mor.train.trainer import initial_model

    calls = []
    monkeypatch.setattr(hf, "init_from_checkpoint", lambda model, spec, scheme: calls.append((spec, scheme)))
    initial_model(tiny_run("recursive", tying="cycle", nr=2), 64, torch.device("cpu"))
    assert calls == []
    initial_model(tiny_run("recursive", tying="cycle", nr=2, tied_init="stepwise", init_checkpoint="some/folder"), 64,
                  torch.device("cpu"))
    assert calls == [("some/folder", "stepwise")]
