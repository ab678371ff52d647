"""The one YAML reader of the suite: grids, modes, scales, schemas, presets and site profiles.

Why one reader, and why cached: planning expands grids of thousands of runs, and every run
asks for its model's shape, the schema, its mode's base. Before this module each of those
asks parsed its file again (``yaml.safe_load`` 881 times for one ``mor.launch plan``, 98 %
of its time). Here a file is parsed once per process and handed out as a fresh deep copy,
so a caller that edits what it got never changes what the next caller gets. A file edited
while the process lives (a test rewriting a grid) is parsed again: the cache key holds its
modification time and size.

Why errors name the line: a broken file must say where it is broken,
``grids/scales.yaml, line 27: not valid YAML: mapping values are not allowed here``, not
print a bare ParserError from deep inside Snakemake's parse.

Torch-free and dependency-light: the Snakefile, the grid expander and the launcher import it.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
# libyaml's parser when PyYAML was built with it (about 10x faster); same documents, same errors
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

_CACHE: dict[str, tuple[int, int, Any]] = {}  # resolved path -> (mtime_ns, size, parsed document)


class YamlError(ValueError):
    """A YAML file is missing or not valid YAML; the message starts with the file (and line)."""


def display_path(path: str | Path) -> str:
    """``grids/scales.yaml`` for a file of this checkout, the path as given elsewhere."""
    p = Path(path)
    try:
        return str(p.resolve().relative_to(REPO))
    except ValueError:
        return str(path)


def where(path: str | Path, line: int | None = None) -> str:
    """The prefix of an error about ``path``: ``grids/x.yaml`` or ``grids/x.yaml, line 12``."""
    return f"{display_path(path)}, line {line}" if line else display_path(path)


def _parse(path: Path, text: str) -> Any:
    """Parse one document (the only call of the YAML parser; tests count its calls)."""
    return yaml.load(text, Loader=_LOADER)  # noqa: S506 - a safe loader (CSafeLoader or SafeLoader)


def _error_line(e: yaml.YAMLError) -> int | None:
    mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
    return mark.line + 1 if mark is not None else None


def _problem(e: yaml.YAMLError) -> str:
    if isinstance(e, yaml.MarkedYAMLError):
        parts = [p for p in (e.context, e.problem) if p]
        if parts:
            return "; ".join(parts)
    return str(e).splitlines()[0] if str(e) else type(e).__name__


def load_yaml(path: str | Path) -> Any:
    """The parsed document of ``path`` (a deep copy: the caller may change it).

    Parsed once per process (re-parsed if the file changed). Raises ``YamlError`` naming the
    file, and the line for a syntax error; FileNotFoundError for a missing file, so callers
    can add their own hint."""
    p = Path(path)
    key = os.path.abspath(p)
    try:
        st = os.stat(key)
    except FileNotFoundError:
        raise FileNotFoundError(f"{display_path(p)}: no such file") from None
    hit = _CACHE.get(key)
    if hit is None or hit[0] != st.st_mtime_ns or hit[1] != st.st_size:
        text = Path(key).read_text()
        try:
            doc = _parse(p, text)
        except yaml.YAMLError as e:
            raise YamlError(f"{where(p, _error_line(e))}: not valid YAML: {_problem(e)}") from None
        hit = (st.st_mtime_ns, st.st_size, doc)
        _CACHE[key] = hit
    return copy.deepcopy(hit[2])


_DERIVED: dict[tuple[str, str], tuple[int, int, Any]] = {}  # (path, builder) -> (mtime_ns, size, built)


def load_derived(path: str | Path, build) -> Any:
    """``build(load_yaml(path))``, built once while the file is unchanged and shared (not
    copied): for what is made from a file and asked for per run (the scales' shapes, a
    schema's validator). ``build`` must return something its callers do not change."""
    key = (os.path.abspath(path), f"{build.__module__}.{build.__qualname__}")
    try:
        st = os.stat(key[0])
    except FileNotFoundError:
        raise FileNotFoundError(f"{display_path(path)}: no such file") from None
    hit = _DERIVED.get(key)
    if hit is None or hit[0] != st.st_mtime_ns or hit[1] != st.st_size:
        hit = (st.st_mtime_ns, st.st_size, build(load_yaml(path)))
        _DERIVED[key] = hit
    return hit[2]


def clear_cache() -> None:
    """Forget every parsed file and what was built from it (tests that count parses start here)."""
    _CACHE.clear()
    _DERIVED.clear()
    _NODES.clear()


_NODES: dict[str, tuple[int, int, Any]] = {}  # resolved path -> (mtime_ns, size, composed node tree)


def compose(path: str | Path) -> Any:
    """``path``'s YAML node tree (keys with their lines), composed once while the file is
    unchanged and shared (not copied); None when the file cannot be read or composed."""
    key = os.path.abspath(path)
    try:
        st = os.stat(key)
    except OSError:
        return None
    hit = _NODES.get(key)
    if hit is None or hit[0] != st.st_mtime_ns or hit[1] != st.st_size:
        try:
            node = yaml.compose(Path(key).read_text(), Loader=_LOADER)
        except (OSError, yaml.YAMLError):
            node = None
        hit = (st.st_mtime_ns, st.st_size, node)
        _NODES[key] = hit
    return hit[2]


def _dotted_line(node, dotted: str) -> int | None:
    """The line of key ``dotted`` inside mapping ``node``, spelled dotted, nested or mixed
    (``train.lr``, ``train: {lr: ..}``); None when it is not there."""
    if not isinstance(node, yaml.MappingNode):
        return None
    for kn, vn in node.value:
        if kn.value == dotted:
            return kn.start_mark.line + 1
        if dotted.startswith(kn.value + "."):
            hit = _dotted_line(vn, dotted[len(kn.value) + 1:])
            if hit:
                return hit
    return None


def key_line(path: str | Path, keys: list, dotted: str = "") -> int | None:
    """The line (1-based) of the node at ``keys`` (mapping keys and list indices) in ``path``,
    or of the deepest part of it that exists; None when the file cannot be composed. For
    errors found after parsing (a schema violation, a bad value) to name the line too.
    ``dotted``: a key inside the mapping at ``keys``, spelled dotted, nested or mixed (a grid's
    ``set: {train.lr: ..}``); its line, else that of ``keys``."""
    node = compose(path)
    line = node.start_mark.line + 1 if node is not None else None
    for k in keys:
        if isinstance(node, yaml.MappingNode):
            nxt = next(((kn, vn) for kn, vn in node.value if kn.value == str(k)), None)
            if nxt is None:
                return line
            line, node = nxt[0].start_mark.line + 1, nxt[1]
        elif isinstance(node, yaml.SequenceNode) and isinstance(k, int) and 0 <= k < len(node.value):
            node = node.value[k]
            line = node.start_mark.line + 1
        else:
            return line
    return (_dotted_line(node, dotted) or line) if dotted else line


def read_yaml_mapping(path: Path, error: type[Exception], what: str, missing_hint: str = "") -> dict:
    """Parse a YAML file whose top level must be a mapping; errors start with the file (and
    the line of a syntax error). Through the one cached reader (mor.yaml_io): read once per
    process, the caller gets its own copy."""
    try:
        raw = load_yaml(path)
    except FileNotFoundError:
        raise error(f"{path}: {what} not found{missing_hint}") from None
    except YamlError as e:
        raise error(str(e)) from None
    if raw is None:
        raise error(f"{path}: the {what} is empty; it must be a mapping at the top level")
    if not isinstance(raw, dict):
        raise error(f"{path}: a {what} must be a mapping at the top level")
    return raw
