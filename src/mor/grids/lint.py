"""The grid lint: a value a grid writes that cannot take effect, or a key no run config has,
refused at load time with the file and line of each place involved (the 7 rules below).

A run's config is merged from up to six places (``mor.grids`` says the order); ``check_keys``
names a key no run config field has where it is written, ``locate`` puts a value error of one
run at the line that set it, ``validate_defaults`` checks every default against a run, and
``check_overrides`` refuses a value another layer silently replaces. Lines come from
``mor.yaml_io.key_line`` (one index of a YAML file's keys); ``checked_file`` refuses a key
written twice in one mapping (rule 6), which YAML itself would drop silently.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from mor.budget import resolve_budget
from mor.config import ConfigError, RunConfig, run_config_from_dict
from mor.grids.spec import GridError, at, base_file, read_grid_file, set_dotted
from mor.yaml_io import compose, display_path, where


# --- Values that cannot take effect --------------------------------------------------------
# A run's config is merged from up to six places (see the module docstring); a value set in a
# lower place and set again, differently, in one that wins is silently dead for that run.
# Where overriding is the point it stays (a block changing a default, a grid's mode over its
# shared base file, a block's ``mode_set`` over its ``set``, a block over the base file); these
# are refused, at load time (so ``snakemake -n`` and ``mor runs`` stop), each naming both lines:
#   1. a ``defaults`` value the mode's set (its base file or ``modes.<mode>.set``) or a mode
#      axis changes: no run of that mode ever gets it;
#   2. a ``defaults`` value every block changes (``set`` or ``axes``): no run gets it;
#   3. a block's ``set`` / ``mode_set`` value that is also an axis of the block or the mode;
#   4. a block's ``set`` value that the grid's ``modes.<mode>.set`` gives another value (the
#      block would win; a block's own value in one mode is what ``mode_set.<mode>`` says). A
#      block may override the shared base file's values (grids/real_weights.yaml's step-0 lr):
#      that is what a base is for;
#   5. ``train.tokens`` set by the grid file for a run whose ``train.budget_flops`` derives it;
#   6. one key given twice in one file: a YAML key repeated in one mapping (YAML keeps the
#      last), or one field spelled both dotted and nested in one mapping (``train.lr`` and
#      ``train: {lr: ...}``), or a dotted key holding a mapping (``model.router: {...}``,
#      which replaces the whole mapping) below which the same place sets a key;
#   7. a block's ``mode_set`` or ``only_modes`` naming a mode the grid does not define.

_REPLACED = object()  # a flat entry: everything below this key is replaced (a dotted key with a mapping)


def _flat(mapping: dict, prefix: str = "") -> dict[str, Any]:
    """dotted leaf key -> value, as ``merge`` applies it: a nested mapping is merged key by key;
    a dotted key holding a mapping replaces what was below it (an entry ``_REPLACED``)."""
    out: dict[str, Any] = {}
    for k, v in mapping.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            if "." in str(k):
                out[key] = _REPLACED
            out.update(_flat(v, key + "."))
        else:
            out[key] = v
    return out


def _wins_over(key: str, value: Any, higher: dict[str, Any]) -> tuple[str, Any] | None:
    """(key, value) of ``higher`` that replaces ``key``'s ``value`` with a different one, or None."""
    if key in higher:
        return (key, higher[key]) if higher[key] is not _REPLACED and higher[key] != value else None
    parts = key.split(".")
    for i in range(len(parts) - 1, 0, -1):
        p = ".".join(parts[:i])
        if p in higher:  # a mapping replaced whole, or a value where a mapping was
            return (p, higher[p] if higher[p] is not _REPLACED else "a mapping without it")
    below = [k for k in higher if k.startswith(key + ".")]
    if below:  # a mapping where a value was
        return below[0], higher[below[0]]
    return None


def _show(v: Any) -> str:
    return "a mapping without it" if v is _REPLACED else repr(v) if isinstance(v, str) and not v else str(v)


_CHECKED: dict[str, tuple[int, int]] = {}  # resolved path -> (mtime_ns, size) of the version checked


def checked_file(path: Path) -> Path:
    """``path``, once a key repeated in one of its mappings, or one field spelled twice in a
    settings mapping, is refused: a GridError naming both lines (YAML itself keeps the last
    silently). Checked once per file version."""
    key = str(Path(path).resolve())
    st = Path(key).stat()
    if _CHECKED.get(key) != (st.st_mtime_ns, st.st_size):
        _repeated_keys(path, compose(path))  # None when it cannot be composed: its reader has said where
        _CHECKED[key] = (st.st_mtime_ns, st.st_size)
    return path


def _repeated_keys(path: Path, node, trail: str = "") -> None:
    """A key repeated in one mapping, or one field spelled twice there (dotted and nested)."""
    if isinstance(node, yaml.SequenceNode):
        for i, child in enumerate(node.value):
            _repeated_keys(path, child, f"{trail}[{i}]")
        return
    if not isinstance(node, yaml.MappingNode):
        return
    keys: dict[str, int] = {}  # key as written -> its line
    fields: dict[str, tuple[int, bool]] = {}  # dotted field -> (line, replaces the mapping below it)
    for kn, vn in node.value:
        line = kn.start_mark.line + 1
        if kn.value in keys:
            _twice(path, trail, kn.value, line, keys[kn.value])
        keys[kn.value] = line
        own = _fields(kn.value, line, vn)
        for field, fline, whole in own:
            for f, (first, w) in fields.items():
                if f == field or (w and field.startswith(f + ".")) or (whole and f.startswith(field + ".")):
                    _twice(path, trail, field, fline, first)
        fields.update({f: (ln, w) for f, ln, w in own})
    for kn, vn in node.value:
        _repeated_keys(path, vn, f"{trail}.{kn.value}" if trail else kn.value)


def _twice(path: Path, trail: str, key: str, line: int, first: int) -> None:
    raise GridError(f"{where(path, line)}: key {trail + '.' if trail else ''}{key} is set twice in one mapping "
                    f"(also at line {first}); only one of them would take effect, silently: keep one")


def _fields(key: str, line: int, node) -> list[tuple[str, int, bool]]:
    """The dotted fields one entry of a mapping sets: itself, and what a mapping value holds."""
    mapping = isinstance(node, yaml.MappingNode)
    out = [(key, line, mapping and "." in key)]
    if mapping:
        for kn, vn in node.value:
            out += _fields(f"{key}.{kn.value}", kn.start_mark.line + 1, vn)
    return out


# --- Keys named where they are written -----------------------------------------------------
# A key no run config field has (`model.tyng`, `train.lrr`) is reported at its own line, in the
# layer that wrote it, before any run is expanded; a value a run's config refuses is reported at
# the line of the key that set it for that run (its axis, its block, the mode, the defaults).
def _written_layers(path: Path, raw: dict, mode: str, block: int | None = None) -> list[_Layer]:
    """The places that write run config keys, highest priority first: every block's axes,
    mode_set (each mode) and set, the mode's axes and set, its base file's set, the defaults.
    ``block``: that block's layers only (and the grid-wide ones), for one run's value error."""
    checked_file(path)
    layers = []
    for b, blk in enumerate(raw["runs"]):
        if block is not None and b != block:
            continue
        name = blk.get("name", f"block{b}")
        layers.append(_Layer(f"runs[{b}] ({name}) axes", dict(blk.get("axes") or {}), path, ("runs", b, "axes")))
        for m, values in (blk.get("mode_set") or {}).items():
            if block is None or m == mode:
                layers.append(_Layer(f"runs[{b}] ({name}) mode_set.{m}", _flat(values or {}), path,
                                     ("runs", b, "mode_set", m)))
        layers.append(_Layer(f"runs[{b}] ({name}) set", _flat(blk.get("set") or {}), path, ("runs", b, "set")))
    for m, spec in raw["modes"].items():
        if m != mode and block is not None or not isinstance(spec, dict):
            continue
        layers.append(_Layer(f"modes.{m}.axes", dict(spec.get("axes") or {}), path, ("modes", m, "axes")))
        layers.append(_Layer(f"modes.{m}.set", _flat(spec.get("set") or {}), path, ("modes", m, "set")))
        found = base_file(path, spec, m)
        if found is not None:
            layers.append(_Layer(f"the mode's base ({display_path(found)}) set",
                                 _flat(read_grid_file(found).get("set") or {}), checked_file(found), ("set",)))
    layers.append(_Layer("defaults", _flat(raw.get("defaults") or {}), path, ("defaults",)))
    return layers


def _field_error(dotted: str) -> str | None:
    """Why ``dotted`` names no field of a run's config (RunConfig and its sections), or None."""
    import difflib
    import typing

    from mor.config import RETIRED_FIELDS

    cls, parts = RunConfig, dotted.split(".")
    for i, part in enumerate(parts):
        if not dataclasses.is_dataclass(cls):
            return None  # below a field holding a mapping or a value (eval.lm_eval_limits.<task>)
        names = [f.name for f in dataclasses.fields(cls)]
        if part not in names:
            if i == 1 and (parts[0], part) in RETIRED_FIELDS:
                return None  # refused with its own message when the run is built
            owner = ".".join(parts[:i]) or "a run's config"
            near = difflib.get_close_matches(part, names, n=1)
            return (f"{owner} has no field {part!r}" + (f" (did you mean {'.'.join([*parts[:i], near[0]])}?)" if near else "")
                    + f"; its fields are {sorted(names)}")
        cls = typing.get_type_hints(cls)[part]
    return None


def check_keys(path: Path, raw: dict, mode: str) -> None:
    """Every key a grid writes for its runs names a run config field; else a GridError at the
    key's own line, naming the key as written and the layer it is in."""
    for layer in _written_layers(path, raw, mode):
        for key in layer.values:
            why = _field_error(str(key))
            if why:
                raise GridError(f"{layer.at(key)}: key {key} ({layer.name}): {why}")


_CONFIG_KEY = re.compile(r"\b((?:model|train|data|eval)(?:\.\w+)+)=")  # model.tying='x' in a ConfigError
_CONFIG_SECTION = re.compile(r"\brun\.((?:model|train|data|eval)(?:\.\w+)*): unknown key\(s\) \['(\w+)'")
_CONFIG_FIELD = re.compile(r"\brun\.((?:model|train|data|eval)(?:\.\w+)+):")  # run.model.num_recursions: expected ...


def locate(message: str, path: Path, raw: dict, mode: str, block: int, where: str) -> str:
    """``message`` (about one run, prefixed ``where``) prefixed with the file and line of the key
    whose value it refuses, as that run took it (its axis, its block, its mode, the defaults)."""
    key = None
    if ": key label:" in message:
        return message.replace(f"{path}: ", f"{at(path, ['runs', block, 'label'])}: ", 1)
    m = _CONFIG_SECTION.search(message)
    if m:
        key = f"{m.group(1)}.{m.group(2)}"
    else:
        rest = message.removeprefix(where)
        m = (_CONFIG_FIELD.search(rest) or _CONFIG_KEY.search(rest) or re.search(r": key ((?:\w+\.)+\w+)", rest)
             or re.search(r"\brun\.\w+: ((?:model|train|data|eval)(?:\.\w+)+)", rest))  # the first key a rule names
        key = m.group(1) if m else None
    if key is None:
        return message
    for layer in _written_layers(path, raw, mode, block):
        written = next((k for k in layer.values if k == key or key.startswith(f"{k}.")), None)
        if written is not None:
            return f"{layer.at(written)}: key {written} ({layer.name}): " + message.removeprefix(f"{path}: ")
    return message


def validate_defaults(path: Path, raw: dict, runs: list[Run]) -> None:
    """Check each ``defaults`` value as a block's ``set`` is checked, whether or not a run keeps
    it: on top of a run of the grid (the first where it fits the run's other fields: a default
    num_recursions does not fit a vanilla block's run). ``model.scale`` is checked with the runs."""
    values = {k: v for k, v in _flat(raw.get("defaults") or {}).items() if v is not _REPLACED and k != "model.scale"}
    for key, value in values.items():
        first = None
        for run in runs:
            cfg = dataclasses.asdict(run.config)
            try:
                set_dotted(cfg, key, value)
                resolve_budget(run_config_from_dict(cfg, where="defaults"))
                break
            except (ConfigError, GridError) as e:
                first = first or e
        else:
            if first is not None:
                raise GridError(f"{at(path, ['defaults'], key)}: {first}") from None


@dataclass(frozen=True)
class _Layer:
    """One place a run's values come from: what it sets (dotted leaves) and where it says so."""
    name: str  # as an error names it: "defaults", "modes.local.set", "runs[2] (mor) set", ...
    values: dict
    path: Path  # the file it is written in
    container: tuple

    def at(self, key: str) -> str:
        return at(self.path, list(self.container), key)


def check_overrides(path: Path, raw: dict, mode: str) -> None:
    """Refuse a grid value that cannot take effect in ``mode`` (the list above), naming both places."""
    checked_file(path)
    spec = raw["modes"][mode]
    defaults = _Layer("defaults", _flat(raw.get("defaults") or {}), path, ("defaults",))
    found = base_file(path, spec, mode)
    mode_layers = []
    if found is not None:
        base_raw = read_grid_file(found)
        mode_layers.append(_Layer(f"the mode's base ({display_path(found)}) set",
                                  _flat(base_raw.get("set") or {}), checked_file(found), ("set",)))
    mode_layers.append(_Layer(f"modes.{mode}.set", _flat(spec.get("set") or {}), path, ("modes", mode, "set")))
    mode_axes = _Layer(f"modes.{mode}.axes", dict(spec.get("axes") or {}), path, ("modes", mode, "axes"))

    def clash(low: _Layer, key: str, high: _Layer, how: str) -> None:
        hkey, hval = _wins_over(key, low.values[key], high.values)
        raise GridError(f"{low.at(key)}: {low.name} {key}={_show(low.values[key])} {how}: {high.name} "
                        f"{hkey}={_show(hval)} ({high.at(hkey)}) overrides it; remove one of the two")

    for key in [k for k, v in defaults.values.items() if v is not _REPLACED]:  # 1. defaults under the mode's values
        for high in (mode_axes, *reversed(mode_layers)):
            if _wins_over(key, defaults.values[key], high.values):
                clash(defaults, key, high, f"never takes effect in mode {mode!r}")
    blocks = []
    for b, block in enumerate(raw["runs"]):
        name = block.get("name", f"block{b}")
        blocks.append((b, name, block,
                       _Layer(f"runs[{b}] ({name}) set", _flat(block.get("set") or {}), path, ("runs", b, "set")),
                       _Layer(f"runs[{b}] ({name}) axes", dict(block.get("axes") or {}), path, ("runs", b, "axes")),
                       _Layer(f"runs[{b}] ({name}) mode_set.{mode}", _flat((block.get("mode_set") or {}).get(mode) or {}),
                              path, ("runs", b, "mode_set", mode))))
    for key in [k for k, v in defaults.values.items() if v is not _REPLACED]:  # 2. defaults every block changes
        changed = [next(lay for lay in (a, s) if _wins_over(key, defaults.values[key], lay.values))
                   for _, _, _, s, a, _ in blocks if _wins_over(key, defaults.values[key], {**s.values, **a.values})]
        if blocks and len(changed) == len(blocks):
            clash(defaults, key, changed[0], f"never takes effect: all {len(blocks)} blocks change it; the first,")
    for b, name, block, bset, baxes, bmode in blocks:  # 7. settings for a mode the grid does not have
        for m in [*(block.get("mode_set") or {}), *(block.get("only_modes") or [])]:
            if m not in raw["modes"]:
                key = "mode_set" if m in (block.get("mode_set") or {}) else "only_modes"
                raise GridError(f"{at(path, ['runs', b, key], m if key == 'mode_set' else '')}: runs[{b}] ({name}) "
                                f"{key} names mode {m!r}, which the grid does not define (modes: "
                                f"{sorted(raw['modes'])}): it never takes effect; define the mode or remove it")
        if "only_modes" in block and mode not in block["only_modes"]:
            continue
        for low in (bset, bmode):  # 3. a block's set under an axis
            for key in [k for k, v in low.values.items() if v is not _REPLACED]:
                for axes in (baxes, mode_axes):
                    hit = next((k for k in axes.values if k == key or key.startswith(k + ".") or k.startswith(key + ".")),
                               None)
                    if hit is not None:
                        raise GridError(f"{low.at(key)}: {low.name} {key}={_show(low.values[key])} never takes effect: "
                                        f"{axes.name} {hit} ({axes.at(hit)}) sets it in every run of the block; "
                                        "remove one of the two")
        own_mode = mode_layers[-1]  # the grid's modes.<mode>.set (a block may override the shared base file's)
        for key in bset.values:  # 4. a block's set against the mode's set in the same file (the block would win)
            if key in bmode.values or bset.values[key] is _REPLACED:
                continue  # the block says what it wants in this mode
            for high in (own_mode,):
                if key in high.values and high.values[key] != bset.values[key]:
                    raise GridError(f"{bset.at(key)}: {bset.name} {key}={_show(bset.values[key])} and {high.name} "
                                    f"{key}={_show(high.values[key])} ({high.at(key)}) disagree, and the block's value "
                                    f"wins silently in mode {mode!r}; to give this block its own value in one mode, set "
                                    f"it under the block's mode_set.{mode}")
        # 5. train.tokens from the grid file where train.budget_flops derives it
        every = (defaults, *mode_layers, mode_axes, bset, bmode, baxes)
        budget = next((lay for lay in reversed(every) if "train.budget_flops" in lay.values), None)
        if budget is not None and budget.values["train.budget_flops"]:
            for lay in (defaults, mode_layers[-1], mode_axes, bset, bmode, baxes):
                if "train.tokens" in lay.values:
                    raise GridError(f"{lay.at('train.tokens')}: {lay.name} train.tokens never takes effect in "
                                    f"runs[{b}] ({name}): {budget.name} train.budget_flops ({budget.at('train.budget_flops')}) "
                                    "derives the tokens from the budget; remove one of the two")
