"""Live training curves where researchers look: the train log mirrored to TensorBoard (and to
Weights & Biases, the optional ``[wandb]`` extra). Off by default.

Why a mirror and not a second log: ``train_log.jsonl`` stays the record every report reads
(``mor.train_log``); the sink only copies each logged row as it is written, the same step and
the same numbers (router statistics included), to the tools people already keep open while a
run trains. Nothing else depends on it, so a sink that fails to start warns and training goes on.

Turned on by one setting, ``live_curves``: the Slurm preset's entry (``live_curves:
tensorboard``) or ``$MOR_LIVE_CURVES`` for any launcher; ``tensorboard``, ``wandb`` or both
(``tensorboard,wandb``). TensorBoard event files go to ``runs/<id>/tensorboard/``
(``tensorboard --logdir runs``); W&B's run to ``runs/<id>/wandb/``, in the mode ``$WANDB_MODE``
names (``online``, ``offline``, ``disabled``), offline when it is unset: compute nodes rarely
reach the internet, and ``wandb sync`` uploads an offline run later. The W&B run is filed under
project ``$WANDB_PROJECT`` (default ``mor-repro``), group = the grid, tags = the run's block and
variant, so a grid's runs sit together and filter by block. A resumed run starts its
event file with ``purge_step`` at the checkpoint's step, so TensorBoard drops the steps the
log trimmed and every step shows once, as in the log.
"""

from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path

SINKS = ("tensorboard", "wandb")
WANDB_PROJECT = "mor-repro"  # when $WANDB_PROJECT is unset
WANDB_MODE = "offline"  # when $WANDB_MODE is unset: compute nodes rarely reach the internet
LIVE_CURVES_ENV = "MOR_LIVE_CURVES"
# the train log's keys drawn as curves, under a section each; anything else numeric goes to "train/"
ROUTER = ("aux_loss", "max_vio", "sampling_accuracy", "entropy", "dead_token_ratio")
SKIP = ("step",)


def parse_setting(value: str | None, where: str = "live_curves") -> tuple[str, ...]:
    """``"tensorboard,wandb"`` -> ("tensorboard", "wandb"); "", "off", "none" -> (); else ValueError."""
    text = (value or "").strip().lower()
    if text in ("", "off", "none", "false", "0"):
        return ()
    names = tuple(dict.fromkeys(n.strip() for n in text.replace("+", ",").split(",") if n.strip()))
    bad = [n for n in names if n not in SINKS]
    if bad:
        raise ValueError(f"{where}: {value!r}: unknown sink(s) {bad}; choose from {list(SINKS)} (comma-separated) or off")
    return names


def tag(key: str) -> str:
    """The curve's name: ``router/max_vio``, ``train/loss``."""
    return f"router/{key}" if key in ROUTER else f"train/{key}"


def scalars(row: dict) -> dict[str, float]:
    """The row's finite numbers by tag (nulls, text and NaN are not drawn)."""
    out = {}
    for k, v in row.items():
        if k in SKIP or isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            continue
        out[tag(k)] = float(v)
    return out


class TensorBoardSink:
    def __init__(self, run_dir: Path, start_step: int):
        from torch.utils.tensorboard import SummaryWriter  # needs the tensorboard package

        # purge_step: events an earlier session logged after the checkpoint it resumes from are dropped
        self.writer = SummaryWriter(log_dir=str(Path(run_dir) / "tensorboard"),
                                    purge_step=start_step + 1 if start_step else None, flush_secs=10)

    def write(self, row: dict) -> None:
        for name, value in scalars(row).items():
            self.writer.add_scalar(name, value, global_step=int(row["step"]))

    def close(self) -> None:
        self.writer.close()


@dataclass(frozen=True)
class RunLabels:
    """Where a run's curves are filed in a tracker: its grid (W&B's group) and tags (the grid
    block that produced it and its variant), so one grid's runs sit together and filter by block."""

    grid: str = ""
    block: str = ""
    variant: str = ""

    @property
    def tags(self) -> tuple[str, ...]:
        return tuple(t for t in (self.block, self.variant) if t)


def wandb_init_kwargs(run_dir: Path, run_id: str, config: dict, labels: RunLabels,
                      env: dict | None = None) -> dict:
    """``wandb.init``'s arguments: the mode and project from the environment (``$WANDB_MODE``,
    ``$WANDB_PROJECT``; offline and ``mor-repro`` when unset), group and tags from ``labels``, the
    run id as W&B's id so a resumed run continues its curves."""
    env = os.environ if env is None else env
    return dict(mode=env.get("WANDB_MODE") or WANDB_MODE, project=env.get("WANDB_PROJECT") or WANDB_PROJECT,
                group=labels.grid or None, tags=list(labels.tags), dir=str(Path(run_dir)), name=run_id, id=run_id,
                resume="allow", config=config)


class WandbSink:
    def __init__(self, run_dir: Path, start_step: int, run_id: str, config: dict, labels: RunLabels):
        import wandb

        self.run = wandb.init(**wandb_init_kwargs(run_dir, run_id, config, labels))

    def write(self, row: dict) -> None:
        self.run.log(scalars(row), step=int(row["step"]))

    def close(self) -> None:
        self.run.finish()


class LiveCurves:
    """The sinks a run asked for, fed one logged row at a time; a sink that cannot start or
    write is dropped with a warning (the train log is the record, not this)."""

    def __init__(self, names: tuple[str, ...], run_dir: Path, run_id: str = "", config: dict | None = None,
                 labels: RunLabels | None = None):
        self.names, self.run_dir, self.run_id, self.config = names, Path(run_dir), run_id, config or {}
        self.labels = labels or RunLabels()
        self.sinks: list = []

    def start(self, step: int) -> None:
        for name in self.names:
            try:
                sink = TensorBoardSink(self.run_dir, step) if name == "tensorboard" else \
                    WandbSink(self.run_dir, step, self.run_id, self.config, self.labels)
            except ImportError as e:
                extra = "pip install -e '.[wandb]'" if name == "wandb" else f"pip install {name}"
                _warn(f"live_curves: {name} is not installed ({e}); `{extra}` to see this run's curves "
                      "there (training goes on; train_log.jsonl has them)")
                continue
            except Exception as e:  # noqa: BLE001 - a broken sink must not stop training
                _warn(f"live_curves: {name} could not start ({type(e).__name__}: {e}); training goes on")
                continue
            self.sinks.append(sink)

    def write(self, row: dict) -> None:
        for sink in list(self.sinks):
            try:
                sink.write(row)
            except Exception as e:  # noqa: BLE001 - e.g. a full disk under the event file
                _warn(f"live_curves: {type(sink).__name__} stopped ({type(e).__name__}: {e}); training goes on")
                self.sinks.remove(sink)

    def close(self) -> None:
        for sink in self.sinks:
            try:
                sink.close()
            except Exception as e:  # noqa: BLE001
                _warn(f"live_curves: {type(sink).__name__} did not close cleanly ({e})")
        self.sinks = []


def _warn(msg: str) -> None:
    print(f"warning: {msg}", file=sys.stderr, flush=True)
