"""The run-identity policy: which config fields make a run's id, and how they are hashed.

Fields that change what training computes make the run id; fields that only change what the
eval job measures re-run that job alone; presentation fields (label, paper_scale's wording in
tables, reference rows, artifacts) change neither. ``mor.config.RunConfig`` asks this module
for its ``config_hash`` / ``eval_hash``. Torch-free, and imports nothing of mor.
(docs/grids.md, "Run identity", lists what is and is not in the id, and why.)
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

# The grid name is not hashed: a run several grids list is one run, in one folder (runs/<run_id>/).
TRAINING_FIELDS = ("model", "train", "data")
EVAL_FIELDS = ("eval",)
# Fields added after runs existed: hashed only when set, so adding a field with a default
# that keeps the old behaviour never renames (and retrains) an existing run.
# (model.weight_init: its default "crn" is hashed, so every run got a new id when common
# random numbers became the default; "global_rng" gives back the ids of the runs before.
# train.data_order likewise: its default "sequence" renamed every run, "rank" gives back
# the ids, and the data, of the runs before.)
# (Issue 56, the authors' settings: model.router.combine "layer_update", capacity_rounding
# "ceil", aux_accum_steps 1, model.residual_init "scaled" give back the ids of the runs before; the new defaults
# renamed every MoR run, and residual_init every run. recursion_attention "tied" renames nothing.)
# A key of three names is a field of a sub-dataclass (model.router.<name>).
LATER_FIELDS = {("model", "layers"): 0, ("train", "budget_flops"): 0.0, ("model", "weight_init"): "global_rng",
                ("train", "data_order"): "rank", ("train", "branch_run"): "", ("train", "branch_step"): 0,
                ("train", "warmup_steps"): 0, ("model", "router", "combine"): "layer_update",
                ("model", "router", "capacity_rounding"): "ceil",
                ("model", "router", "aux_accum_steps"): 1, ("model", "residual_init"): "scaled",
                ("model", "recursion_attention"): "tied",
                ("model", "import_checkpoint"): "", ("model", "import_sha256"): ""}
# (Issue 62: model.import_checkpoint / import_sha256, the authors' checkpoint a run imports: hashed,
# path and digest, only when set, so the id follows the checkpoint and no trained run is renamed.)
# Fields that left the identity for ExecConfig: a stored config (config.json, a results row)
# may still carry them and parses (the value is dropped), and the hash keeps them at the one
# value every shipped grid had, so no existing run id changes. A run that had set another
# value (none of the shipped grids did) now shares the id of its "auto" twin: it trains the same.
RETIRED_FIELDS = {("model", "attention"): "auto"}
# Fields that decide nothing about what is trained under one data order, hashed there at the
# one value every shipped grid has, so no existing id moves and a change of them renames
# nothing. train.micro_batch under data_order "sequence": sequence j of step s is keyed by
# (seed, s, j) whatever the draw size, and the passes the step is cut into are a memory
# setting (like execution.micro_batch); under "rank" it keys the draws, and stays hashed.
# (docs/grids.md, "Run identity", lists what is and is not in the id, and why.)
ORDER_NEUTRAL_FIELDS = {"sequence": {("train", "micro_batch"): 16}, "pass": {("train", "micro_batch"): 16}}
# Fields that only permit, never change what is trained, and are not hashed at all:
# train.data_epochs lets a run under data_order "pass" read the pool more than once; a run it
# permits reads the same windows whatever larger value is stated (mor.data.sampler.check_pass).
# train.save_steps keeps extra checkpoints for decay branches (mor.branching): the run trains the same.
UNHASHED_FIELDS = (("train", "data_epochs"), ("train", "save_steps"))



def digest(obj: Any) -> str:
    """The 12 hex digits of an identity: sha256 of the canonical JSON."""
    blob = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=list)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def training_fields(run: Any) -> dict[str, Any]:
    """The fields of a ``RunConfig`` that decide the trained weights, as they are hashed."""
    out = {k: dataclasses.asdict(getattr(run, k)) for k in TRAINING_FIELDS}  # == to_dict()[k], cheaper
    for key, default in LATER_FIELDS.items():
        *path, name = key
        owner = out
        for part in path[:-1]:  # (model, router, name): the router's mapping inside the model's
            owner[part] = dict(owner[part])
            owner = owner[part]
        if owner[path[-1]].get(name) == default:
            owner[path[-1]] = {k: v for k, v in owner[path[-1]].items() if k != name}
    for (section, name), value in RETIRED_FIELDS.items():
        out[section] = {**out[section], name: value}
    for (section, name), value in ORDER_NEUTRAL_FIELDS.get(run.train.data_order, {}).items():
        out[section] = {**out[section], name: value}
    for section, name in UNHASHED_FIELDS:
        out[section] = {k: v for k, v in out[section].items() if k != name}
    return out


def eval_fields(run: Any) -> dict[str, Any]:
    """The fields of a ``RunConfig`` that decide what the eval job measures of those weights."""
    return {k: dataclasses.asdict(getattr(run, k)) for k in EVAL_FIELDS}  # == to_dict()[k], cheaper


def eval_hash_of(config: dict[str, Any]) -> str:
    """``RunConfig.eval_hash`` from a config as a dict (``to_dict()``, a row's ``config_json``):
    which eval measurement a result row was made from, without building the config (``mor.migrate``)."""
    return digest({k: config[k] for k in EVAL_FIELDS})
