"""Expert-choice (``model.router.type: expert_choice``): a router per recursion keeps the
top-k of each sequence in training (causal sign of its logit at inference) and gates the
recursion's output. The network's side is ``mor.model.expert_choice`` / ``mor.model.router``."""

from __future__ import annotations

from mor.capacity import capacities
from mor.model.routers.base import RouterKind


class ExpertChoice(RouterKind):
    name = "expert_choice"
    per_recursion = True
    exported = True
    authors_section = "expert"

    def config_error(self, rcfg) -> str | None:
        if rcfg.func == "softmax":
            return "func='softmax' needs type='token_choice' (expert-choice scores one logit)"
        return None

    def heads(self, num_recursions: int, rcfg) -> tuple[int, int]:
        return num_recursions * (2 if rcfg.aux == "aux_router" else 1), 1  # aux router: a second head each

    def design_fractions(self, num_recursions: int, rcfg) -> list[float]:
        return capacities(num_recursions, rcfg.capacity)

    def kept_row_bytes(self, hidden: int) -> int:
        return 2 * hidden + 8  # gathers the rows and writes back the gated update

    def engine_drops(self, num_recursions: int, rcfg) -> list[bool]:
        return [c < 1 for c in capacities(num_recursions, rcfg.capacity)]  # capacity 1 keeps all: the host knows

    def authors_settings(self, rcfg) -> list[tuple[str, object, str]]:
        return [("router.func", rcfg.func, "expert.router_func"),
                ("router.alpha", rcfg.alpha, "expert.alpha"),
                ("router.arch", rcfg.arch, "expert.router_type"),
                ("router.aux", rcfg.aux, "expert.sampling"),
                ("router.aux_coeff", rcfg.aux_coeff, "expert.coeff"),
                ("router.gating", rcfg.gating, "expert.gating"),
                ("router.capacity_warmup_steps", rcfg.capacity_warmup_steps, "expert.cap_warmup_step"),
                ("z_loss", rcfg.z_loss_coeff, "expert.z_loss")]

    def build_routers(self, hidden: int, num_recursions: int, rcfg) -> list:
        from mor.model.router import ExpertChoiceRouter

        caps = capacities(num_recursions, rcfg.capacity)
        if any(b > a for a, b in zip(caps, caps[1:])):
            raise ValueError(f"model.router.capacity must be non-increasing (hierarchical), got {caps}")
        return [ExpertChoiceRouter(hidden, rcfg) for _ in range(num_recursions)]

    def run(self, model, h, positions, trace, max_depth: int | None = None):
        from mor.model.expert_choice import run_expert_choice

        return run_expert_choice(model, h, positions, trace, max_depth=max_depth)

    def card_text(self, model_cfg, routing: str) -> str:
        who = "auxiliary router" if model_cfg.router.aux == "aux_router" else "router"
        return (f"expert-choice, `routing: {routing}` in config.json. `causal` (generation): a token continues to "
                f"recursion r when it reached r-1 and its {who} logit is > 0 (a recursion of capacity 1 keeps every "
                "token). `topk` (teacher-forced scoring, as trained): the top-k tokens of each sequence; pass "
                "`routing=\"topk\"` to `forward`.")


EXPERT_CHOICE = ExpertChoice()
