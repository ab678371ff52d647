"""How many layers a recursive model runs: the authors' rule, and the padding rule it replaced.

Torch-free and importing nothing of mor, so the model's tying plan (``mor.model.tying``) and the
run identity (``mor.config.RunConfig.training_dict``) share one definition.

The authors' code (issue 55; ``../shared/AUTHORS_RUNS.md``, "Depth") builds
floor((L - unshared) / Nr) layers per recursion and drops the rest: SmolLM-135M (30 layers)
Middle-Cycle Nr 3 is 1 + 9x3 + 1 = 29 layers. Layers are added only where the paper says so,
through the config (``model.layers``): MoR-4 / Recursive-4 at 360M are 1 + 8x4 + 1 = 34 (App. E;
their ``model_config.num_hidden_layers: 34``). Before issue 55 this suite padded up to the
next depth the scheme divides (``padded_depth``), e.g. 32 for that 135M run: another model.
"""

from __future__ import annotations


def unshared_layers(scheme: str) -> int:
    """Layers outside the recursion: Middle-Cycle / Middle-Sequence keep the first and last."""
    return 2 if scheme.startswith("middle") else 0


def floor_depth(scheme: str, layers: int, num_recursions: int) -> int:
    """The authors' depth: unshared + floor((layers - unshared) / Nr) * Nr, at least one layer
    per recursion (a scale too shallow for Nr recursions gets Nr shared layers, as before)."""
    unshared = unshared_layers(scheme)
    per = max(1, (layers - unshared) // num_recursions)
    return unshared + per * num_recursions


def padded_depth(scheme: str, layers: int, num_recursions: int) -> int:
    """The rule before issue 55: the smallest depth >= ``layers`` the scheme divides into Nr
    recursions. Kept to tell which runs the depth rule changed (their run ids move)."""
    unshared = unshared_layers(scheme)
    depth = max(layers, unshared + num_recursions)
    while (depth - unshared) % num_recursions:
        depth += 1
    return depth


def depth_moved(variant: str, scheme: str, layers: int, num_recursions: int, reduced: bool = False) -> bool:
    """Whether the floor rule builds another model than the padding rule did: a recursive / MoR
    model whose scheme does not divide ``layers``, or a reduced vanilla (``cycle`` unique layers)
    whose Nr does not divide them. Such a run's identity carries the rule (its id moves)."""
    if variant == "vanilla":
        return reduced and floor_depth("cycle", layers, num_recursions) != padded_depth("cycle", layers, num_recursions)
    return floor_depth(scheme, layers, num_recursions) != padded_depth(scheme, layers, num_recursions)
