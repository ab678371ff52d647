"""Live training curves where researchers look: the train log mirrored to TensorBoard (and to
Weights & Biases in offline mode, when it is installed). Off by default.

Why a mirror and not a second log: ``train_log.jsonl`` stays the record every report reads
(``mor.train_log``); the sink only copies each logged row as it is written, the same step and
the same numbers (router statistics included), to the tools people already keep open while a
run trains. Nothing else depends on it, so a sink that fails to start warns and training goes on.

Turned on by one setting, ``live_curves``: the Slurm preset's entry (``live_curves:
tensorboard``) or ``$MOR_LIVE_CURVES`` for any launcher; ``tensorboard``, ``wandb`` or both
(``tensorboard,wandb``). TensorBoard event files go to ``runs/<id>/tensorboard/``
(``tensorboard --logdir runs``); W&B's offline run to ``runs/<id>/wandb/`` (``wandb
sync`` uploads it later; compute nodes rarely reach the internet). A resumed run starts its
event file with ``purge_step`` at the checkpoint's step, so TensorBoard drops the steps the
log trimmed and every step shows once, as in the log.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

SINKS = ("tensorboard", "wandb")
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


class WandbSink:
    def __init__(self, run_dir: Path, start_step: int, run_id: str, config: dict):
        import wandb

        self.run = wandb.init(mode="offline", dir=str(Path(run_dir)), name=run_id, id=run_id, resume="allow",
                              config=config)

    def write(self, row: dict) -> None:
        self.run.log(scalars(row), step=int(row["step"]))

    def close(self) -> None:
        self.run.finish()


class LiveCurves:
    """The sinks a run asked for, fed one logged row at a time; a sink that cannot start or
    write is dropped with a warning (the train log is the record, not this)."""

    def __init__(self, names: tuple[str, ...], run_dir: Path, run_id: str = "", config: dict | None = None):
        self.names, self.run_dir, self.run_id, self.config = names, Path(run_dir), run_id, config or {}
        self.sinks: list = []

    def start(self, step: int) -> None:
        for name in self.names:
            try:
                sink = TensorBoardSink(self.run_dir, step) if name == "tensorboard" else \
                    WandbSink(self.run_dir, step, self.run_id, self.config)
            except ImportError as e:
                _warn(f"live_curves: {name} is not installed ({e}); `pip install {name}` to see this run's curves "
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
