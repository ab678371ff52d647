"""The one list of router kinds and router architectures (``model.router.type`` / ``.arch``).

Imports nothing: ``mor.config`` validates against ``kind_names()`` / ``arch_names()`` without
pulling in torch. The built-in entries are named as ``"module:attribute"`` and imported on
first use (their modules are torch-free at import time too: they import the network's code
inside the methods that run it), so listing the names costs nothing. ``register_kind`` /
``register_arch`` add one at run time (the example kind in tests/unit/test_router_kinds.py).
"""

from __future__ import annotations

import importlib

_KINDS: dict[str, object] = {
    "expert_choice": "mor.model.routers.expert_choice:EXPERT_CHOICE",
    "token_choice": "mor.model.routers.token_choice:TOKEN_CHOICE",
}
_ARCHS: dict[str, object] = {
    "linear": "mor.model.routers.arch:LINEAR",
    "mlp": "mor.model.routers.arch:MLP",
    "wide_mlp": "mor.model.routers.arch:WIDE_MLP",
}


def _resolve(table: dict[str, object], what: str, name: str):
    try:
        entry = table[name]
    except KeyError:
        raise ValueError(f"unknown router {what} {name!r}; registered: {sorted(table)}") from None
    if isinstance(entry, str):
        module, attr = entry.split(":")
        entry = table[name] = getattr(importlib.import_module(module), attr)
    return entry


def kind_names() -> tuple[str, ...]:
    """Every allowed ``model.router.type``, in registration order."""
    return tuple(_KINDS)


def arch_names() -> tuple[str, ...]:
    """Every allowed ``model.router.arch``, in registration order."""
    return tuple(_ARCHS)


def router_kind(name: str):
    """The ``base.RouterKind`` registered as ``name`` (a ValueError naming the registered ones)."""
    return _resolve(_KINDS, "type", name)


def router_arch(name: str):
    """The ``arch.RouterArch`` registered as ``name``."""
    return _resolve(_ARCHS, "arch", name)


def exported_kinds() -> tuple[str, ...]:
    """The kinds the self-contained HF modeling file implements (``RouterKind.exported``)."""
    return tuple(n for n in _KINDS if router_kind(n).exported)


def exported_archs() -> tuple[str, ...]:
    return tuple(n for n in _ARCHS if router_arch(n).exported)


def register_kind(kind) -> None:
    """Add a router kind under ``kind.name``; a name already taken is refused."""
    _register(_KINDS, "type", kind)


def register_arch(arch) -> None:
    """Add a router architecture under ``arch.name``; a name already taken is refused."""
    _register(_ARCHS, "arch", arch)


def _register(table: dict[str, object], what: str, obj) -> None:
    if obj.name in table:
        raise ValueError(f"router {what} {obj.name!r} is already registered")
    table[obj.name] = obj


def unregister(name: str) -> None:
    """Remove a kind or architecture added by ``register_*`` (tests clean up with it)."""
    for table in (_KINDS, _ARCHS):
        if name in table and not isinstance(table[name], str):
            del table[name]
