"""``python -m mor export-hf <run_dir> <out_dir>``: a trained run as a Hugging Face folder.

    out_dir/
      config.json              MoRConfig: shape (Llama names), every field of the run's model
                               config (``mor``), the resolved tying plan, KV producers, router
                               capacities, ``auto_map`` -> modeling_mor.py
      model.safetensors        our tensors renamed: embed_tokens -> model.embed_tokens,
                               unique_layers.i -> model.layers.i, norm -> model.norm,
                               routers.r -> model.routers.r (no lm_head: tied)
      modeling_mor.py          self-contained (torch + transformers), copied from this package
      generation_config.json   greedy
      tokenizer.json, tokenizer_config.json, special_tokens_map.json
      README.md                model card: training config, grid, commit, val NLL, routing
      .mor-export.json         the files above: `--force` replaces such a folder, and only it

``AutoModelForCausalLM.from_pretrained(out_dir, trust_remote_code=True)`` loads it. Every
variant, tying scheme, KV strategy, router and relaxation (LoRA / DoRA / prefix / recursion
PE) of ``mor.config`` is in the modeling file; what it cannot express is refused before
anything is written (``ExportError``): a run that has not finished, and any config field or
value missing from ``SUPPORTED`` (an option added after the exporter). A vanilla export keeps
the Llama names and shape fields, so ``mor.checkpoints.hf`` (up-training) reads it back.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

from mor.atomic import replace_dir, temp_sibling
from mor.capacity import capacities
from mor.config import run_config_from_dict
from mor.data.paths import data_paths
from mor.layout import RunPaths, row_file
from mor.model.routers.registry import exported_archs, exported_kinds, router_kind
from mor.model.tying import kv_producers, model_plan

MODELING_FILE = Path(__file__).with_name("modeling_mor.py")
ROUTINGS = ("causal", "topk")


class ExportError(ValueError):
    """A run cannot be exported as it is; the message says why and what would work."""


# What modeling_mor.py implements, per field of mor.config.ModelConfig / RouterConfig: the
# values it computes with (None: any value; the field is copied into config.json, or does not
# change inference). A field or value not listed here is refused, so a config option added
# later is never exported as a silently different model.
SUPPORTED = {
    "scale": None, "layers": None, "reduced": None, "tying": None, "num_recursions": None,
    "variant": ("vanilla", "recursive", "mor"), "kv": ("recursion_wise", "shared", "shared_dagger"),
    "relaxation": ("none", "lora", "dora", "prefix", "recursion_pe"), "relaxation_rank": None,
    "tied_init": None, "init_checkpoint": None, "weight_init": None, "attention": None,  # training-time / same math
    "residual_init": None, "recursion_attention": ("tied",),  # untied: one attention per recursion, not exported
    "import_checkpoint": None, "import_sha256": None,  # where the weights came from (the authors'; issue 62)
    "router": {
        "type": exported_kinds(), "func": ("sigmoid", "tanh", "softmax", "none"), "alpha": None,
        "temperature": None, "arch": exported_archs(), "gating": ("weighted", "additive"),
        "capacity": None, "aux": ("aux_loss", "aux_router"), "balancing": ("loss", "loss_free"),
        "combine": ("layer_output", "layer_update"), "capacity_rounding": ("floor", "ceil"),
        # training losses and schedules only
        "aux_coeff": None, "aux_accum_steps": None, "capacity_warmup_steps": None, "balance_coeff": None, "bias_update_rate": None,
        "z_loss_coeff": None,
    },
}


def refusal(model_cfg, supported: dict | None = None, where: str = "model") -> str | None:
    """Why the modeling file cannot express this model config, or None when it can."""
    supported = SUPPORTED if supported is None else supported
    for f in dataclasses.fields(model_cfg):
        value = getattr(model_cfg, f.name)
        if f.name not in supported:
            return (f"{where}.{f.name} is not known to the exporter (a newer config option): "
                    "modeling_mor.py would ignore it")
        allowed = supported[f.name]
        if isinstance(allowed, dict):
            why = refusal(value, allowed, f"{where}.{f.name}")
            if why:
                return why
        elif allowed is not None and value not in allowed:
            return f"{where}.{f.name}={value!r} is not in the exported modeling file (it has {list(allowed)})"
    return None


def hf_tensor_name(name: str) -> str:
    """Our parameter name -> the exported one."""
    for ours, theirs in (("unique_layers.", "model.layers."), ("routers.", "model.routers."), ("relax.", "model.relax.")):
        if name.startswith(ours):
            return theirs + name[len(ours):]
    return {"embed_tokens.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight"}[name]


def hf_config(model, run, routing: str) -> dict:
    """config.json of a built model of ``run`` (a ``mor.config.RunConfig``)."""
    s, m = model.shape, run.model
    plan = model_plan(m, s.layers)
    return {
        "architectures": ["MoRForCausalLM"], "model_type": "mor",
        "auto_map": {"AutoConfig": "modeling_mor.MoRConfig", "AutoModelForCausalLM": "modeling_mor.MoRForCausalLM"},
        "vocab_size": model.vocab_size, "hidden_size": s.hidden, "intermediate_size": s.mlp,
        "num_hidden_layers": len(model.unique_layers), "num_attention_heads": s.heads,
        "num_key_value_heads": s.kv_heads, "head_dim": s.head_dim, "max_position_embeddings": s.max_seq_len,
        "rope_theta": s.rope_theta, "rms_norm_eps": s.norm_eps, "hidden_act": "silu",
        "attention_bias": False, "mlp_bias": False, "initializer_range": s.init_std, "tie_word_embeddings": True,
        "dtype": "float32",
        "variant": m.variant, "num_recursions": m.num_recursions, "kv": m.kv,
        "layer_plan": {"prefix": list(plan.prefix), "recursions": [list(r) for r in plan.recursions],
                       "suffix": list(plan.suffix)},
        "kv_producers": list(kv_producers(plan, m.kv, m.variant, m.tying, m.num_recursions)),
        "router": dataclasses.asdict(m.router) if m.variant == "mor" else {},
        "router_capacities": capacities(m.num_recursions, m.router.capacity) if m.variant == "mor" else [],
        "routing": routing, "max_depth": None, "relaxation": m.relaxation, "relaxation_rank": m.relaxation_rank,
        "mor": {"model": dataclasses.asdict(m), "scale": dataclasses.asdict(s), "run_id": run.run_id,
                "grid": run.grid, "config_hash": run.config_hash},
        # no eos_token_id: generate() runs max_new_tokens, as decode.generate does (model card)
        "bos_token_id": None, "pad_token_id": None,
    }


def _read_json(path: Path, what: str) -> dict:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise ExportError(f"{path}: {what} not found") from None
    except json.JSONDecodeError as e:
        raise ExportError(f"{path}: {what} is not valid JSON ({e})") from None


def val_nll(run_dir: Path, grid: str, run_id: str, results: Path) -> dict:
    """The run's validation NLLs from its result row (``results/runs/<grid>/<id>.parquet``), if any."""
    row = row_file(results, grid, run_id)
    if not row.exists():
        return {}
    from mor.results import read_rows

    row = read_rows(row).to_pylist()[0]
    return {k: row[k] for k in ("val_nll", "val_nll_causal", "val_tokens") if row.get(k) is not None}


def model_card(run, meta: dict, summary: dict, nll: dict, routing: str) -> str:
    m = run.model
    what = {"vanilla": "Vanilla Transformer", "recursive": f"Recursive Transformer ({m.tying}, Nr={m.num_recursions})",
            "mor": f"Mixture-of-Recursions ({m.router.type.replace('_', '-')} router, {m.tying}, Nr={m.num_recursions})"}
    routed = m.variant == "mor"
    if not routed:
        how = "no router: every token runs every recursion."
    else:
        how = router_kind(m.router.type).card_text(m, routing)
    nll_lines = (f"- validation NLL (teacher-forced{', top-k routing' if routed else ''}): {nll['val_nll']:.4f}\n"
                 f"- validation NLL (causal routing): {nll['val_nll_causal']:.4f} over {nll.get('val_tokens')} tokens\n"
                 if "val_nll" in nll else "- validation NLL: not evaluated (no result row for this run)\n")
    return f"""---
library_name: transformers
tags: [mixture-of-recursions, mor-repro]
---
# {run.run_id}

{what[m.variant]} trained by mor-repro (a reproduction of *Mixture-of-Recursions*, Bae et al.,
NeurIPS 2025), exported with `python -m mor export-hf`.

```python
from transformers import AutoModelForCausalLM, AutoTokenizer
model = AutoModelForCausalLM.from_pretrained("<this folder>", trust_remote_code=True)
tok = AutoTokenizer.from_pretrained("<this folder>", trust_remote_code=True)
```

- grid: `{run.grid}`, run id `{run.run_id}`, config hash `{run.config_hash}`
- git commit: `{meta.get('git_commit', 'unknown')}`
- parameters: {meta.get('n_params', 'unknown')} (tied tensors once)
- trained: {summary.get('steps')} steps, {summary.get('tokens_seen')} tokens, final train loss {summary.get('final_loss', float('nan')):.4f}
{nll_lines}
## Routing at inference

{how}
`generate()` recomputes the whole prefix each step (no KV cache) and gives the same tokens
as mor-repro's cached greedy `decode.generate`. Like it, it does not stop at `<|endoftext|>`
unless asked: `model.generate(ids, max_new_tokens=n, eos_token_id=tok.eos_token_id)`.

## Training config

```json
{json.dumps(run.to_dict(), indent=2, sort_keys=True)}
```
"""


def write_tokenizer(spec: str, out: Path) -> None:
    """The run's tokenizer as a transformers fast tokenizer (``<|endoftext|>`` = eos)."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    from mor.data.tokenizer import EOS

    path = Path(spec)
    if path.suffix == ".json":
        if not path.is_file():
            raise ExportError(f"tokenizer {path} not found: build it first (the workflow's data rules), or pass "
                              "--data-root to the folder that holds tokenizer/")
        tok = PreTrainedTokenizerFast(tokenizer_file=str(path), eos_token=EOS)
    else:
        try:
            tok = AutoTokenizer.from_pretrained(spec)
        except Exception as e:  # offline without a cached copy
            raise ExportError(f"tokenizer {spec!r} could not be loaded ({type(e).__name__}: {e})") from None
    tok.save_pretrained(str(out))


# What export-hf writes beside the model: the files it wrote, so that `--force` replaces an
# earlier export (and nothing else: a folder holding a file it did not write is refused).
MARKER = ".mor-export.json"


def _repositories() -> list[Path]:
    """This package's checkout and the working directory's, where they are checkouts (a Snakefile)."""
    here = Path(__file__).resolve().parents[3]  # src/mor/export_hf/__init__.py -> the checkout
    return [p for p in {here, Path.cwd().resolve()} if (p / "Snakefile").exists() or (p / ".git").exists()]


def check_destination(out_dir: Path, run_dir: Path, results: Path, force: bool) -> None:
    """``out_dir`` may be written: absent, an empty folder, or (with ``force``) an earlier export
    holding only the files its marker lists. Never, even with ``force``: a run folder, ``runs/``,
    ``results/``, a repository, or any folder holding one of them (they would be deleted)."""
    from mor.layout import RESULTS, RUNS

    target = out_dir.resolve()
    guarded = {run_dir.resolve(): "the run being exported", Path(RUNS).resolve(): "the runs folder",
               Path(RESULTS).resolve(): "the results folder", results.resolve(): "the results folder"}
    for up in (run_dir.resolve().parent, run_dir.resolve().parent.parent):  # runs/<id>; runs/<grid>/<id> before
        if up.name == RUNS:
            guarded[up] = "the runs folder"
    guarded.update({repo: "the repository" for repo in _repositories()})
    for path, what in guarded.items():
        if path == target or target in path.parents:
            held = "is" if path == target else f"holds {path}:"
            raise ExportError(f"{out_dir}: {held} {what}; export-hf never writes over it, with or without --force: "
                              "export into a new folder (e.g. exports/<name>)")
    if not out_dir.exists():
        return
    if not out_dir.is_dir():
        raise ExportError(f"{out_dir}: a file is there; export into a folder (export-hf replaces only a folder it wrote)")
    held = RunPaths.of(out_dir)  # the layout's names (mor.layout), not spelled again here
    if held.config.exists() and held.summary.exists() or held.final.is_dir():
        raise ExportError(f"{out_dir}: a run folder; export-hf never writes over it, with or without --force: "
                          "export into a new folder")
    names = sorted(p.name for p in out_dir.iterdir())
    if not names:
        return
    try:
        ours = set(json.loads((out_dir / MARKER).read_text())["files"]) | {MARKER}
    except (OSError, ValueError, KeyError, TypeError):
        ours = None
    if ours is None:
        names = names[:4]
        raise ExportError(f"{out_dir}: not empty ({', '.join(names)}{' ...' if len(names) == 4 else ''}) and not an "
                          f"earlier export (no {MARKER}); export-hf deletes only what it wrote, --force included: "
                          "export into a new folder, or empty this one yourself")
    held = sorted(p.relative_to(out_dir).as_posix() for p in out_dir.rglob("*") if not p.is_dir())
    dirs = sorted(p.relative_to(out_dir).as_posix() for p in out_dir.rglob("*") if p.is_dir())
    foreign = [f for f in held if f not in ours] + [d for d in dirs if not any(f.startswith(d + "/") for f in ours)]
    if foreign:
        raise ExportError(f"{out_dir}: an earlier export, holding files export-hf did not write "
                          f"({', '.join(foreign[:4])}{' ...' if len(foreign) > 4 else ''}); move them out, then "
                          "export again with --force (it deletes only what it wrote)")
    if not force:
        raise ExportError(f"{out_dir}: an earlier export; pass --force to replace it, or export into a new folder")


def export_run(run_dir: str | Path, out_dir: str | Path, data_root: str | Path = "data",
               results: str | Path = "results", routing: str = "causal", force: bool = False) -> Path:
    """Write ``out_dir`` from the finished run in ``run_dir`` (atomically: all or nothing), with
    the marker listing what it wrote. ``out_dir`` is checked first (check_destination): an
    earlier export is replaced only with ``force``; anything else non-empty is refused."""
    from safetensors.torch import save_file

    from mor.trained import open_run

    if routing not in ROUTINGS:
        raise ExportError(f"routing={routing!r}; choose one of {list(ROUTINGS)}")
    run_dir, out_dir = Path(run_dir), Path(out_dir)
    check_destination(out_dir, run_dir, Path(results), force)
    files = RunPaths.of(run_dir)
    meta = _read_json(files.config, "run config")
    run = run_config_from_dict(meta["config"])
    why = refusal(run.model)
    if why:
        raise ExportError(f"{run_dir}: cannot export run {run.run_id}: {why}")
    summary = _read_json(files.summary, "training summary (the run has not finished)")
    model = open_run(run_dir, run, "cpu", data_root).model  # checked as the eval job checks it
    tensors = {hf_tensor_name(n): p.detach().contiguous().clone() for n, p in model.named_parameters()}
    nll = val_nll(run_dir, run.grid, run.run_id, Path(results))
    tmp = temp_sibling(out_dir)
    tmp.mkdir(parents=True)
    try:
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(hf_config(model, run, routing), indent=2) + "\n")
        (tmp / "generation_config.json").write_text(json.dumps(
            {"do_sample": False, "use_cache": False}, indent=2) + "\n")
        shutil.copy2(MODELING_FILE, tmp / MODELING_FILE.name)
        write_tokenizer(data_paths(run.data, Path(data_root)).tokenizer, tmp)
        (tmp / "README.md").write_text(model_card(run, meta, summary, nll, routing))
        written = sorted(str(p.relative_to(tmp)) for p in tmp.rglob("*") if p.is_file())
        (tmp / MARKER).write_text(json.dumps({"run_id": run.run_id, "grid": run.grid, "run_dir": str(run_dir),
                                              "files": written}, indent=2) + "\n")
        check_destination(out_dir, run_dir, Path(results), force)  # as it is now, just before replacing it
        replace_dir(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir
