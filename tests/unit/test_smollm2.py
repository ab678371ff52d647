"""The real 135M start point (SmolLM2-135M-Instruct, Q4_1 GGUF) against code no one here wrote.

The project's path (mor.checkpoints.gguf: ``gguf`` dequantises, we un-permute q/k and
rename; mor.checkpoints.hf loads the folder into our Vanilla; our tokenizer from the file's
vocabulary) is held against transformers' own GGUF loader (its own reader and dequantiser,
LlamaForCausalLM, its own GGUF tokenizer) on real text: the Django validation split.

The weights are dequantised once per test run (the session fixture ``smollm2`` in conftest);
the models below are built once per module. Pure pieces (the q/k permutation) need no weights.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch

from mor.checkpoints.gguf import permute, unpermute

NAME = "smollm2-135m-instruct"
SEQS, SEQ_LEN = 4, 256  # logit parity: 4 sequences of 256 tokens
PROMPTS, PROMPT_LEN, NEW = 4, 16, 32  # greedy generation: 4 prompts of 16 tokens, 32 new tokens each


# --------------------------------------------------------------------------------- pure
def test_unpermute_inverts_llama_cpp_permute_and_matches_it_by_hand():
    w = np.arange(2 * 8 * 3, dtype=np.float32).reshape(2 * 8, 3)  # 2 heads of head_dim 8, 3 input features
    assert np.array_equal(unpermute(permute(w, 2), 2), w)
    # one head of dim 4, rows r0..r3 (HF rotate-half pairs (0, 2), (1, 3)) -> GGML pairs adjacent: r0 r2 r1 r3
    rows = np.arange(4, dtype=np.float32)[:, None]
    assert permute(rows, 1)[:, 0].tolist() == [0, 2, 1, 3]
    assert unpermute(np.array([[0.0], [2.0], [1.0], [3.0]]), 1)[:, 0].tolist() == [0, 1, 2, 3]


def test_unknown_start_point_and_tensor_names_fail_clearly():
    from mor.checkpoints.gguf import StartPointError, gguf_path, hf_name

    assert hf_name("blk.7.attn_k.weight") == "model.layers.7.self_attn.k_proj.weight"
    assert hf_name("token_embd.weight") == "model.embed_tokens.weight"
    with pytest.raises(StartPointError, match="no Llama counterpart"):
        hf_name("output.weight")  # the head is tied: a file with its own head is not this model
    with pytest.raises(StartPointError, match="unknown start point"):
        gguf_path("smollm3")


def test_one_step_at_lr_1e30_moves_no_weight_by_more_than_1e30():
    """grids/real_weights.yaml's step-0 runs: the trainer's AdamW (make_optimizer), one step at
    lr 1e-30 with real gradients, leaves every nonzero float32 weight bit for bit (the update is
    below its resolution); an exact zero (the Q4_1 weights have many) becomes at most 1e-30 in
    magnitude. So the run's NLL is the step-0 NLL."""
    from helpers.tiny import tiny_run
    from mor.config import load_scales
    from mor.model.transformer import build_model
    from mor.train.trainer import make_optimizer

    run = tiny_run("mor", nr=2)
    run = dataclasses.replace(run, train=dataclasses.replace(run.train, lr=1e-30))
    model = build_model(run.model, load_scales()["tiny"], 50).train()
    with torch.no_grad():
        for p in model.parameters():
            p.view(-1)[::7] = 0.0  # exact zeros, as dequantised Q4_1 blocks hold
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = make_optimizer(model, run)
    x = torch.randint(0, 50, (4, 33), generator=torch.Generator().manual_seed(0))
    out = model(x[:, :-1])
    torch.nn.functional.cross_entropy(out.logits.flatten(0, 1), x[:, 1:].flatten()).backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for n, p in model.named_parameters() if "router" not in n)
    opt.step()
    moved = 0
    for n, p in model.named_parameters():
        nonzero = before[n] != 0
        assert torch.equal(p[nonzero], before[n][nonzero]), n
        assert p[~nonzero].abs().max() <= 1e-30, n
        moved += int((p[~nonzero] != 0).sum())
    assert moved > 0  # the zeros did move: "bit for bit" would be false


def test_compare_finds_the_largest_difference_and_a_changed_prediction():
    from mor.lm_eval.parity import compare

    a = {"t": {"acc": 0.5, "docs": {0: {"ll": [-1.0, -2.0], "acc": 1.0}, 1: {"ll": [-3.0, -1.0], "acc": 0.0}}}}
    b = {"t": {"acc": 0.5, "docs": {0: {"ll": [-1.0, -2.00002], "acc": 1.0}, 1: {"ll": [-3.0, -1.0], "acc": 0.0}}}}
    res = compare(a, b)
    assert res["max_abs_ll_diff"] == pytest.approx(2e-5) and res["identical_accuracies"]
    assert res["tasks"]["t"] == {"n": 2, "continuations": 4, "max_abs_ll_diff": pytest.approx(2e-5), "acc_mor": 0.5,
                                 "acc_hf": 0.5, "same_prediction": 2}
    b["t"] = {"acc": 1.0, "docs": {0: {"ll": [-1.0, -2.0], "acc": 1.0}, 1: {"ll": [-3.0, -4.0], "acc": 1.0}}}
    res = compare(a, b)
    assert not res["identical_accuracies"] and res["tasks"]["t"]["same_prediction"] == 1
    assert res["max_abs_ll_diff"] == 3.0
    with pytest.raises(ValueError, match="different documents"):
        compare(a, {"t": {"acc": 0.5, "docs": {0: a["t"]["docs"][0]}}})


# --------------------------------------------------------------------------------- real weights
@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One intra-op thread: at 135M a decoding step is many small matmuls, and two threads on a
    shared 2-core machine ran 10x slower than one (43 s instead of 4 s for decode.generate)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def ours(smollm2):
    """The project's Vanilla at scale 135M-smollm2, from the named start point (mor.checkpoints.hf)."""
    from mor.config import ModelConfig, load_scales
    from mor.checkpoints.hf import init_from_checkpoint
    from mor.model.transformer import build_model

    cfg = ModelConfig(scale="135M-smollm2", tied_init="stepwise", init_checkpoint=NAME)
    model = build_model(cfg, load_scales()["135M-smollm2"], 49152).eval()
    sources = init_from_checkpoint(model, NAME, "stepwise")
    assert sources == {i: [i] for i in range(30)}  # a vanilla target: layer i <- layer i
    return model


@pytest.fixture(scope="module")
def hf(smollm2):
    """transformers' own GGUF path: LlamaForCausalLM and its tokenizer, from the same file."""
    pytest.importorskip("accelerate")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    d, f = str(smollm2.gguf.parent), smollm2.gguf.name
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(d, gguf_file=f)


@pytest.fixture(scope="module")
def val_docs(data_root):
    from mor.data.tokens import read_documents

    return read_documents(data_root / "corpus" / "val.txt")


@pytest.fixture(scope="module")
def val_ids(smollm2, val_docs):
    """The validation split in the start point's ids, EOS after each document (mor.data.tokens' layout)."""
    from mor.data.tokenizer import load_tokenizer

    tok = load_tokenizer(smollm2.folder / "tokenizer.json")
    assert tok.vocab_size == 49152 and tok.eos_id == 0  # <|endoftext|>
    return [i for ids in tok.encode_batch(val_docs) for i in ids + [tok.eos_id]]


def test_start_point_folder_has_the_135m_shape(smollm2, ours):
    cfg = json.loads((smollm2.folder / "config.json").read_text())
    assert (cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["num_key_value_heads"],
            cfg["intermediate_size"], cfg["vocab_size"], cfg["rope_theta"]) == (576, 30, 9, 3, 1536, 49152, 1e5)
    assert ours.num_params() == 134_515_008  # the paper's 135M count (grids/scales.yaml)


def test_tokenizer_equals_transformers_on_the_whole_validation_split(smollm2, hf, val_docs):
    from mor.data.tokenizer import load_tokenizer

    tok = load_tokenizer(smollm2.folder / "tokenizer.json")
    mine = tok.encode_batch(val_docs)
    theirs = hf[1](val_docs, add_special_tokens=False)["input_ids"]
    assert len(val_docs) >= 5 and sum(map(len, mine)) > 40_000
    assert mine == theirs
    ids = tok.encode("<|im_start|>hi<|endoftext|>")  # control tokens stay whole
    assert ids[0] == 1 and ids[-1] == 0 and tok.decode(ids[1:-1]) == "hi"


def test_logits_equal_transformers_llama_on_validation_sequences(ours, hf, val_ids):
    x = torch.tensor(val_ids[: SEQS * SEQ_LEN]).view(SEQS, SEQ_LEN)
    with torch.no_grad():
        a, b = ours(x).logits, hf[0](x).logits
    assert a.shape == b.shape == (SEQS, SEQ_LEN, 49152)
    assert (a - b).abs().max().item() <= 1e-4
    nll = torch.nn.functional.cross_entropy(a[:, :-1].flatten(0, 1), x[:, 1:].flatten()).item()
    assert nll < 4.0  # a model that knows English (uniform: ln 49152 = 10.8)


@pytest.fixture(scope="module")
def prompts(val_ids):
    starts = [0, 5_000, 15_000, 30_000]
    return [val_ids[s:s + PROMPT_LEN] for s in starts[:PROMPTS]]


@pytest.fixture(scope="module")
def reference(hf, prompts):
    """transformers' greedy decoding (its own KV cache and generate loop): 32 tokens each."""
    with torch.no_grad():
        out = hf[0].generate(torch.tensor(prompts), max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False)
    return out[:, PROMPT_LEN:].tolist()


def test_greedy_decode_generate_equals_transformers(ours, prompts, reference):
    from mor.model.decode import generate

    got = generate(ours, torch.tensor(prompts), NEW)[:, PROMPT_LEN:].tolist()
    assert len(reference) == PROMPTS and all(len(r) == NEW for r in reference)
    assert got == reference


def test_greedy_engine_equals_transformers(ours, prompts, reference):
    from mor.engine.engine import Engine
    from mor.engine.scheduler import Request

    res = Engine(ours, batch=PROMPTS, max_len=PROMPT_LEN + NEW).run([Request(i, p, NEW) for i, p in enumerate(prompts)])
    assert [res.outputs[i] for i in range(PROMPTS)] == reference


def test_greedy_export_hf_then_automodel_equals_transformers(smollm2, ours, prompts, reference, tmp_path):
    """`mor export-hf` of a run holding the start point's weights, loaded with AutoModelForCausalLM."""
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    from mor.config import DataConfig, ModelConfig, RunConfig, TrainConfig
    from mor.export_hf import export_run

    run = RunConfig(grid="real_weights", model=ModelConfig(scale="135M-smollm2", tied_init="stepwise",
                                                           init_checkpoint=NAME),
                    train=TrainConfig(tokens=256, seq_len=256, global_batch=1, micro_batch=1, lr=1e-30),
                    data=DataConfig(tokenizer=NAME), paper_scale="135M")
    run_dir, data = tmp_path / "runs" / "real_weights" / run.run_id, tmp_path / "data"
    (run_dir / "final").mkdir(parents=True)
    (data / "tokenizer").mkdir(parents=True)
    (data / "tokenizer" / f"{NAME}.json").write_bytes((smollm2.folder / "tokenizer.json").read_bytes())
    save_file({n: p.detach().contiguous() for n, p in ours.named_parameters()}, str(run_dir / "final" / "model.safetensors"))
    (run_dir / "config.json").write_text(json.dumps({"config": run.to_dict(), "vocab_size": 49152}))
    (run_dir / "train_summary.json").write_text(json.dumps({"steps": 1, "tokens_seen": 256, "final_loss": 0.0}))
    out = export_run(run_dir, tmp_path / "export", data_root=data, results=tmp_path / "results")
    model = AutoModelForCausalLM.from_pretrained(str(out), trust_remote_code=True, dtype=torch.float32).eval()
    # Greedy decoding without a cache (the export's generation_config) recomputes the whole prefix
    # at every step, so it reproduces `reference` iff, fed prompt + reference in one forward, the
    # argmax at each of the last 32 positions is the next reference token (by induction over the
    # steps): one forward instead of 32 (~1 s, not ~40 s); the first step also runs generate itself.
    seq = torch.tensor([p + r for p, r in zip(prompts, reference)])
    with torch.no_grad():
        logits = model(seq[:, :-1]).logits
        first = model.generate(torch.tensor(prompts), max_new_tokens=1, do_sample=False, use_cache=False)
    assert logits[:, PROMPT_LEN - 1:].argmax(-1).tolist() == reference
    assert first[:, -1].tolist() == [r[0] for r in reference]


def test_lm_eval_adapter_equals_lm_eval_hf_backend_per_document(smollm2, ours, hf, tmp_path_factory):
    """The six benchmarks, the first document of each (lm-eval's limit on the shuffled copies),
    scored by the mor adapter and by lm-eval's own hf backend: the full 100-document comparison
    is `python -m mor.lm_eval.parity --limit 100` (docs/real_weights.md)."""
    from mor.lm_eval import offline_env
    from mor.lm_eval.parity import TASKS, compare, lms, per_document
    from mor.lm_eval.tasks import build

    offline_env(tmp_path_factory.mktemp("hf-datasets"))
    tasks_dir = tmp_path_factory.mktemp("lm_eval") / "tasks"
    build(tasks_dir, list(TASKS))
    mor, hf_lm = lms(ours, hf[0], smollm2.folder / "tokenizer.json", max_length=256, batch=16)
    a, b = (per_document(lm, TASKS, 1, tasks_dir, 256) for lm in (mor, hf_lm))
    res = compare(a, b)
    assert set(res["tasks"]) == set(TASKS) and all(r["n"] == 1 for r in res["tasks"].values())
    assert sum(r["continuations"] for r in res["tasks"].values()) >= 6 * 2  # every choice of every document
    assert res["max_abs_ll_diff"] <= 1e-4
    assert res["identical_accuracies"] and all(r["same_prediction"] == 1 for r in res["tasks"].values())
