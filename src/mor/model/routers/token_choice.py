"""Token-choice (``model.router.type: token_choice``): one router picks every token's depth
before recursion 1 (top-1 of Nr), one gate follows the stack; causal as trained. The
network's side is ``mor.model.token_choice`` / ``mor.model.router.TokenChoiceRouter``."""

from __future__ import annotations

from mor.capacity import capacities
from mor.model.routers.base import RouterKind


class TokenChoice(RouterKind):
    name = "token_choice"
    per_recursion = False
    shapes_from_routing = True  # mor.model.token_choice.depth_counts: the packed sizes per recursion
    exported = True
    authors_section = "token"

    def heads(self, num_recursions: int, rcfg) -> tuple[int, int]:
        return 1, num_recursions  # one head, one logit per depth

    def frozen_params(self, num_recursions: int, rcfg) -> int:
        return num_recursions if rcfg.balancing == "loss_free" else 0  # the Nr selection biases

    def design_fractions(self, num_recursions: int, rcfg) -> list[float]:
        return capacities(num_recursions)  # the balanced assignment: (Nr - r + 1) / Nr reach recursion r

    def kept_row_bytes(self, hidden: int) -> int:
        return hidden + 8  # routes once and keeps one row copy

    def authors_settings(self, rcfg) -> list[tuple[str, object, str]]:
        return [("router.func", rcfg.func, "token.router_func"),
                ("router.alpha", rcfg.alpha, "token.alpha"),
                ("router.arch", rcfg.arch, "token.router_type"),
                ("router.balancing", rcfg.balancing, "token.balancing"),
                ("router.balance_coeff", rcfg.balance_coeff, "token.coeff"),
                ("z_loss", rcfg.z_loss_coeff, "token.z_coeff")]

    def build_routers(self, hidden: int, num_recursions: int, rcfg) -> list:
        from mor.model.router import TokenChoiceRouter

        return [TokenChoiceRouter(hidden, num_recursions, rcfg)]  # one, before recursion 1

    def run(self, model, h, positions, trace, max_depth: int | None = None):
        from mor.model.token_choice import run_token_choice

        return run_token_choice(model, h, positions, trace, max_depth=max_depth)

    def token_depths(self, model, h, *, warmup: bool = False, max_depth: int | None = None):
        from mor.model.routing import token_depths

        return token_depths(model, h, warmup=warmup, max_depth=max_depth)

    def card_text(self, model_cfg, routing: str) -> str:
        return ("token-choice: each token's depth is the top-1 of its router before recursion 1 "
                "(causal as trained; `routing` makes no difference).")


TOKEN_CHOICE = TokenChoice()
