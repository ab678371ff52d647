"""A run's network, built apart from training: the device and the model of a run's config.

Training (``mor.train``) and every job that only reads a model (``mor.trained.open_run``) build
it here, so a reader never imports the trainer (torchtitan builds each model from its spec
apart from the training loop). Its weights come from a checkpoint format (``mor.checkpoints``):
a run's own final weights (``native``), or up-training's start point (``hf.init_from_checkpoint``, which the
trainer calls only for a run that names ``model.init_checkpoint``).

    pick_device(requested)                the GPU when there is one, else the CPU
    make_model(run, vocab_size, device)   the run's network, seeded by train.seed
"""

from __future__ import annotations

import torch

from mor.config import RunConfig, model_shape
from mor.model.transformer import MoRTransformer, build_model

__all__ = ["pick_device", "make_model"]


def pick_device(requested: str | torch.device = "auto") -> torch.device:
    """``auto``: the GPU when there is one, else the CPU; anything else as named."""
    if requested != "auto":
        return torch.device(requested)
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def make_model(run: RunConfig, vocab_size: int, device: torch.device) -> MoRTransformer:
    """The run's network with its seeded initial weights (``model.init_checkpoint`` is not read:
    ``mor.train.trainer.initial_model`` loads it for training; readers overwrite every weight)."""
    shape = model_shape(run.model)
    vocab = shape.vocab or vocab_size
    if shape.vocab and shape.vocab < vocab_size:
        raise ValueError(f"scale {shape.name} has vocab {shape.vocab} < tokenizer's {vocab_size}")
    return build_model(run.model, shape, vocab, device=device, init_seed=run.train.seed)  # CRN keyed by the run's seed
