"""A run's model, built and loaded apart from training: the device, the network, its weights.

Training (``mor.train``) and every job that only reads a model (``mor.trained.open_run``) build
it here, so a reader never imports the trainer (torchtitan builds each model from its spec
apart from the training loop; nanoGPT's ``sample.py`` opens a checkpoint in a dozen lines).

    make_model(run, vocab_size, device)   the run's network, seeded by train.seed
    load_model_weights(path, model)       a model.safetensors (or its folder) into it, strictly
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from mor.config import RunConfig, model_shape
from mor.model.transformer import MoRTransformer, build_model

__all__ = ["CheckpointError", "pick_device", "make_model", "read_tensors", "check_names", "load_model_weights"]


class CheckpointError(RuntimeError):
    """A checkpoint on disk is missing, corrupt, or belongs to another config."""


def pick_device(requested: str | torch.device = "auto") -> torch.device:
    """``auto``: the GPU when there is one, else the CPU; anything else as named."""
    if requested != "auto":
        return torch.device(requested)
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def make_model(run: RunConfig, vocab_size: int, device: torch.device, load_init: bool = True) -> MoRTransformer:
    """The run's model; ``model.init_checkpoint`` (up-training) is loaded unless ``load_init``
    is False (readers of a trained run, which overwrite every weight with its final ones anyway)."""
    shape = model_shape(run.model)
    vocab = shape.vocab or vocab_size
    if shape.vocab and shape.vocab < vocab_size:
        raise ValueError(f"scale {shape.name} has vocab {shape.vocab} < tokenizer's {vocab_size}")
    model = build_model(run.model, shape, vocab, device=device, init_seed=run.train.seed)  # CRN keyed by the run's seed
    if load_init and run.model.init_checkpoint:
        from mor.model.init_from_hf import init_from_checkpoint

        init_from_checkpoint(model, run.model.init_checkpoint, run.model.tied_init)
    return model


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
    file = path / "model.safetensors" if path.is_dir() else path
    tensors = read_tensors(file)
    check_names(file, tensors, model)
    expected = dict(model.named_parameters())
    with torch.no_grad():
        for n, p in expected.items():
            if tensors[n].shape != p.shape:
                raise CheckpointError(f"{file}: {n} has shape {tuple(tensors[n].shape)}, model expects {tuple(p.shape)}")
        for n, p in expected.items():
            p.copy_(tensors[n])
