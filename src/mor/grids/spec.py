"""What a grid file is before it is expanded: where grids live, the error every grid check
raises, how a mapping of dotted or nested keys is merged (the merge order's one spelling), and
where a mode's shared base file is (``grids/modes/<base>.yaml``). Torch-free; ``mor.grids.load``
expands a grid on top of it and ``mor.grids.lint`` checks what would be dead in it.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from mor.yaml_io import key_line, read_yaml_mapping, where

REPO = Path(__file__).resolve().parents[3]
SCHEMA_FILE = REPO / "workflows" / "schemas" / "grid.schema.yaml"
GRIDS_DIR = REPO / "grids"
MODES = ("local", "cluster")
MAX_SEEDS = 1000  # a seed above this in a run id is a typo, not a run to expand the grid for


class GridError(ValueError):
    """A grid file is malformed; the message starts with the file and names the key."""


def at(path: Path, container: list, dotted: str = "") -> str:
    """``file:line`` of ``dotted`` inside the mapping at ``container`` (``mor.yaml_io.key_line``)."""
    return where(path, key_line(path, container, dotted))


def set_dotted(target: dict, dotted: str, value: Any) -> None:
    """target['a']['b'] = value for dotted 'a.b', creating mappings on the way."""
    keys = dotted.split(".")
    node = target
    for k in keys[:-1]:
        child = node.setdefault(k, {})
        if not isinstance(child, dict):
            raise GridError(f"key {dotted!r}: {k!r} already holds a value, not a mapping")
        node = child
    node[keys[-1]] = copy.deepcopy(value)


def merge(target: dict, updates: dict) -> None:
    """Apply a mapping whose keys may be dotted or nested."""
    for k, v in updates.items():
        if isinstance(v, dict) and "." not in k and isinstance(target.get(k), dict):
            merge(target[k], v)
        elif isinstance(v, dict) and "." not in k:
            target[k] = {}
            merge(target[k], v)
        else:
            set_dotted(target, k, v)


def read_grid_file(path: Path) -> dict:
    """A grid (or mode base) file's top-level mapping, through the one cached YAML reader."""
    return read_yaml_mapping(path, GridError, "grid file")


def base_file(path: Path, spec: dict, mode: str) -> Path | None:
    """The shared base file a mode names (``base: paper-10B``): beside the grid under
    ``modes/``, else ``grids/modes/``; None when the mode names none."""
    if "base" not in spec:
        return None
    found = path.parent / "modes" / f"{spec['base']}.yaml"
    if not found.exists():
        found = GRIDS_DIR / "modes" / f"{spec['base']}.yaml"
    if not found.exists():
        raise GridError(f"{at(path, ['modes', mode, 'base'])}: key modes.{mode}.base: no file "
                        f"grids/modes/{spec['base']}.yaml")
    return found


def grid_path(name: str) -> Path:
    return GRIDS_DIR / f"{name}.yaml"


def all_grids(directory: Path = GRIDS_DIR) -> list[Path]:
    """Every grid file of a folder (scales.yaml holds model sizes, not runs)."""
    return sorted(p for p in Path(directory).glob("*.yaml") if p.name != "scales.yaml")
