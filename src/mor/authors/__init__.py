"""The authors' released runs as data (``grids/authors/released.yaml``): numbers and the file
each came from, never their code. The FLOP convention (``mor.flops_authors``), the recipe
(``mor.recipe``) and the tests hold our grids against them."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path

import yaml

RELEASED = Path(__file__).resolve().parents[3] / "grids" / "authors" / "released.yaml"


@dataclass(frozen=True)
class ReleasedRun:
    """One released 360M pretraining config (their ``conf/pretrain/<file>``)."""

    name: str
    file: str
    variant: str
    layers: int
    num_recursions: int
    num_train_steps: int
    num_warmup_steps: int
    num_decay_steps: int
    router: str = ""  # expert / token ('' without routers)
    kv: str = "recursion_wise"
    fixed_save_steps: tuple[int, ...] = field(default_factory=tuple)


@functools.lru_cache(maxsize=1)
def load_released(path: Path = RELEASED) -> tuple[dict, tuple[ReleasedRun, ...]]:
    """(common settings, the runs) of the released-runs file; a key we do not know fails naming it."""
    raw = yaml.safe_load(Path(path).read_text())
    runs = []
    for i, r in enumerate(raw["runs"]):
        try:
            runs.append(ReleasedRun(**{**r, "fixed_save_steps": tuple(r.get("fixed_save_steps", ()))}))
        except TypeError as e:
            raise ValueError(f"{path}: runs[{i}] ({r.get('name')}): {e}") from None
    return raw["common"], tuple(runs)
