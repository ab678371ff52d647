"""Checkpoints: model and optimizer tensors in safetensors, everything else in a small JSON.

Layout of one checkpoint (written to ``step-N.tmp`` then renamed, so a crash never leaves a
half-written ``step-N``)::

    checkpoints/step-000120/
        model.safetensors       unique parameters by name (tied tensors stored once)
        optimizer.safetensors   AdamW exp_avg / exp_avg_sq by parameter name
        state.json              step, tokens seen, optimizer step counts, torch RNG, config hash
    checkpoints/latest.json     {"path": "step-000120"}  (replaced atomically)
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file


class CheckpointError(RuntimeError):
    """A checkpoint on disk is missing, corrupt, or belongs to another config."""


def write_json_atomic(path: Path, obj: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=True))
    os.replace(tmp, path)


def save_checkpoint(ckpt_dir: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict, keep: int = 2) -> Path:
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    name = f"step-{state['step']:06d}"
    tmp, final = ckpt_dir / f"{name}.tmp", ckpt_dir / name
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    params = {n: p.detach().contiguous().cpu() for n, p in model.named_parameters()}
    save_file(params, str(tmp / "model.safetensors"))
    opt_tensors, opt_steps = {}, {}
    names = {id(p): n for n, p in model.named_parameters()}
    for p, s in optimizer.state.items():
        n = names[id(p)]
        opt_tensors[f"{n}.exp_avg"] = s["exp_avg"].contiguous().cpu()
        opt_tensors[f"{n}.exp_avg_sq"] = s["exp_avg_sq"].contiguous().cpu()
        opt_steps[n] = float(s["step"])
    save_file(opt_tensors, str(tmp / "optimizer.safetensors"))
    full_state = dict(state, optimizer_steps=opt_steps, torch_rng=torch.get_rng_state().tolist())
    write_json_atomic(tmp / "state.json", full_state)
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    write_json_atomic(ckpt_dir / "latest.json", {"path": name})
    for old in sorted(p for p in ckpt_dir.glob("step-*") if p.is_dir() and not p.name.endswith(".tmp"))[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def latest_checkpoint(ckpt_dir: Path) -> Path | None:
    pointer = ckpt_dir / "latest.json"
    if not pointer.exists():
        return None
    try:
        path = ckpt_dir / json.loads(pointer.read_text())["path"]
    except (json.JSONDecodeError, KeyError) as e:
        raise CheckpointError(f"{pointer} is corrupt ({e}); delete it to restart from scratch") from None
    if not path.is_dir():
        raise CheckpointError(f"{pointer} points at missing checkpoint {path}")
    return path


def load_model_weights(path: Path, model: torch.nn.Module) -> None:
    """Load model.safetensors (a checkpoint folder or the file) into model, strictly."""
    file = path / "model.safetensors" if path.is_dir() else path
    try:
        tensors = load_file(str(file))
    except (SafetensorError, OSError, ValueError) as e:
        raise CheckpointError(f"{file} is corrupt or unreadable: {e}") from None
    expected = dict(model.named_parameters())
    missing, unexpected = sorted(set(expected) - set(tensors)), sorted(set(tensors) - set(expected))
    if missing or unexpected:
        raise CheckpointError(f"{file} does not match the model: missing {missing[:5]}, unexpected {unexpected[:5]}")
    with torch.no_grad():
        for n, p in expected.items():
            if tensors[n].shape != p.shape:
                raise CheckpointError(f"{file}: {n} has shape {tuple(tensors[n].shape)}, model expects {tuple(p.shape)}")
            p.copy_(tensors[n])


def load_checkpoint(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """Restore model, optimizer and RNG from a checkpoint folder; returns its state dict."""
    try:
        state = json.loads((path / "state.json").read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path / 'state.json'} is corrupt or unreadable: {e}") from None
    load_model_weights(path, model)
    try:
        opt = load_file(str(path / "optimizer.safetensors"))
    except (SafetensorError, OSError, ValueError) as e:
        raise CheckpointError(f"{path / 'optimizer.safetensors'} is corrupt or unreadable: {e}") from None
    for n, p in model.named_parameters():
        if n in state["optimizer_steps"]:
            optimizer.state[p] = {
                "step": torch.tensor(state["optimizer_steps"][n]),
                "exp_avg": opt[f"{n}.exp_avg"].to(p.device),
                "exp_avg_sq": opt[f"{n}.exp_avg_sq"].to(p.device),
            }
    torch.set_rng_state(torch.tensor(state["torch_rng"], dtype=torch.uint8))
    return state
