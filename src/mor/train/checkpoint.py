"""Checkpoints: model and optimizer tensors in safetensors, everything else in a small JSON.

Layout of one checkpoint::

    checkpoints/step-000120/
        model.safetensors       unique parameters by name (tied tensors stored once)
        optimizer.safetensors   AdamW exp_avg / exp_avg_sq by parameter name
        state.json              step, tokens seen, optimizer step counts, torch RNG, config
                                hash, training time so far, the last step's metrics, and the
                                size and sha256 of both tensor files (written last)
    checkpoints/latest.json     {"path": "step-000120"}

Crash safety: a checkpoint is written into a hidden temporary folder and renamed into place
(``mor.atomic.replace_dir``); the previous checkpoints stay until the new one is complete and
``latest.json`` points at it. Resuming tries ``latest.json``'s checkpoint, then every other
``step-*`` newest first, and skips (with a warning naming the file) any whose state is
unreadable or whose tensor files do not match the sizes and digests recorded in its state,
so a torn or corrupt file is never loaded and a kill at any moment costs at most the steps
since the previous good checkpoint.

The file format (safetensors by parameter name, the records of sizes and digests, reading a
model's weights alone) is ``mor.checkpoints.native``'s; this module holds what a training
checkpoint keeps and how training resumes from one.
"""

from __future__ import annotations

import errno
import json
import shutil
import sys
from pathlib import Path
from typing import Callable

import torch
from safetensors import SafetensorError

from mor.atomic import remove_stale, replace_dir, temp_sibling, write_json_atomic
from mor.checkpoints.native import CheckpointError, check_names, read_state, read_tensors, save_tensors

TENSOR_FILES = ("model.safetensors", "optimizer.safetensors")

__all__ = ["CheckpointError", "CheckpointMismatch", "save_checkpoint", "load_latest", "apply_checkpoint",
           "load_branch_point"]


class CheckpointMismatch(CheckpointError):
    """The checkpoint folder belongs to another training config (never skipped silently)."""


def save_checkpoint(ckpt_dir: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict,
                    keep: int = 2) -> Path:
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    remove_stale(ckpt_dir)  # temporaries of a writer that was killed
    name = f"step-{state['step']:06d}"
    final = ckpt_dir / name
    tmp = temp_sibling(final)
    tmp.mkdir()
    try:
        params = {n: p.detach().contiguous().cpu() for n, p in model.named_parameters()}
        files = {"model.safetensors": save_tensors(params, tmp / "model.safetensors")}
        opt_tensors, opt_steps = {}, {}
        names = {id(p): n for n, p in model.named_parameters()}
        for p, s in optimizer.state.items():
            n = names[id(p)]
            opt_tensors[f"{n}.exp_avg"] = s["exp_avg"].contiguous().cpu()
            opt_tensors[f"{n}.exp_avg_sq"] = s["exp_avg_sq"].contiguous().cpu()
            opt_steps[n] = float(s["step"])
        files["optimizer.safetensors"] = save_tensors(opt_tensors, tmp / "optimizer.safetensors")
        full_state = dict(state, optimizer_steps=opt_steps, torch_rng=torch.get_rng_state().tolist(), files=files)
        write_json_atomic(tmp / "state.json", full_state)
        replace_dir(tmp, final)
    except (OSError, SafetensorError) as e:  # safetensors' "No space left on device (os error 28)" names no file
        code = getattr(e, "errno", None) or (errno.ENOSPC if "os error 28" in str(e) else errno.EIO)
        raise OSError(code, f"checkpoint {final} could not be written ({e}); the previous checkpoint in "
                            f"{ckpt_dir} is intact and the run resumes from it once there is room") from e
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    write_json_atomic(ckpt_dir / "latest.json", {"path": name})
    for old in _step_dirs(ckpt_dir)[keep:]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def _step_dirs(ckpt_dir: Path) -> list[Path]:
    """Complete-looking checkpoint folders, newest first (temporaries are hidden, not listed)."""
    return sorted((p for p in ckpt_dir.glob("step-*") if p.is_dir()), reverse=True)


def _candidates(ckpt_dir: Path, warn: Callable[[str], None]) -> list[Path]:
    """``latest.json``'s checkpoint first, then every other one newest first."""
    out: list[Path] = []
    pointer = ckpt_dir / "latest.json"
    if pointer.exists():
        try:
            out.append(ckpt_dir / json.loads(pointer.read_text())["path"])
        except (OSError, json.JSONDecodeError, KeyError, TypeError) as e:
            warn(f"{pointer} is unreadable ({e}); looking for the newest good checkpoint instead")
    return list(dict.fromkeys(out + _step_dirs(ckpt_dir)))


def _none_good(ckpt_dir: Path, problems: list[str]) -> str:
    return (f"no intact checkpoint in {ckpt_dir}: " + "; ".join(problems) +
            f". Delete {ckpt_dir} to train this run from scratch")


def load_latest(ckpt_dir: Path, config_hash: str, warn: Callable[[str], None] | None = None
                ) -> tuple[Path, dict, dict[str, torch.Tensor], dict[str, torch.Tensor]] | None:
    """(path, state, model tensors, optimizer tensors) of the newest intact checkpoint, or None.

    A checkpoint of another training config raises ``CheckpointMismatch``: its folder is
    another run's, and resuming from it (or skipping it) would mix two runs.
    """
    warn = warn or _warn
    found, problems = _candidates(ckpt_dir, warn), []
    for path in found:
        try:
            state = read_state(path, TENSOR_FILES)
            if state.get("config_hash") != config_hash:
                raise CheckpointMismatch(
                    f"{path} was written by training config {state.get('config_hash')}, not this run's "
                    f"{config_hash}: {ckpt_dir} belongs to another run; move it away to train this one")
            return path, state, read_tensors(path / "model.safetensors"), read_tensors(path / "optimizer.safetensors")
        except CheckpointMismatch:
            raise
        except CheckpointError as e:
            warn(f"skipping checkpoint {path}: {e}")
            problems.append(str(e))
    if found:
        raise CheckpointError(_none_good(ckpt_dir, problems))
    return None


def load_branch_point(path: Path, run_id: str, step: int) -> tuple[dict, dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(state, model tensors, optimizer tensors) of the checkpoint a decay branch starts from
    (mor.branching): ``path`` must be run ``run_id``'s intact checkpoint of step ``step``; any
    other (a missing folder, another run's or step's, a torn file) stops the branch, naming it."""
    if not path.is_dir():
        raise CheckpointError(f"{path} does not exist: run {run_id} has kept no checkpoint at step {step} for this "
                              f"branch (train it with train.save_steps holding {step}; a run finished before it kept "
                              "branch points must be trained again)")
    state = read_state(path, TENSOR_FILES)
    if state.get("step") != step or not str(state.get("config_hash", "")).startswith(run_id[-8:]):
        raise CheckpointMismatch(f"{path} holds step {state.get('step')} of training config {state.get('config_hash')}, "
                                 f"not step {step} of run {run_id}")
    return state, read_tensors(path / "model.safetensors"), read_tensors(path / "optimizer.safetensors")


def _warn(msg: str) -> None:
    print(f"warning: {msg}", file=sys.stderr, flush=True)


def apply_checkpoint(model: torch.nn.Module, optimizer: torch.optim.Optimizer, path: Path, state: dict,
                     tensors: dict[str, torch.Tensor], moments: dict[str, torch.Tensor],
                     place: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None) -> None:
    """Copy a checkpoint read by ``load_latest`` into model and optimizer, and restore the RNG.

    ``place(full, param)`` turns a full tensor into what ``param`` holds (FSDP: this rank's
    shard); by default it is moved to the parameter's device.
    """
    place = place or (lambda full, p: full.to(p.device))
    check_names(path / "model.safetensors", tensors, model)
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(place(tensors[n], p))
            if n in state["optimizer_steps"]:
                optimizer.state[p] = {
                    "step": torch.tensor(state["optimizer_steps"][n]),
                    "exp_avg": place(moments[f"{n}.exp_avg"], p),
                    "exp_avg_sq": place(moments[f"{n}.exp_avg_sq"], p),
                }
    torch.set_rng_state(torch.tensor(state["torch_rng"], dtype=torch.uint8))
