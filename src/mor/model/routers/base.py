"""What a router kind answers: the one interface every path asks instead of testing
``model.router.type`` by string.

Two shapes of routing exist, told apart by ``per_recursion``:

    per_recursion True    a router per recursion decides which tokens continue and gates its
                          output (expert-choice); the engine reads each decision back
    per_recursion False   every token's depth is chosen once, before recursion 1
                          (``token_depths``), and one gate follows the stack (token-choice);
                          the engine reads the depths back once, at entry

The shared code (``mor.model.routing``'s ``decide`` and ``gate``, the engine's passes, the
KV layout) serves both shapes; a kind supplies the rest: config checks, the routers and
training forward (with its losses), its design shares of tokens per recursion (FLOPs,
memory, KV layout), how much routing state a kept row costs, the recursions the engine may
see drop tokens, the authors' settings it maps to, and its model-card text.

Kind modules stay torch-free at import time (``mor.config`` and ``mor.flops`` reach them):
a method that runs the network imports the network's module inside it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod


class RouterKind(ABC):
    name: str = ""
    per_recursion: bool = True
    exported: bool = False  # export_hf/modeling_mor.py implements it
    authors_section: str | None = None  # the authors' config section (``mor.<section>``); None: no released run
    # training packs each recursion's tokens into tensors sized by counts read back from the
    # routing (a host sync): fake tensors have no routing, so a rehearsal's sizes are not the run's
    shapes_from_routing: bool = False

    # ---------------------------------------------------------------- config
    def config_error(self, rcfg) -> str | None:
        """Why ``rcfg`` (mor.config.RouterConfig) cannot be routed this way, or None."""
        return None

    # ---------------------------------------------------------------- counts (pure)
    @abstractmethod
    def heads(self, num_recursions: int, rcfg) -> tuple[int, int]:
        """(router heads, logits per head) the model holds."""

    def frozen_params(self, num_recursions: int, rcfg) -> int:
        """Parameters the routers store that no matmul reads (e.g. selection biases)."""
        return 0

    @abstractmethod
    def design_fractions(self, num_recursions: int, rcfg) -> list[float]:
        """The share of the tokens each recursion is designed to run (FLOPs, memory, KV layout)."""

    @abstractmethod
    def kept_row_bytes(self, hidden: int) -> int:
        """fp32 words of routing state a training forward saves per kept token of a routed recursion."""

    def engine_drops(self, num_recursions: int, rcfg) -> list[bool]:
        """Per recursion: whether the engine must read back which rows continue (per-recursion
        kinds); kinds that choose depths up front read them back once at entry."""
        return [False] * num_recursions

    def authors_settings(self, rcfg) -> list[tuple[str, object, str]]:
        """(setting, ours, the authors' config key) rows of ``mor recipe``."""
        return []

    # ---------------------------------------------------------------- the network
    @abstractmethod
    def build_routers(self, hidden: int, num_recursions: int, rcfg) -> list:
        """The router modules ``MoRTransformer.routers`` holds."""

    @abstractmethod
    def run(self, model, h, positions, trace, max_depth: int | None = None):
        """Training / teacher-forced forward of the recursion stack: h (B, T, C) after the
        prefix -> (h, weighted router losses); fills ``trace`` (``RoutingTrace``)."""

    def token_depths(self, model, h, *, warmup: bool = False, max_depth: int | None = None):
        """Kinds with ``per_recursion`` False: every token's depth (``routing.TokenDepths``)."""
        raise NotImplementedError(f"router kind {self.name!r} decides per recursion")

    def start(self, model, h):
        """Inference state before recursion 1: the depths of an up-front kind, else None."""
        return None if self.per_recursion else self.token_depths(model, h)

    # ---------------------------------------------------------------- export
    def card_text(self, model_cfg, routing: str) -> str:
        """How the exported model routes, for its model card."""
        return f"{self.name}."
