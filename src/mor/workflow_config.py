"""The workflow's errors as one line, and its config checked for what the profile can use.

Snakemake shows an exception raised while it parses the Snakefile as ``GridError in file
".../common.smk", line 46:`` plus the frames, and one raised in an input function inside an
``InputFunctionException``; neither names what the user has to fix first. ``stop`` prints the
suite's one line (``error: grids/x.yaml, line 12: ...``, as ``python -m mor`` does) and ends
the process with exit status 2; ``checked`` calls a function and stops on a domain error.

``check_config``: the workflow config (workflows/config/config.yaml, a profile's mode.yaml,
``--config key=value``) against its schema, one line per error; ``check_use``: a key the
profile cannot use is refused rather than ignored (``--config presets=...`` under the local
launcher, which reads no presets; a ``fineweb`` settings file in a mode no run of which reads
FineWeb-Edu; a tag no block of any grid carries, which would select no run).

Torch-free: the Snakefile imports it while it parses.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Callable, NoReturn

import jsonschema

from mor.errors import is_domain_error, one_line
from mor.yaml_io import load_yaml


class WorkflowConfigError(ValueError):
    """A workflow config key is malformed, or set where the profile does not use it."""


def stop(e: BaseException) -> NoReturn:
    """End the workflow with ``error: <one line>`` on stderr and exit status 2."""
    print(one_line(e), file=sys.stderr, flush=True)
    sys.exit(2)


def checked(fn: Callable, *args, **kwargs) -> Any:
    """``fn(*args, **kwargs)``; a domain error (a grid, a preset, the config) stops the
    workflow as one line. Anything else (a bug) keeps Snakemake's traceback."""
    try:
        return fn(*args, **kwargs)
    except Exception as e:  # noqa: BLE001 - only domain errors are turned into one line
        if is_domain_error(e):
            stop(e)
        raise


def check_config(config: dict, schema_file: str | Path) -> None:
    """The config against ``schema_file``: the first violation as one WorkflowConfigError."""
    schema = load_yaml(schema_file)
    errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(config), key=lambda e: list(e.absolute_path))
    if not errors:
        return
    e = errors[0]
    key = ".".join(str(p) for p in e.absolute_path)
    if e.validator == "additionalProperties":
        unknown = sorted(set(e.instance) - set(schema.get("properties", {})))
        raise WorkflowConfigError(f"workflow config: unknown key(s) {unknown} (--config or a profile's mode.yaml); "
                                  f"allowed keys are {sorted(schema['properties'])}")
    hint = f"; allowed values are {e.validator_value}" if e.validator == "enum" else ""
    raise WorkflowConfigError(f"workflow config: key {key or '<top level>'}: {e.message}{hint}")


def tag_list(tags: Any) -> list[str]:
    """``tags`` as given (a YAML list, or ``--config tags=a,b``) -> a list of names."""
    return list(tags) if isinstance(tags, list) else [t for t in str(tags).split(",") if t]


def check_use(config: dict, grids: dict) -> None:
    """Refuse a config key that cannot take effect with this profile (see the module docstring).
    ``grids``: name -> mor.grids.Grid, expanded for the config's mode."""
    launcher = config.get("launcher", "local")
    if config.get("presets") and launcher != "slurm":
        raise WorkflowConfigError(f"--config presets={config['presets']}: the {launcher} launcher runs every job on "
                                  "this machine and reads no presets file; drop it, or submit through Slurm "
                                  "(--profile slurm, or --config launcher=slurm)")
    if config.get("fineweb") and not any(r.config.data.source == "fineweb-edu" for g in grids.values() for r in g.runs):
        raise WorkflowConfigError(f"--config fineweb={config['fineweb']}: no run of mode {config['mode']!r} reads "
                                  "FineWeb-Edu, so its preparation settings are never used; drop it, or use the "
                                  "cluster mode (--profile slurm, or --config mode=cluster)")
    known = {t for g in grids.values() for r in g.runs for t in r.tags}
    unknown = sorted(set(tag_list(config.get("tags", []))) - known)
    if unknown:
        raise WorkflowConfigError(f"--config tags: {unknown} is no tag of any block of the grids in "
                                  f"{config.get('grids_dir', 'grids')} (mode {config['mode']!r}), so it would select "
                                  f"no run; known tags are {sorted(known)}")
