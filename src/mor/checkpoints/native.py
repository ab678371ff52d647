"""Our own weights format: safetensors files by parameter name, and the record that tells a whole one.

    save_tensors(tensors, file)        write a safetensors file -> its record {"bytes", "sha256"}
    read_tensors(file)                 every tensor of one; a torn or foreign file is a CheckpointError
    load_model_weights(path, model)    a model.safetensors (or its folder) into a model, strictly
    read_state(folder, tensor_files)   a checkpoint folder's state.json, its tensor files checked
                                       against the sizes and digests it records

A run's final weights (``final/model.safetensors``) hold every parameter by its name in the
model (tied tensors once); a training checkpoint (``mor.train.checkpoint``: what it holds and how
it resumes) adds the optimizer's moments in a second file and a ``state.json`` that records both
files' sizes and sha256 digests, written last. Readers of a trained run (``mor.trained``) and
training read them here, so neither format lives in the network package nor in the trainer.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from mor.atomic import sha256_file

MODEL_FILE = "model.safetensors"

__all__ = ["CheckpointError", "MODEL_FILE", "save_tensors", "read_tensors", "check_names", "load_model_weights",
           "read_state"]


class CheckpointError(RuntimeError):
    """A checkpoint on disk is missing, corrupt, or belongs to another config."""


def save_tensors(tensors: dict[str, torch.Tensor], file: Path | str) -> dict:
    """Write ``tensors`` (contiguous, on the CPU) as a safetensors file -> the record a state keeps of it."""
    save_file(tensors, str(file))
    return {"bytes": Path(file).stat().st_size, "sha256": sha256_file(file)}


def read_tensors(file: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a safetensors file; a torn or foreign file is a ``CheckpointError`` naming it."""
    try:
        return load_file(str(file))
    except (SafetensorError, OSError, ValueError) as e:
        raise CheckpointError(f"{file} is corrupt or unreadable: {e}") from None


def check_names(file: Path | str, tensors: dict[str, Any], model: torch.nn.Module) -> None:
    expected = {n for n, _ in model.named_parameters()}
    missing, unexpected = sorted(expected - set(tensors)), sorted(set(tensors) - expected)
    if missing or unexpected:
        raise CheckpointError(f"{file} does not match the model: missing {missing[:5]}, unexpected {unexpected[:5]}")


def load_model_weights(path: Path, model: torch.nn.Module) -> None:
    """Load model.safetensors (a checkpoint folder or the file) into model, strictly."""
    path = Path(path)
    file = path / MODEL_FILE if path.is_dir() else path
    tensors = read_tensors(file)
    check_names(file, tensors, model)
    expected = dict(model.named_parameters())
    with torch.no_grad():
        for n, p in expected.items():
            if tensors[n].shape != p.shape:
                raise CheckpointError(f"{file}: {n} has shape {tuple(tensors[n].shape)}, model expects {tuple(p.shape)}")
        for n, p in expected.items():
            p.copy_(tensors[n])


def read_state(path: Path, tensor_files: tuple[str, ...]) -> dict:
    """A checkpoint's state.json, with its ``tensor_files`` checked against the recorded sizes and
    digests; raises CheckpointError naming the bad file."""
    state_file = path / "state.json"
    try:
        state = json.loads(state_file.read_text())
        files = state["files"]
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as e:
        raise CheckpointError(f"{state_file} is missing, corrupt or from an older format ({e!r})") from None
    for f in tensor_files:
        p = path / f
        if not p.exists():
            raise CheckpointError(f"{p} is missing")
        if p.stat().st_size != files[f]["bytes"]:
            raise CheckpointError(f"{p} is truncated or overwritten: {p.stat().st_size} bytes, "
                                  f"{files[f]['bytes']} recorded")
        if sha256_file(p) != files[f]["sha256"]:
            raise CheckpointError(f"{p} is corrupt: its sha256 differs from the one recorded in {state_file}")
    return state
