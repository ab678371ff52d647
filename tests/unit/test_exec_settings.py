"""Execution settings (mor.config.ExecConfig) change how a run computes, never what it trains:
the run id stays, and the trained weights agree within float tolerance."""

import dataclasses
import json

import pytest
import torch
import torch.nn.functional as F

from helpers.tiny import VOCAB, tiny_run
from mor.config import ConfigError, ExecConfig, ModelConfig, RouterConfig, exec_config, load_scales, run_config_from_dict
from mor.model.transformer import build_model
from mor.train.execution import apply_execution, chunked_cross_entropy
from mor.train.trainer import Trainer, make_optimizer, use_fused_adamw

# Float summation order differs between the paths; AdamW divides each gradient by its own
# running scale, so a rarely used embedding row moves by up to ~1e-5 differently (one step
# is lr = 3e-3): the tolerance is a small fraction of one update.
ATOL = 5e-5
VARIANTS = {"vanilla": dict(variant="vanilla"), "mor": dict(variant="mor", nr=3)}


def _tokens(data_root):
    return data_root / "tokens" / f"train-bpe-{VOCAB}.npy"


def _train(data_root, path, run, execution=None, steps=2):
    tr = Trainer(run, path, _tokens(data_root), VOCAB, progress=False, execution=execution)
    losses = [tr.train_step()["loss"] for _ in range(steps)]
    return tr, losses


def test_execution_is_validated_and_names_the_key():
    assert exec_config({"micro_batch": "auto", "loss_chunk": 256}).micro_batch == "auto"
    assert exec_config({"micro_batch": "4"}).micro_batch == 4
    for raw, msg in (({"micro_batch": -1}, "execution.micro_batch=-1"),
                     ({"attention": "xformers"}, "execution.attention='xformers' is not allowed"),
                     ({"fused_optimizer": True}, "execution.fused_optimizer"),
                     ({"micro": 4}, "unknown key(s) ['micro']")):
        with pytest.raises(ConfigError, match=msg.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
            exec_config(raw)


def test_attention_left_the_identity_and_stored_configs_still_parse():
    """model.attention moved to execution.attention; a stored config carrying its old value
    ('auto', what every run had) parses to the same run id, any other value is refused."""
    run = tiny_run()
    stored = run.to_dict()
    stored["model"]["attention"] = "auto"
    assert run_config_from_dict(stored).run_id == run.run_id
    stored["model"]["attention"] = "flash"
    with pytest.raises(ConfigError, match="moved out of the run identity"):
        run_config_from_dict(stored)
    # the hash keeps the retired key at its old value: ids computed before the move stay
    assert run.training_dict()["model"]["attention"] == "auto"


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_micro_batch_changes_nothing_but_the_passes(data_root, tmp_path, variant):
    """The same 8 sequences per step (drawn in draws of train.micro_batch=8) through passes of
    8, 4 and 2: same run id, same sequences, same weights up to float summation order."""
    kw = VARIANTS[variant]
    run = tiny_run(steps=4, batch=8, seq_len=32, variant=kw["variant"], nr=kw.get("nr", 1))
    ref, ref_losses = _train(data_root, tmp_path / "ref", run)
    assert (ref.micro, ref.accum) == (8, 1)
    for micro in (4, 2):
        tr, losses = _train(data_root, tmp_path / f"m{micro}", run, ExecConfig(micro_batch=micro))
        assert (tr.micro, tr.accum) == (micro, 8 // micro) and tr.run.run_id == ref.run.run_id
        assert losses == pytest.approx(ref_losses, rel=1e-5)
        for (n, p), q in zip(ref.model.named_parameters(), tr.model.parameters()):
            torch.testing.assert_close(q, p, rtol=1e-4, atol=ATOL, msg=n)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_checkpointing_and_chunked_loss_train_the_same_weights(data_root, tmp_path, variant):
    """Activation checkpointing per layer call and the chunked loss (3 chunks of 40 tokens for
    4 x 32 positions, the last one short) give the plain path's losses and weights."""
    kw = VARIANTS[variant]
    run = tiny_run(steps=4, batch=4, seq_len=32, variant=kw["variant"], nr=kw.get("nr", 1))
    ref, ref_losses = _train(data_root, tmp_path / "ref", run, steps=3)
    execution = ExecConfig(micro_batch=2, activation_checkpointing=True, loss_chunk=40)
    tr, losses = _train(data_root, tmp_path / "exec", run, execution, steps=3)
    assert losses == pytest.approx(ref_losses, rel=1e-5)
    for (n, p), q in zip(ref.model.named_parameters(), tr.model.parameters()):
        torch.testing.assert_close(q, p, rtol=1e-4, atol=ATOL, msg=n)


COMPILED = {
    "vanilla": dict(variant="vanilla"),
    # expert-choice over 3 recursions: whole-model inductor got its gradients wrong by ~1 %
    "mor-ec": dict(variant="mor", nr=3),
    # LoRA is forward hooks on the shared layer's projections, per recursion slot: a compiled
    # layer without hook guards silently ran without them
    "recursive-lora": dict(variant="recursive", tying="middle_cycle", nr=2, relaxation="lora", relaxation_rank=2),
}


# ~20 s each on 2 CPU cores with a cold inductor cache; vanilla's layers are covered by the others
@pytest.mark.parametrize("kind", [pytest.param(k, marks=pytest.mark.slow) if k == "vanilla" else k for k in COMPILED])
def test_compiled_training_equals_eager(data_root, tmp_path, kind):
    """execution.compile (each layer through torch.compile, inductor on CPU) trains 3 steps to
    the eager losses and weights, under the same parameter names (checkpoints)."""
    kw = dict(COMPILED[kind])
    run = tiny_run(steps=4, batch=4, seq_len=32, variant=kw.pop("variant"), nr=kw.pop("nr", 1), **kw)
    ref, ref_losses = _train(data_root, tmp_path / "eager", run, steps=3)
    tr, losses = _train(data_root, tmp_path / "compiled", run, ExecConfig(compile=True), steps=3)
    assert tr.compiled and all(layer._compiled_call_impl is not None for layer in tr.model.unique_layers)
    assert losses == pytest.approx(ref_losses, rel=1e-5)
    assert [n for n, _ in tr.model.named_parameters()] == [n for n, _ in ref.model.named_parameters()]
    for (n, p), q in zip(ref.model.named_parameters(), tr.model.parameters()):
        torch.testing.assert_close(q, p, rtol=1e-4, atol=ATOL, msg=n)
    if kind == "recursive-lora":  # the deltas trained (B starts at zero): the hooks ran compiled
        assert all(p.abs().sum() > 0 for n, p in tr.model.named_parameters() if n.endswith(".B"))


def test_a_micro_batch_that_does_not_divide_the_rank_batch_is_refused(data_root, tmp_path):
    run = tiny_run(batch=8)
    with pytest.raises(ValueError, match="execution.micro_batch=3 does not divide the per-rank batch 8"):
        Trainer(run, tmp_path / "r", _tokens(data_root), VOCAB, progress=False, execution=ExecConfig(micro_batch=3))


def test_fit_records_the_resolved_execution_next_to_the_config(data_root, tmp_path):
    run = dataclasses.replace(tiny_run(steps=2, batch=4), train=dataclasses.replace(tiny_run().train, tokens=2 * 4 * 32))
    tr = Trainer(run, tmp_path / "r", _tokens(data_root), VOCAB, progress=False,
                 execution=ExecConfig(micro_batch="auto"))  # on CPU 'auto' keeps the draw size
    tr.fit()
    meta = json.loads((tmp_path / "r" / "config.json").read_text())
    assert meta["execution"]["micro_batch"] == 4 and meta["execution"]["accumulation"] == 1
    assert meta["config_hash"] == run.config_hash and "execution" not in meta["config"]


# ------------------------------------------------------------------ the model's memory paths, alone
def _grads(model, x, y):
    model.zero_grad(set_to_none=True)
    out = model(x, y)
    out.loss.backward()
    return out, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("model_kw", [
    dict(variant="vanilla"),
    dict(variant="mor", num_recursions=3),
    dict(variant="mor", num_recursions=2, router=RouterConfig(type="token_choice")),
    dict(variant="recursive", num_recursions=2, relaxation="lora", relaxation_rank=2),  # hooks inside run_layer
], ids=["vanilla", "mor-ec", "mor-tc", "recursive-lora"])
def test_checkpointed_layers_and_chunked_loss_equal_the_plain_path(model_kw):
    """Loss and every parameter's gradient of one forward/backward, plain vs activation
    checkpointing vs the chunked loss (chunks of 48 positions of 2 x 40, ignored targets
    included) vs both: equal up to float summation order."""
    torch.manual_seed(0)
    model = build_model(ModelConfig(scale="tiny", **model_kw), load_scales()["tiny"], 96)
    model.train()
    x, y = torch.randint(0, 96, (2, 40)), torch.randint(0, 96, (2, 40))
    y[0, :5] = -100
    ref_out, ref = _grads(model, x, y)
    for ckpt, chunk in ((True, 0), (False, 48), (True, 48)):
        apply_execution(model, "auto", ckpt, chunk)
        out, got = _grads(model, x, y)
        assert (out.logits is None) == bool(chunk)
        torch.testing.assert_close(out.lm_loss, ref_out.lm_loss, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(out.loss, ref_out.loss, rtol=1e-6, atol=1e-6)
        assert got.keys() == ref.keys()
        for n in ref:
            torch.testing.assert_close(got[n], ref[n], rtol=1e-5, atol=1e-7, msg=f"{n} ckpt={ckpt} chunk={chunk}")
        apply_execution(model)


def test_the_model_leaves_execution_to_the_training_side():
    """As in torchtitan, activation checkpointing and the chunked loss live on the training side
    (mor.train.execution, through the model's neutral hooks): no module of mor.model imports
    torch.utils.checkpoint, and apply_execution's defaults leave both hooks unset."""
    import ast
    from pathlib import Path

    import mor.model

    found = []
    for f in sorted(Path(mor.model.__file__).parent.glob("*.py")):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Import):
                found += [(f.name, a.name) for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                found += [(f.name, f"{node.module}.{a.name}") for a in node.names]
    assert found and not [x for x in found if x[1].startswith("torch.utils.checkpoint")]
    model = build_model(ModelConfig(scale="tiny"), load_scales()["tiny"], 32)
    apply_execution(model, "auto", True, 16)
    assert model.layer_wrapper is not None and model.lm_loss_fn is not None
    apply_execution(model)
    assert model.layer_wrapper is None and model.lm_loss_fn is None


def test_chunked_cross_entropy_equals_cross_entropy():
    torch.manual_seed(0)
    h = torch.randn(37, 16, requires_grad=True)
    w = torch.randn(50, 16, requires_grad=True)
    t = torch.randint(0, 50, (37,))
    t[3] = -100
    plain = F.cross_entropy(F.linear(h, w).float(), t, ignore_index=-100)
    gh, gw = torch.autograd.grad(plain, (h, w))
    for chunk in (1, 5, 37, 100):
        got = chunked_cross_entropy(h, w, t, chunk)
        ch, cw = torch.autograd.grad(got, (h, w))
        torch.testing.assert_close(got, plain)
        torch.testing.assert_close(ch, gh)
        torch.testing.assert_close(cw, gw)


def test_fused_adamw_on_cuda_only():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert not use_fused_adamw("auto", cpu) and use_fused_adamw("auto", cuda) and not use_fused_adamw("off", cuda)
    with pytest.raises(ValueError, match="fused_optimizer='on' needs a CUDA device"):
        use_fused_adamw("on", cpu)
    model = build_model(ModelConfig(scale="tiny"), load_scales()["tiny"], 32)
    assert make_optimizer(model, tiny_run(), fused=False).defaults["fused"] is False


def test_flash_attention_is_refused_where_flash_attn_is_missing():
    from mor.model.layers import flash_available

    model = build_model(ModelConfig(scale="tiny"), load_scales()["tiny"], 32)
    apply_execution(model, "sdpa")
    assert {b.self_attn.backend for b in model.unique_layers} == {"sdpa"}
    if not flash_available():
        with pytest.raises(RuntimeError, match="execution.attention='flash' but flash_attn is not installed"):
            apply_execution(model, "flash")


# ------------------------------------------------------------------ sharded, with every memory setting on
def _fsdp_exec_worker(rank, world, run, tokens, run_dir, port, execution):
    import os

    from mor.launch import distributed
    from mor.train.parallel import trainer_class
    from helpers.launch import _FakeEnv

    os.environ["MASTER_PORT"] = str(port)
    info = distributed.init_distributed("cpu", env=_FakeEnv(rank, world))
    try:
        tr = trainer_class("fsdp")(run, run_dir, tokens, VOCAB, device="cpu", dist=info, progress=False,
                                   execution=execution, parallel="fsdp")
        assert (tr.micro, tr.accum) == (1, 2)
        summary = tr.fit()
        if rank == 0:
            (run_dir / "rank0.json").write_text(json.dumps(summary))
    finally:
        distributed.shutdown()


def test_fsdp_with_accumulation_checkpointing_and_chunked_loss_equals_one_plain_process(data_root, tmp_path):
    """2 gloo ranks under FSDP2, each accumulating 2 passes of 1 sequence with activation
    checkpointing and the loss in chunks of 24 tokens, end where one process ends that trains
    the plain path on the same sequences (a recursive model: a tied layer called twice)."""
    from safetensors.torch import load_file

    from helpers.launch import _free_port, single_process_reference

    run = tiny_run(steps=4, batch=4, seq_len=32, variant="recursive", tying="cycle", nr=2)
    run = dataclasses.replace(run, train=dataclasses.replace(run.train, micro_batch=2))  # draws of 2 per rank
    execution = ExecConfig(micro_batch=1, activation_checkpointing=True, loss_chunk=24)
    torch.multiprocessing.spawn(_fsdp_exec_worker, args=(2, run, _tokens(data_root), tmp_path / "fsdp", _free_port(),
                                                         execution), nprocs=2, join=True)
    got = json.loads((tmp_path / "fsdp" / "rank0.json").read_text())
    ref, ref_summary = single_process_reference(run, tmp_path / "ref", _tokens(data_root), world=2)
    assert got["final_loss"] == pytest.approx(ref_summary["final_loss"], rel=1e-5)
    assert got["run_id"] == ref_summary["run_id"]
    final = load_file(str(tmp_path / "fsdp" / "final" / "model.safetensors"))
    for n, p in ref.model.named_parameters():
        torch.testing.assert_close(final[n], p.detach(), rtol=1e-4, atol=ATOL, msg=n)
