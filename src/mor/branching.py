"""isoFLOP budgets the authors' way (issue 55 item 4): one warmup-stable run per model, each
smaller budget a decay branch from it.

Why: the authors train one warmup-stable-decay run per model at the largest budget, save it at
0.8 x the step count of each smaller budget (``fixed_save_steps`` of their configs,
../shared/AUTHORS_RUNS.md) and decay each smaller budget linearly over its last 20 % from that
checkpoint. Training the smaller budgets as separate runs repeats their warmup and stable phase,
which the largest run trains anyway. Here a grid mode with ``branch_budgets: true`` groups the
runs that differ only in their budget (same block, model, data, seed, recipe); the longest is the
stable run, and every other run of the group becomes a branch:

    train.branch_run  = the stable run's id,     train.branch_step = its own decay start
    stable run's train.save_steps = the branch steps (checkpoints kept under checkpoints/branch/)

A branch trains steps branch_step .. steps - 1 only, at its own schedule's decay (wsd_lr of its
own step count: the stable phase of both is the peak LR, so up to the branch point the stable
run IS the branch's run), reading the batches a straight run reads at those steps (batches are
addressed by step). Its warmup is the stable run's (the authors use one fixed warmup count for
all budgets). The branch's id hashes branch_run and branch_step; the stable run's id is
unchanged (save_steps is not part of a run's identity), so nothing is trained twice.

Pure: grid expansion calls ``branch_budgets``; the trainer reads the fields.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from mor.config import RunConfig

# Fields that differ between the budgets of one model (everything else must be equal).
BUDGET_FIELDS = ("tokens", "budget_flops", "branch_run", "branch_step", "save_steps")


class BranchError(ValueError):
    """A group of budgets cannot branch from one stable run; the message names the runs."""


def _model_key(rc: RunConfig) -> str:
    """What must be equal for two runs to share a stable run: every training field but the budget's."""
    from mor.identity import digest

    d = rc.training_dict()
    d["train"] = {k: v for k, v in d["train"].items() if k not in BUDGET_FIELDS}
    return digest({"grid": rc.grid, "fields": d})


def warmup_steps(rc: RunConfig) -> int:
    """Warmup steps of ``rc``'s own schedule (mor.train.schedule.wsd_lr)."""
    return int(round(rc.train.steps * rc.train.warmup_frac))


def branch_budgets(runs: list[Any], config: Callable[[Any], RunConfig], replace: Callable[[Any, RunConfig], Any],
                   where: str = "") -> list[Any]:
    """``runs`` (grid Runs, or anything ``config`` reads a RunConfig from and ``replace`` rebuilds)
    with each group of budgets turned into one stable run and its decay branches, in order.

    A group whose longest run does not reach a branch's step in its stable phase (the branch
    point inside the stable run's warmup or decay) is refused: that branch would start from
    weights a straight run of its budget never has."""
    groups: dict[str, list[int]] = {}
    for i, r in enumerate(runs):
        groups.setdefault(_model_key(config(r)), []).append(i)
    out = list(runs)
    for members in groups.values():
        if len(members) < 2:
            continue
        stable_i = max(members, key=lambda i: config(runs[i]).train.steps)
        stable = config(runs[stable_i])
        points = []
        for i in members:
            if i == stable_i:
                continue
            rc = config(runs[i])
            if rc.train.steps == stable.train.steps:
                raise BranchError(f"{where}runs {rc.run_id} and {stable.run_id} train the same {rc.train.steps} "
                                  "steps at different budgets: neither is a branch of the other")
            b = rc.train.decay_start
            lo, hi = warmup_steps(stable), stable.train.decay_start
            if not lo <= b <= hi:
                raise BranchError(f"{where}run {rc.run_id} would branch at step {b}, outside the stable phase "
                                  f"[{lo}, {hi}] of {stable.run_id} ({stable.train.steps} steps); run it straight "
                                  "(branch_budgets: false) or give both the same warmup")
            branch = dataclasses.replace(rc.train, branch_run=stable.run_id, branch_step=b, save_steps=())
            out[i] = replace(runs[i], dataclasses.replace(rc, train=branch))
            points.append(b)
        train = dataclasses.replace(stable.train, save_steps=tuple(sorted(set(points))))
        out[stable_i] = replace(runs[stable_i], dataclasses.replace(stable, train=train))
    return out


def trained_steps(rc: RunConfig) -> int:
    """Optimizer steps a run's own job trains: a branch its decay, any other run all of them."""
    return rc.train.steps - rc.train.branch_step
