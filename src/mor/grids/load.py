"""A grid file expanded for a mode: the grid model (``Grid``, ``Run``), its modes (a mode on
top of its base file), and ``load_grid``, which validates the file against the schema, merges
each run's config in the documented order, resolves it through the config dataclasses and
names every failure at its file and line (the lint: ``mor.grids.lint``).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import re
from dataclasses import dataclass
from pathlib import Path

import jsonschema

from mor.branching import BranchError, branch_budgets
from mor.budget import resolve_budget
from mor.checkpoint_identity import resolve_import
from mor.config import ConfigError, RunConfig, load_scales, run_config_from_dict
from mor.grids.lint import check_keys, check_overrides, checked_file, locate, validate_defaults
from mor.grids.spec import (MAX_SEEDS, MODES, SCHEMA_FILE, GridError, at, base_file, merge, read_grid_file,
                            set_dotted)
from mor.layout import RunPaths
from mor.yaml_io import YamlError, key_line, load_derived, where


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
        keys_at = list(e.absolute_path)
        if e.validator == "additionalProperties" and isinstance(e.instance, dict) and "properties" in e.schema:
            keys_at += sorted(str(k) for k in e.instance if k not in e.schema["properties"])[:1]  # the unknown key's line
        line = key_line(path, keys_at)
        raise GridError(f"{path}: key {keys}: {e.message}{hint}" + (f" ({where(path, line)})" if line else ""))


def load_grid(path: str | Path, mode: str = "local", seeds: dict[str, int | list[int]] | None = None) -> Grid:
    """Parse, validate and expand a grid for ``mode`` ('local' or 'cluster').

    ``seeds``: block name -> seeds of that block, in place of ``modes.<mode>.seeds`` (blocks
    not named keep the mode's count): a count n (offsets 0..n-1 from the block's train.seed)
    or a list of distinct offsets; a name that is no block of the grid is an error."""
    path = Path(path)
    if mode not in MODES:
        raise GridError(f"mode {mode!r} is not one of {list(MODES)}")
    raw = read_grid_file(path)
    _validate_structure(path, raw)
    checked_file(path)  # a key given twice in one mapping (YAML would keep one silently)
    if raw["name"] != path.stem:
        raise GridError(f"{at(path, ['name'])}: key name: {raw['name']!r} must equal the file name {path.stem!r}")
    if mode not in raw["modes"]:
        raise GridError(f"{at(path, ['modes'])}: key modes: no {mode!r} mode; grid defines {sorted(raw['modes'])}")
    check_keys(path, raw, mode)  # a key no run config field has, named where it is written
    mode_spec = _mode_spec(path, raw["modes"][mode], mode)
    scales = load_scales()
    scale_map = {str(k): str(v) for k, v in mode_spec.get("scale_map", {}).items()}
    for paper, actual in scale_map.items():
        if actual not in scales:
            raise GridError(f"{at(path, ['modes', mode, 'scale_map'], paper)}: key modes.{mode}.scale_map.{paper}: "
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
            raise GridError(f"{at(path, ['runs', b, 'name'])}: runs[{b}]: block name {name!r} is already used by runs[{block_names[name]}]; "
                            "block names must be unique (model.init_checkpoint '@<block>' refers to them)")
        block_names[name] = b
        if "only_modes" in block and mode not in block["only_modes"]:
            continue
        axes = dict(block.get("axes", {}))
        for key, values in mode_spec.get("axes", {}).items():  # the mode's axes apply to every block
            if key in axes:
                raise GridError(f"{at(path, ['runs', b, 'axes'], key)}: runs[{b}] ({name}): key axes.{key} is also an "
                                f"axis of modes.{mode} ({at(path, ['modes', mode, 'axes'], key)}); "
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
                raise GridError(locate(str(e), path, raw, mode, b, where)) from None
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
                    raise GridError(f"{at(path, ['runs', b])}: {where.removeprefix(f'{path}: ')}: resolves to the same training config (run {rid}) as {origin[rid]}; "
                                    "two runs would share one run directory. Remove one, or make them differ in a "
                                    "model / train / data field (labels and eval settings are not part of a run's "
                                    "identity)")
                runs[rid] = Run(rc, name, tuple(block.get("tags", [])))
                origin[rid] = where.removeprefix(f"{path}: ")
    if runs:
        validate_defaults(path, raw, list(runs.values()))
    check_overrides(path, raw, mode)  # a value that cannot take effect in this mode
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
        raise (e if block is None else GridError(locate(str(e), path, raw, mode, block, str(path)))) from None
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
    spec = ((read_grid_file(path) or {}).get("modes") or {}).get(mode)
    return _mode_spec(path, spec, mode) if spec else {}


def _mode_spec(path: Path, spec: dict, mode: str) -> dict:
    """A mode's settings, on top of ``grids/modes/<base>.yaml`` when it names a base."""
    found = base_file(path, spec, mode)
    if found is None:
        return spec
    base = read_grid_file(found)
    unknown = sorted(set(base) - {"set", "scale_map", "seeds"})
    if unknown:
        raise GridError(f"{where(found, key_line(found, [unknown[0]]))}: unknown key(s) {unknown}; allowed keys "
                        "are ['scale_map', 'seeds', 'set']")
    if "seeds" in base and (isinstance(base["seeds"], bool) or not isinstance(base["seeds"], int) or base["seeds"] < 1):
        raise GridError(f"{where(found, key_line(found, ['seeds']))}: key seeds: expected an integer >= 1, "
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
