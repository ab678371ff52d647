"""``python -m mor export-hf``: a run as a transformers folder that gives our logits and tokens.

Offline (HF_HUB_OFFLINE=1): the folder carries its own modeling file, so nothing is fetched.
Four trained runs (Vanilla, Recursive, expert-choice and token-choice MoR, a few steps each,
like ``helpers.tiny.tiny_run``) are exported and loaded with ``AutoModelForCausalLM``; their
logits are compared with ours teacher-forced (expert-choice: the training top-k) and under
the causal routing of decoding, and ``generate()`` with our cached greedy ``decode.generate``.
Every model variant of ``test_decode`` (KV sharing, aux routers, gating, router functions)
is then exported from random weights whose routers really split tokens.
"""

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from helpers.tiny import VOCAB, tiny_run
from mor.config import RouterConfig, RunConfig, model_shape
from mor.export_hf import ExportError, export_run
from mor.model import decode
from mor.checkpoints.hf import InitCheckpointError, init_from_checkpoint
from mor.model.transformer import build_model
from mor.checkpoints.native import load_model_weights
from mor.train.trainer import Trainer

transformers = pytest.importorskip("transformers")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

TRAINED = {
    "vanilla": dict(variant="vanilla"),
    "recursive": dict(variant="recursive", tying="cycle", nr=2),
    "mor-expert-choice": dict(variant="mor", tying="middle_cycle", nr=3),
    "mor-token-choice": dict(variant="mor", tying="cycle", nr=3, kv="shared",
                             router=RouterConfig(type="token_choice", balancing="loss_free", arch="mlp")),
}
PROMPT, NEW = 16, 24


@pytest.fixture(scope="module")
def trained(data_root, tmp_path_factory):
    """variant -> (run, run dir, export dir): trained 6 steps, exported."""
    out = {}
    for name, kw in TRAINED.items():
        run = tiny_run(steps=6, **kw)
        run_dir = tmp_path_factory.mktemp(name) / "run"
        Trainer(run, run_dir, data_root / "tokens" / f"train-bpe-{VOCAB}.npy", VOCAB, progress=False).fit()
        out[name] = (run, run_dir, export_run(run_dir, run_dir.parent / "hf", data_root=data_root))
    return out


def ours(run, run_dir):
    model = build_model(run.model, model_shape(run.model), VOCAB).eval()
    load_model_weights(run_dir / "final", model)
    return model


def load_hf(folder):
    return transformers.AutoModelForCausalLM.from_pretrained(str(folder), trust_remote_code=True).eval()


def val_batch(data_root, B=2, T=64):
    val = np.load(data_root / "tokens" / f"val-bpe-{VOCAB}.npy")
    return torch.from_numpy(val[: B * T].astype(np.int64)).view(B, T)


def max_diff(a, b) -> float:
    return float((a - b).abs().max())


@pytest.mark.parametrize("name", list(TRAINED))
def test_trained_run_exports_with_equal_logits_and_tokens(trained, data_root, name, record_property):
    """Max |logit diff| teacher-forced / causal (reference) / causal (cached decode) under 1e-5, and
    generate() equal token for token; the figures are recorded as properties (``--junitxml``)."""
    run, run_dir, folder = trained[name]
    model, hf = ours(run, run_dir), load_hf(folder)
    assert type(hf).__name__ == "MoRForCausalLM"
    x = val_batch(data_root)
    with torch.no_grad():
        teacher = max_diff(hf(x, routing="topk").logits, model(x).logits)
        ref = decode.full_forward_causal(model, x)
        out = hf(x)
        causal = max_diff(out.logits, ref.logits)
        _, cached = decode.prefill(model, x, all_logits=True)  # our decoding path, cache and all
        causal_cached = max_diff(out.logits, cached)
    if model.routers:
        assert torch.equal(out.depths, ref.routing.depths())
        assert out.depths.unique().numel() > 1, "the routers send every token equally deep: nothing tested"
    prompt = x[:, :PROMPT]
    want = decode.generate(model, prompt, NEW)
    got = hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=NEW, do_sample=False)
    agree = float((got[:, PROMPT:] == want[:, PROMPT:]).float().mean())
    figures = {"teacher_forced": teacher, "causal": causal, "causal_cached": causal_cached,
               "generate_agreement": agree, "generated": int(want[:, PROMPT:].numel())}
    for key, value in figures.items():
        record_property(key, value)
    assert teacher < 1e-5 and causal < 1e-5 and causal_cached < 1e-5, figures
    assert agree == 1.0 and torch.equal(got, want), figures


def test_config_card_and_files(trained):
    run, run_dir, folder = trained["mor-expert-choice"]
    assert sorted(p.name for p in folder.iterdir()) == [
        ".mor-export.json", "README.md", "config.json", "generation_config.json", "model.safetensors", "modeling_mor.py",
        "tokenizer.json", "tokenizer_config.json"]
    cfg = json.loads((folder / "config.json").read_text())
    mine = run.to_dict()["model"]
    assert cfg["mor"]["model"] == json.loads(json.dumps(mine))  # every field of the run's model config
    assert cfg["router"] == json.loads(json.dumps(mine["router"])) and cfg["router_capacities"] == [1.0, 2 / 3, 1 / 3]
    assert cfg["layer_plan"] == {"prefix": [0], "recursions": [[1], [1], [1]], "suffix": [2]}
    assert cfg["auto_map"]["AutoModelForCausalLM"] == "modeling_mor.MoRForCausalLM"
    keys = set(load_file(folder / "model.safetensors"))
    assert {"model.routers.2.head.weight", "model.layers.2.mlp.down_proj.weight"} <= keys
    assert not any(k.startswith("lm_head") for k in keys)  # tied
    card = (folder / "README.md").read_text()
    meta = json.loads((run_dir / "config.json").read_text())
    for s in (f"grid: `{run.grid}`", meta["git_commit"], run.run_id, "routing: causal", "validation NLL",
              '"aux_coeff"'):
        assert s in card
    tok = transformers.AutoTokenizer.from_pretrained(str(folder), trust_remote_code=True)
    assert tok.eos_token_id == 0 and len(tok) == VOCAB
    assert tok.decode(tok.encode("Django models")) == "Django models"


def test_model_card_states_val_nll_from_the_result_row(trained, data_root, tmp_path):
    from mor.results import RUN_SCHEMA, write_rows

    run, run_dir, _ = trained["vanilla"]
    row = {n: None for n in RUN_SCHEMA.names}
    row.update(run_id=run.run_id, grid=run.grid, config_hash=run.config_hash, git_commit="abc", scale="tiny", seed=0,
               val_nll=5.4321,
               val_nll_causal=5.4321, val_tokens=2048)
    write_rows(tmp_path / "results" / "runs" / run.grid / f"{run.run_id}.parquet", [row])
    folder = export_run(run_dir, tmp_path / "hf", data_root=data_root, results=tmp_path / "results")
    assert "validation NLL (teacher-forced): 5.4321" in (folder / "README.md").read_text()


def test_vanilla_export_round_trips_through_the_hf_loader(trained, data_root):
    run, run_dir, folder = trained["vanilla"]
    src = ours(run, run_dir)
    torch.manual_seed(7)
    dst = build_model(run.model, model_shape(run.model), VOCAB).eval()
    assert init_from_checkpoint(dst, str(folder), "stepwise") == {i: [i] for i in range(len(dst.unique_layers))}
    x = val_batch(data_root)
    with torch.no_grad():
        assert torch.equal(dst(x).logits, src(x).logits)


@pytest.mark.parametrize("name", ["recursive", "mor-expert-choice"])
def test_tied_exports_are_not_vanilla_checkpoints(trained, name):
    run, run_dir, folder = trained[name]
    target = build_model(tiny_run().model, model_shape(tiny_run().model), VOCAB)
    with pytest.raises(InitCheckpointError, match=r"config\.json: an exported (recursive|mor) model"):
        init_from_checkpoint(target, str(folder), "stepwise")


# --------------------------------------------------------------------------------- refusals
def fake_run(tmp_path, model_cfg, model=None, vocab=VOCAB) -> Path:
    """A finished run folder (config, summary, final weights) without training."""
    run = RunConfig(grid="test", model=model_cfg)
    run_dir = tmp_path / "run"
    (run_dir / "final").mkdir(parents=True)
    model = model or build_model(model_cfg, model_shape(model_cfg), vocab)
    save_file({n: p.detach().contiguous() for n, p in model.named_parameters()}, str(run_dir / "final" / "model.safetensors"))
    (run_dir / "config.json").write_text(json.dumps({"run_id": run.run_id, "git_commit": "abc", "vocab_size": vocab,
                                                     "config": run.to_dict()}))
    (run_dir / "train_summary.json").write_text(json.dumps({"steps": 0, "tokens_seen": 0, "final_loss": 0.0}))
    return run_dir


def test_an_option_the_modeling_file_lacks_is_refused_before_anything_is_written(tmp_path, data_root, monkeypatch):
    import mor.export_hf as ex

    cfg = tiny_run("recursive", tying="cycle", nr=2, relaxation="prefix", relaxation_rank=2).model
    run_dir = fake_run(tmp_path, cfg)
    orig = dict(ex.SUPPORTED)
    monkeypatch.setitem(ex.SUPPORTED, "relaxation", ("none", "lora"))
    with pytest.raises(ExportError, match=r"model\.relaxation='prefix' is not in the exported modeling file"):
        export_run(run_dir, tmp_path / "hf", data_root=data_root)
    monkeypatch.setattr(ex, "SUPPORTED", {k: v for k, v in orig.items() if k != "tying"})
    with pytest.raises(ExportError, match=r"model\.tying is not known to the exporter"):
        export_run(run_dir, tmp_path / "hf", data_root=data_root)
    router = {k: v for k, v in orig["router"].items() if k != "z_loss_coeff"}
    monkeypatch.setattr(ex, "SUPPORTED", {**orig, "router": router})
    with pytest.raises(ExportError, match=r"model\.router\.z_loss_coeff is not known"):
        export_run(run_dir, tmp_path / "hf", data_root=data_root)
    assert not (tmp_path / "hf").exists() and not list(tmp_path.glob(".hf*"))


def test_unfinished_run_is_refused(tmp_path, data_root):
    run_dir = fake_run(tmp_path, tiny_run().model)
    (run_dir / "train_summary.json").unlink()
    with pytest.raises(ExportError, match="the run has not finished"):
        export_run(run_dir, tmp_path / "hf", data_root=data_root)


# --------------------------------------------------------------------------------- every variant
def _variant_cases():
    from helpers.decode import VARIANTS, cfg_id

    return [pytest.param(c, id=cfg_id(c)) for c in VARIANTS]


@pytest.mark.parametrize("cfg", _variant_cases())
def test_every_decode_variant_exports_with_equal_logits(tmp_path, data_root, cfg):
    """Random weights, routers scaled so the causal decision splits tokens (test_decode.make)."""
    from helpers.decode import V, make

    model, x = make(cfg)
    hf = load_hf(export_run(fake_run(tmp_path, cfg, model, vocab=V), tmp_path / "hf", data_root=data_root))
    with torch.no_grad():
        ref = decode.full_forward_causal(model, x)
        out = hf(x)
        torch.testing.assert_close(out.logits, ref.logits, rtol=1e-5, atol=1e-5)
        if model.routers:
            assert torch.equal(out.depths, ref.routing.depths())
        torch.testing.assert_close(hf(x, routing="topk").logits, model(x).logits, rtol=1e-5, atol=1e-5)
        if cfg.num_recursions > 1 and cfg.variant != "vanilla":  # test-time depth cap (§ 5.3)
            capped = decode.full_forward_causal(model, x, max_depth=cfg.num_recursions - 1).logits
            torch.testing.assert_close(hf(x, max_depth=cfg.num_recursions - 1).logits, capped, rtol=1e-5, atol=1e-5)
    assert torch.equal(hf.generate(x[:, :4], attention_mask=torch.ones_like(x[:, :4]), max_new_tokens=6,
                                   do_sample=False), decode.generate(model, x[:, :4], 6))


RELAXED = [
    dict(variant="recursive", tying="cycle", num_recursions=2, kv="shared"),
    dict(variant="mor", tying="middle_cycle", num_recursions=3, kv="shared_dagger", router=RouterConfig(aux="aux_router")),
    dict(variant="mor", tying="sequence", num_recursions=2, router=RouterConfig(type="token_choice", func="softmax")),
]


@pytest.mark.parametrize("relaxation, rank", [("lora", 2), ("dora", 2), ("prefix", 3), ("recursion_pe", 0)])
@pytest.mark.parametrize("model_kw", RELAXED, ids=lambda kw: f"{kw['variant']}-{kw['tying']}-{kw['kv'] if 'kv' in kw else 'rw'}")
def test_relaxed_models_export_with_equal_logits(tmp_path, data_root, relaxation, rank, model_kw):
    """Relaxation parameters away from their identity init (LoRA B = 0, gains 1), so each counts."""
    from mor.config import ModelConfig
    from helpers.decode import V, make

    cfg = ModelConfig(scale="tiny", relaxation=relaxation, relaxation_rank=rank, **model_kw)
    model, x = make(cfg)
    with torch.no_grad():
        for p in model.relax.parameters():
            p.add_(0.3 * torch.randn_like(p))
    hf = load_hf(export_run(fake_run(tmp_path, cfg, model, vocab=V), tmp_path / "hf", data_root=data_root))
    with torch.no_grad():
        torch.testing.assert_close(hf(x).logits, decode.full_forward_causal(model, x).logits, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(hf(x, routing="topk").logits, model(x).logits, rtol=1e-5, atol=1e-5)
    assert torch.equal(hf.generate(x[:, :4], attention_mask=torch.ones_like(x[:, :4]), max_new_tokens=6,
                                   do_sample=False), decode.generate(model, x[:, :4], 6))


def test_cli_exports_and_refuses(trained, data_root, tmp_path, capsys):
    from mor.cli import main

    run, run_dir, _ = trained["mor-token-choice"]
    assert main(["export-hf", str(run_dir), str(tmp_path / "hf"), "--data-root", str(data_root)]) == 0
    assert (tmp_path / "hf" / "modeling_mor.py").exists() and "exported" in capsys.readouterr().out
    unfinished = fake_run(tmp_path / "unfinished", tiny_run().model)
    (unfinished / "train_summary.json").unlink()
    assert main(["export-hf", str(unfinished), str(tmp_path / "hf2"), "--data-root", str(data_root)]) == 2
    assert "the run has not finished" in capsys.readouterr().err and not (tmp_path / "hf2").exists()


# export-hf never deletes what it did not write (issue 57, item 2): --force replaces an earlier
# export (its .mor-export.json lists its files) and refuses everything else.
def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_force_refuses_a_folder_it_did_not_write(tmp_path):
    run_dir = fake_run(tmp_path, tiny_run().model)
    out = tmp_path / "mine"
    (out / "sub").mkdir(parents=True)
    (out / "notes.txt").write_text("keep me")
    (out / "sub" / "data.bin").write_bytes(b"\0\1")
    before = tree(tmp_path)
    for force in (False, True):
        with pytest.raises(ExportError, match=r"mine: not empty \(notes.txt, sub\) and not an earlier export"):
            export_run(run_dir, out, force=force)
    assert tree(tmp_path) == before


@pytest.mark.parametrize("where", ["runs", "runs/g", "runs/g/run", "results", ".", "..", "file"])
def test_force_never_writes_over_runs_results_a_run_or_the_repository(tmp_path, monkeypatch, capsys, where):
    from mor.cli import main

    repo = tmp_path / "checkout"
    (repo / "runs" / "g").mkdir(parents=True)
    monkeypatch.chdir(repo)
    (repo / "Snakefile").write_text("# a checkout\n")
    run_dir = fake_run(repo / "runs" / "g", tiny_run().model)
    (repo / "results").mkdir()
    (repo / "results" / "g.parquet").write_bytes(b"PAR1")
    (repo / "file").write_text("a file")
    before = tree(tmp_path)
    rc = main(["export-hf", "runs/g/run", where, "--force"])
    assert rc == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {where}: ") and err.count("\n") == 1, err
    assert ("never writes over it, with or without --force" in err) or "a file is there" in err
    assert tree(tmp_path) == before  # nothing deleted, nothing written


def test_force_replaces_an_earlier_export_and_only_it(tmp_path, data_root):
    import json

    run_dir = fake_run(tmp_path, tiny_run().model)
    out = tmp_path / "hf"
    (tmp_path / "beside.txt").write_text("untouched")
    export_run(run_dir, out, data_root=data_root)
    marker = json.loads((out / ".mor-export.json").read_text())
    assert set(marker["files"]) == set(tree(out)) - {".mor-export.json"} and "model.safetensors" in marker["files"]
    with pytest.raises(ExportError, match="hf: an earlier export; pass --force to replace it"):
        export_run(run_dir, out, data_root=data_root)
    (out / "model.safetensors").write_bytes(b"stale")  # replaced: the new export's own weights are there
    export_run(run_dir, out, data_root=data_root, force=True)
    assert (out / "model.safetensors").read_bytes() != b"stale"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["beside.txt", "hf", "run"]  # no leftover temporaries
    (out / "notes.txt").write_text("mine")  # a file the user put into an export is never deleted
    with pytest.raises(ExportError, match=r"hf: an earlier export, holding files export-hf did not write \(notes.txt\)"):
        export_run(run_dir, out, data_root=data_root, force=True)
    assert (out / "notes.txt").read_text() == "mine"
