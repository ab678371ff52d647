"""Grid YAML -> validated list of runs, each with a stable id from its resolved config.

A grid is data: a new ablation is a new block under ``runs:`` or a new file. Structure is
checked against ``workflows/schemas/grid.schema.yaml``; every value is then checked by the
config dataclasses. Either failure raises ``GridError`` naming the file and the key, so a
bad grid stops ``snakemake`` at parse time, before any job starts.

Merge order for one run: ``defaults`` -> ``modes.<mode>.set`` (on top of its ``base``) ->
block ``set`` -> block ``mode_set.<mode>`` -> block ``axes`` values. A value that this order
would drop without effect (a default the mode sets again, a block value that is also an axis,
...) is refused, naming both lines (``_check_overrides``). A block with
``only_modes`` exists only in those modes; ``modes.<mode>.axes`` are axes every block gets
in that mode (table9's budgets differ between the CPU and the cluster mode);
``modes.<mode>.seeds: n`` repeats every run with train.seed = seed, seed+1, ..., seed+n-1
(data order and initialisation), each its own run (ids of seed > 0 carry ``-s<seed>``);
``load_grid(..., seeds={block: n})`` gives single blocks more (or fewer) seeds, which is how
the claims' adaptive design (``mor.claims.seeding``) adds seeds to the blocks that decide a
claim and to no other; ``seeds={block: [0, 1, 2, 9, 10]}`` names the seed offsets themselves
(the design skips the seeds of a pilot it was sized on). A seed past the mode's own is scored
without lm-eval (``_added_seed``: no table draws it, no claim reads an accuracy). Seed k of a block is the same run whichever way it is asked for (its
id hashes its config), so ``Grid.run`` also finds a seed the grid file does not list.
``model.scale`` always names a paper scale (135M, 360M, ...); the mode's ``scale_map`` turns
it into the scale actually built (CPU scales in the local mode).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import itertools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from mor.branching import BranchError, branch_budgets
from mor.budget import resolve_budget
from mor.checkpoint_identity import resolve_import
from mor.layout import RunPaths
from mor.config import ConfigError, RunConfig, load_scales, run_config_from_dict
from mor.yaml_io import YamlError, display_path, key_line, load_derived, read_yaml_mapping, where

REPO = Path(__file__).resolve().parents[2]
SCHEMA_FILE = REPO / "workflows" / "schemas" / "grid.schema.yaml"
GRIDS_DIR = REPO / "grids"
MODES = ("local", "cluster")
MAX_SEEDS = 1000  # a seed above this in a run id is a typo, not a run to expand the grid for


class GridError(ValueError):
    """A grid file is malformed; the message starts with the file and names the key."""


@dataclass(frozen=True)
class Run:
    config: RunConfig
    block: str  # name of the block that produced it
    tags: tuple[str, ...]

    @property
    def run_id(self) -> str:
        return self.config.run_id


@dataclass(frozen=True)
class Grid:
    name: str
    path: Path
    mode: str
    runs: tuple[Run, ...]
    artifacts: tuple[str, ...]
    reference: tuple[dict, ...]
    raw: dict
    others: tuple[str, ...] = ()  # a selection of a grid's runs (mor status <run>): the ids left out

    def run(self, run_id: str) -> Run:
        """The run with this id: one the grid lists, or a further seed of one of its blocks
        (``...-s<seed>-<hash>``, e.g. a seed the claims' adaptive design added). A lookup
        costs a dict access (Snakemake asks once per input function per job), and the grid
        with more seeds is expanded once per seed count, not once per lookup."""
        hit = self._by_id.get(run_id)
        if hit is not None:
            return hit
        m = re.search(r"-s(\d+)-[0-9a-f]{8}$", run_id)
        if m and int(m.group(1)) <= MAX_SEEDS:
            hit = self._with_seeds(int(m.group(1)) + 1)._by_id.get(run_id)
            if hit is not None:
                return hit
        near = [i for i in self._by_id if i.startswith(run_id)]
        hint = f"; ids starting so: {near[:8]}{' ...' if len(near) > 8 else ''}" if near else ""
        raise GridError(f"{self.path}: no run with id {run_id!r} in mode {self.mode!r}{hint}")

    def find(self, run_id: str) -> Run:
        """The run with this id or with the one id of the grid that starts with it (what ``mor
        status`` shows, ``135M-recursive-cycle-nr2``); an ambiguous prefix names the candidates.
        For commands a person types; the workflow asks ``run`` for exact ids (a prefix there
        would name a second folder for one run)."""
        near = [i for i in self._by_id if i.startswith(run_id)]
        if run_id in self._by_id or len(near) != 1:
            if len(near) > 1 and run_id not in self._by_id:
                raise GridError(f"{self.path}: run id prefix {run_id!r} is ambiguous in mode {self.mode!r}: "
                                f"{len(near)} runs start with it: {', '.join(near[:8])}{' ...' if len(near) > 8 else ''}")
            return self.run(run_id)
        return self._by_id[near[0]]

    @functools.cached_property
    def _by_id(self) -> dict[str, Run]:
        return {r.run_id: r for r in self.runs}

    def _with_seeds(self, n: int) -> "Grid":
        """This grid with every block at ``n`` seeds (expanded once per n, then kept)."""
        more = self.__dict__.setdefault("_more_seeds", {})  # frozen: the cache lives beside the fields
        if n not in more:
            more[n] = load_grid(self.path, self.mode, seeds={b: n for b in self.blocks})
        return more[n]

    @property
    def blocks(self) -> tuple[str, ...]:
        """The names of the blocks that have runs in this mode, in file order."""
        return tuple(dict.fromkeys(r.block for r in self.runs))

    def seeds(self) -> dict[str, int]:
        """block -> how many seeds of it the grid holds (its distinct train.seed values)."""
        out: dict[str, set[int]] = {}
        for r in self.runs:
            out.setdefault(r.block, set()).add(r.config.train.seed)
        return {b: len(v) for b, v in out.items()}

    def select(self, tags: list[str] | None) -> list[Run]:
        """Runs carrying any of ``tags`` (all runs when tags is empty)."""
        if not tags:
            return list(self.runs)
        return [r for r in self.runs if set(r.tags) & set(tags)]


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


def _load_yaml(path: Path) -> dict:
    return read_yaml_mapping(path, GridError, "grid file")


def _schema_validator(schema: dict) -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(schema)


def _validate_structure(path: Path, raw: dict) -> None:
    try:
        validator = load_derived(SCHEMA_FILE, _schema_validator)  # parsed and built once per process
    except YamlError as e:
        raise GridError(str(e)) from None
    errors = sorted(validator.iter_errors(raw), key=lambda e: list(e.absolute_path))
    if errors:
        e = errors[0]
        keys = ".".join(str(p) for p in e.absolute_path) or "<top level>"
        hint = ""
        if e.validator == "additionalProperties" and "properties" in e.schema:
            hint = f"; allowed keys are {sorted(e.schema['properties'])}"
        elif e.validator == "enum":
            hint = f"; allowed values are {e.validator_value}"
        at = list(e.absolute_path)
        if e.validator == "additionalProperties" and isinstance(e.instance, dict) and "properties" in e.schema:
            at += sorted(str(k) for k in e.instance if k not in e.schema["properties"])[:1]  # the unknown key's line
        line = key_line(path, at)
        raise GridError(f"{path}: key {keys}: {e.message}{hint}" + (f" ({where(path, line)})" if line else ""))


def load_grid(path: str | Path, mode: str = "local", seeds: dict[str, int | list[int]] | None = None) -> Grid:
    """Parse, validate and expand a grid for ``mode`` ('local' or 'cluster').

    ``seeds``: block name -> seeds of that block, in place of ``modes.<mode>.seeds`` (blocks
    not named keep the mode's count): a count n (offsets 0..n-1 from the block's train.seed)
    or a list of distinct offsets; a name that is no block of the grid is an error."""
    path = Path(path)
    if mode not in MODES:
        raise GridError(f"mode {mode!r} is not one of {list(MODES)}")
    raw = _load_yaml(path)
    _validate_structure(path, raw)
    if raw["name"] != path.stem:
        raise GridError(f"{_lines(path).at(['name'])}: key name: {raw['name']!r} must equal the file name {path.stem!r}")
    if mode not in raw["modes"]:
        raise GridError(f"{_lines(path).at(['modes'])}: key modes: no {mode!r} mode; grid defines {sorted(raw['modes'])}")
    _lines(path)  # a key given twice in one mapping (YAML would keep one silently)
    _check_keys(path, raw, mode)  # a key no run config field has, named where it is written
    mode_spec = _mode_spec(path, raw["modes"][mode], mode)
    scales = load_scales()
    scale_map = {str(k): str(v) for k, v in mode_spec.get("scale_map", {}).items()}
    for paper, actual in scale_map.items():
        if actual not in scales:
            raise GridError(f"{_lines(path).at(['modes', mode, 'scale_map'], paper)}: key modes.{mode}.scale_map.{paper}: "
                            f"unknown scale {actual!r}; known {sorted(scales)}")

    names = [block.get("name", f"block{b}") for b, block in enumerate(raw["runs"])]
    for name, n in (seeds or {}).items():
        if name not in names:
            raise GridError(f"{path}: seeds for block {name!r}, which the grid does not have; its blocks are {names}")
        if isinstance(n, (list, tuple)):
            if not n or len(set(n)) != len(n) or not all(
                    isinstance(k, int) and not isinstance(k, bool) and 0 <= k < MAX_SEEDS for k in n):
                raise GridError(f"{path}: seeds for block {name!r}: expected distinct integer offsets in "
                                f"0..{MAX_SEEDS - 1}, got {n!r}")
        elif isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_SEEDS:
            raise GridError(f"{path}: seeds for block {name!r}: expected an integer in 1..{MAX_SEEDS}, got {n!r}")
    runs: dict[str, Run] = {}
    origin: dict[str, str] = {}  # run id -> where it came from, to name both sides of a clash
    block_names: dict[str, int] = {}
    for b, block in enumerate(raw["runs"]):
        name = block.get("name", f"block{b}")
        if name in block_names:
            raise GridError(f"{_lines(path).at(['runs', b, 'name'])}: runs[{b}]: block name {name!r} is already used by runs[{block_names[name]}]; "
                            "block names must be unique (model.init_checkpoint '@<block>' refers to them)")
        block_names[name] = b
        if "only_modes" in block and mode not in block["only_modes"]:
            continue
        axes = dict(block.get("axes", {}))
        for key, values in mode_spec.get("axes", {}).items():  # the mode's axes apply to every block
            if key in axes:
                raise GridError(f"{_lines(path).at(['runs', b, 'axes'], key)}: runs[{b}] ({name}): key axes.{key} is also an "
                                f"axis of modes.{mode} ({_lines(path).at(['modes', mode, 'axes'], key)}); "
                                "name it in one place")
            axes[key] = values
        keys = list(axes)
        for values in itertools.product(*(axes[k] for k in keys)):
            cfg: dict = {}
            merge(cfg, raw.get("defaults", {}))
            merge(cfg, mode_spec.get("set", {}))
            merge(cfg, block.get("set", {}))
            merge(cfg, block.get("mode_set", {}).get(mode, {}))
            for k, v in zip(keys, values):
                set_dotted(cfg, k, v)
            where = f"{path}: runs[{b}] ({name}) with " + ", ".join(f"{k}={v}" for k, v in zip(keys, values))
            try:
                run = _resolve(cfg, raw["name"], scale_map, scales, where, block.get("label", ""), values, keys)
            except GridError as e:
                raise GridError(_located(str(e), path, raw, mode, b, where)) from None
            own = mode_spec.get("seeds", 1)
            count = (seeds or {}).get(name, own)
            for seed in sorted(count) if isinstance(count, (list, tuple)) else range(count):  # repeats: seeds base, base+1, ... (data order, init)
                rc = run.config
                if seed:
                    rc = dataclasses.replace(rc, train=dataclasses.replace(rc.train, seed=rc.train.seed + seed))
                if seed >= own:
                    rc = _added_seed(rc)
                rid = rc.run_id
                if rid in runs:
                    raise GridError(f"{_lines(path).at(['runs', b])}: {where.removeprefix(f'{path}: ')}: resolves to the same training config (run {rid}) as {origin[rid]}; "
                                    "two runs would share one run directory. Remove one, or make them differ in a "
                                    "model / train / data field (labels and eval settings are not part of a run's "
                                    "identity)")
                runs[rid] = Run(rc, name, tuple(block.get("tags", [])))
                origin[rid] = where.removeprefix(f"{path}: ")
    if runs:
        _validate_defaults(path, raw, list(runs.values()))
    _check_overrides(path, raw, mode)  # a value that cannot take effect in this mode
    expanded = list(runs.values())
    if mode_spec.get("branch_budgets"):  # one warmup-stable run per model, decay branches (mor.branching)
        try:
            expanded = branch_budgets(expanded, lambda r: r.config, lambda r, rc: Run(rc, r.block, r.tags),
                                      where=f"{path}: modes.{mode}.branch_budgets: ")
        except BranchError as e:
            raise GridError(str(e)) from None
    try:
        resolved = _resolve_run_references(path, raw["name"], expanded)
    except GridError as e:  # at the line of the block's model.init_checkpoint
        block = next((b for b, name in enumerate(names) if f"block {name!r}:" in str(e)), None)
        raise (e if block is None else GridError(_located(str(e), path, raw, mode, block, str(path)))) from None
    return Grid(
        name=raw["name"],
        path=path,
        mode=mode,
        runs=tuple(resolved),
        artifacts=tuple(raw.get("artifacts", [])),
        reference=tuple(raw.get("reference", [])),
        raw=raw,
    )


def _resolve_run_references(path: Path, grid_name: str, runs: list[Run]) -> list[Run]:
    """``model.init_checkpoint: "@<block>"`` -> the final weights of that block's run of the
    same paper scale (e.g. up-training from a model pretrained in the same grid). The
    resolved path carries the source run's id, so the dependent run's id changes with it."""
    out = []
    for run in runs:
        ref = run.config.model.init_checkpoint
        if ref.startswith("@"):
            sources = [r for r in runs if r.block == ref[1:] and r.config.paper_scale == run.config.paper_scale
                       and not r.config.model.init_checkpoint.startswith("@")]
            if len(sources) != 1:
                raise GridError(f"{path}: block {run.block!r}: key model.init_checkpoint={ref!r} must name a block with "
                                f"exactly one run at scale {run.config.paper_scale}; found {len(sources)}")
            model = dataclasses.replace(run.config.model, init_checkpoint=str(RunPaths(grid_name, sources[0].run_id).final))
            run = Run(dataclasses.replace(run.config, model=model), run.block, run.tags)
        out.append(run)
    return out


def _added_seed(rc):
    """A seed past the mode's own (one the claims' design added) is scored for what the claims
    read, validation NLL, router statistics and the analyses, and not with lm-eval: tables and
    figures draw a grid's own seeds, and no claim reads a benchmark accuracy (mor.claims.predicates),
    so its ~1,700 scored continuations a run would be CPU spent for nothing. Eval settings are
    not part of a run's identity, so the run id is the same either way."""
    if not rc.eval.lm_eval_tasks:
        return rc
    return dataclasses.replace(rc, eval=dataclasses.replace(rc.eval, lm_eval_tasks=(), lm_eval_limits={}))


def mode_settings(path: str | Path, mode: str) -> dict:
    """A grid file's ``modes.<mode>`` merged with its base file ({} when the mode is absent):
    what a report needs of a mode (seeds, evidence) without expanding the runs."""
    path = Path(path)
    spec = ((_load_yaml(path) or {}).get("modes") or {}).get(mode)
    return _mode_spec(path, spec, mode) if spec else {}


def _mode_spec(path: Path, spec: dict, mode: str) -> dict:
    """A mode's settings, on top of ``grids/modes/<base>.yaml`` when it names a base."""
    base_file = _base_file(path, spec, mode)
    if base_file is None:
        return spec
    base = _load_yaml(base_file)
    unknown = sorted(set(base) - {"set", "scale_map", "seeds"})
    if unknown:
        raise GridError(f"{where(base_file, key_line(base_file, [unknown[0]]))}: unknown key(s) {unknown}; allowed keys "
                        "are ['scale_map', 'seeds', 'set']")
    if "seeds" in base and (isinstance(base["seeds"], bool) or not isinstance(base["seeds"], int) or base["seeds"] < 1):
        raise GridError(f"{where(base_file, key_line(base_file, ['seeds']))}: key seeds: expected an integer >= 1, "
                        f"got {base['seeds']!r}")
    merged: dict = {"set": {}}
    merge(merged["set"], base.get("set", {}))
    merge(merged["set"], spec.get("set", {}))
    merged["scale_map"] = {**base.get("scale_map", {}), **spec.get("scale_map", {})}
    if "axes" in spec:
        merged["axes"] = spec["axes"]
    if "seeds" in spec or "seeds" in base:
        merged["seeds"] = spec.get("seeds", base.get("seeds"))
    if "evidence" in spec:
        merged["evidence"] = spec["evidence"]
    if "branch_budgets" in spec:
        merged["branch_budgets"] = spec["branch_budgets"]
    return merged


def _resolve(cfg, grid_name, scale_map, scales, where, label_fmt, values, keys) -> Run:
    model = cfg.setdefault("model", {})
    paper_scale = str(model.get("scale", ""))
    if not paper_scale:
        raise GridError(f"{where}: key model.scale is missing")
    if scale_map:
        if paper_scale not in scale_map:
            raise GridError(f"{where}: key model.scale={paper_scale!r} has no entry in the mode's scale_map {sorted(scale_map)}")
        model["scale"] = scale_map[paper_scale]
    elif paper_scale not in scales:
        raise GridError(f"{where}: key model.scale: unknown scale {paper_scale!r}; known {sorted(scales)}")
    cfg["grid"] = grid_name
    cfg["paper_scale"] = paper_scale
    try:
        cfg["label"] = label_fmt.format(**{k.replace(".", "_"): v for k, v in zip(keys, values)}) if label_fmt else ""
    except (KeyError, IndexError) as e:
        raise GridError(f"{where}: key label: placeholder {{{e.args[0]}}} names no axis of this block; its placeholders "
                        f"are {sorted(k.replace('.', '_') for k in keys)}") from None
    try:
        rc = resolve_budget(run_config_from_dict(cfg, where="run"))  # train.budget_flops -> train.tokens
        rc = resolve_import(rc)  # model.import_checkpoint -> its digest, in the run id (issue 62)
    except ConfigError as e:
        raise GridError(f"{where}: {e}") from None
    return Run(rc, "", ())

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


@dataclass(frozen=True)
class _Lines:
    """Line numbers of a YAML file's keys (composed once per file version), and its repeated keys."""
    path: Path
    root: Any

    def line(self, container: list, dotted: str = "") -> int | None:
        """The line of ``dotted`` (spelled dotted, nested or mixed) inside the mapping at ``container``."""
        node = self.root
        line = None
        for k in container:
            node, line = self._child(node, k, line)
            if node is None:
                return line
        if not dotted:
            return line
        return self._dotted(node, dotted) or line

    @staticmethod
    def _child(node, k, line):
        if isinstance(node, yaml.MappingNode):
            for kn, vn in node.value:
                if kn.value == str(k):
                    return vn, kn.start_mark.line + 1
        elif isinstance(node, yaml.SequenceNode) and isinstance(k, int) and 0 <= k < len(node.value):
            return node.value[k], node.value[k].start_mark.line + 1
        return None, line

    def _dotted(self, node, dotted: str) -> int | None:
        if not isinstance(node, yaml.MappingNode):
            return None
        for kn, vn in node.value:
            if kn.value == dotted:
                return kn.start_mark.line + 1
            if dotted.startswith(kn.value + "."):
                hit = self._dotted(vn, dotted[len(kn.value) + 1:])
                if hit:
                    return hit
        return None

    def at(self, container: list, dotted: str = "") -> str:
        return where(self.path, self.line(container, dotted))


_LINES: dict[str, tuple[int, int, _Lines]] = {}


def _lines(path: Path) -> _Lines:
    """``path``'s key lines; a key repeated in one mapping, or one field spelled twice in a
    settings mapping, is a GridError naming both lines (YAML itself keeps the last silently)."""
    key = str(Path(path).resolve())
    st = Path(key).stat()
    hit = _LINES.get(key)
    if hit is None or hit[:2] != (st.st_mtime_ns, st.st_size):
        try:
            root = yaml.compose(Path(key).read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
        except yaml.YAMLError:
            root = None  # the reader has already said where (it parsed the file first)
        _repeated_keys(path, root)
        hit = (st.st_mtime_ns, st.st_size, _Lines(Path(path), root))
        _LINES[key] = hit
    return hit[2]


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
    lines = _lines(path)
    layers = []
    for b, blk in enumerate(raw["runs"]):
        if block is not None and b != block:
            continue
        name = blk.get("name", f"block{b}")
        layers.append(_Layer(f"runs[{b}] ({name}) axes", dict(blk.get("axes") or {}), lines, ("runs", b, "axes")))
        for m, values in (blk.get("mode_set") or {}).items():
            if block is None or m == mode:
                layers.append(_Layer(f"runs[{b}] ({name}) mode_set.{m}", _flat(values or {}), lines,
                                     ("runs", b, "mode_set", m)))
        layers.append(_Layer(f"runs[{b}] ({name}) set", _flat(blk.get("set") or {}), lines, ("runs", b, "set")))
    for m, spec in raw["modes"].items():
        if m != mode and block is not None or not isinstance(spec, dict):
            continue
        layers.append(_Layer(f"modes.{m}.axes", dict(spec.get("axes") or {}), lines, ("modes", m, "axes")))
        layers.append(_Layer(f"modes.{m}.set", _flat(spec.get("set") or {}), lines, ("modes", m, "set")))
        base_file = _base_file(path, spec, m)
        if base_file is not None:
            layers.append(_Layer(f"the mode's base ({display_path(base_file)}) set",
                                 _flat(_load_yaml(base_file).get("set") or {}), _lines(base_file), ("set",)))
    layers.append(_Layer("defaults", _flat(raw.get("defaults") or {}), lines, ("defaults",)))
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


def _check_keys(path: Path, raw: dict, mode: str) -> None:
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


def _located(message: str, path: Path, raw: dict, mode: str, block: int, where: str) -> str:
    """``message`` (about one run, prefixed ``where``) prefixed with the file and line of the key
    whose value it refuses, as that run took it (its axis, its block, its mode, the defaults)."""
    key = None
    if ": key label:" in message:
        return message.replace(f"{path}: ", f"{_lines(path).at(['runs', block, 'label'])}: ", 1)
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


def _validate_defaults(path: Path, raw: dict, runs: list[Run]) -> None:
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
                raise GridError(f"{_lines(path).at(['defaults'], key)}: {first}") from None


def _base_file(path: Path, spec: dict, mode: str) -> Path | None:
    if "base" not in spec:
        return None
    base_file = path.parent / "modes" / f"{spec['base']}.yaml"
    if not base_file.exists():
        base_file = GRIDS_DIR / "modes" / f"{spec['base']}.yaml"
    if not base_file.exists():
        raise GridError(f"{_lines(path).at(['modes', mode, 'base'])}: key modes.{mode}.base: no file "
                        f"grids/modes/{spec['base']}.yaml")
    return base_file


@dataclass(frozen=True)
class _Layer:
    """One place a run's values come from: what it sets (dotted leaves) and where it says so."""
    name: str  # as an error names it: "defaults", "modes.local.set", "runs[2] (mor) set", ...
    values: dict
    lines: _Lines
    container: tuple

    def at(self, key: str) -> str:
        return self.lines.at(list(self.container), key)


def _check_overrides(path: Path, raw: dict, mode: str) -> None:
    """Refuse a grid value that cannot take effect in ``mode`` (the list above), naming both places."""
    lines = _lines(path)
    spec = raw["modes"][mode]
    defaults = _Layer("defaults", _flat(raw.get("defaults") or {}), lines, ("defaults",))
    base_file = _base_file(path, spec, mode)
    mode_layers = []
    if base_file is not None:
        base_raw = _load_yaml(base_file)
        mode_layers.append(_Layer(f"the mode's base ({display_path(base_file)}) set",
                                  _flat(base_raw.get("set") or {}), _lines(base_file), ("set",)))
    mode_layers.append(_Layer(f"modes.{mode}.set", _flat(spec.get("set") or {}), lines, ("modes", mode, "set")))
    mode_axes = _Layer(f"modes.{mode}.axes", dict(spec.get("axes") or {}), lines, ("modes", mode, "axes"))

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
                       _Layer(f"runs[{b}] ({name}) set", _flat(block.get("set") or {}), lines, ("runs", b, "set")),
                       _Layer(f"runs[{b}] ({name}) axes", dict(block.get("axes") or {}), lines, ("runs", b, "axes")),
                       _Layer(f"runs[{b}] ({name}) mode_set.{mode}", _flat((block.get("mode_set") or {}).get(mode) or {}),
                              lines, ("runs", b, "mode_set", mode))))
    for key in [k for k, v in defaults.values.items() if v is not _REPLACED]:  # 2. defaults every block changes
        changed = [next(lay for lay in (a, s) if _wins_over(key, defaults.values[key], lay.values))
                   for _, _, _, s, a, _ in blocks if _wins_over(key, defaults.values[key], {**s.values, **a.values})]
        if blocks and len(changed) == len(blocks):
            clash(defaults, key, changed[0], f"never takes effect: all {len(blocks)} blocks change it; the first,")
    for b, name, block, bset, baxes, bmode in blocks:  # 7. settings for a mode the grid does not have
        for m in [*(block.get("mode_set") or {}), *(block.get("only_modes") or [])]:
            if m not in raw["modes"]:
                key = "mode_set" if m in (block.get("mode_set") or {}) else "only_modes"
                raise GridError(f"{lines.at(['runs', b, key], m if key == 'mode_set' else '')}: runs[{b}] ({name}) "
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



def grid_path(name: str) -> Path:
    return GRIDS_DIR / f"{name}.yaml"


def all_grids(directory: Path = GRIDS_DIR) -> list[Path]:
    """Every grid file of a folder (scales.yaml holds model sizes, not runs)."""
    return sorted(p for p in Path(directory).glob("*.yaml") if p.name != "scales.yaml")
