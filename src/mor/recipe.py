"""Every setting that defines a training run, with its source (issue 55, item 6).

``python -m mor recipe --grid G --mode cluster [--format csv]`` prints, per training run, its
layers, steps, tokens, warmup and decay steps, LR, batch, sequence length, optimiser, router
settings, z-loss, KV strategy and initialisation, each with where the value comes from: the
paper (section), the authors' released config (``grids/authors/released.yaml``, the file it was
read from), or our choice (why).

A run that stands for one of the authors' nine released 360M runs (same variant, Nr, router,
KV strategy, scale 360M, budget 16.5e18) is held against that config: every setting that differs
needs a recorded reason (``RECORDED``), else its row says ``UNEXPLAINED`` and
``tests/unit/test_recipe.py`` fails. Pure: no torch, reads the grid's expanded configs only.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass

from mor.authors import ReleasedRun, load_released
from mor.config import RunConfig, model_shape
from mor.flops import plan_for
from mor.grids import Grid
from mor.model.routers.registry import router_kind

PAPER_TRAINING = "paper's training recipe (PAPER.md 'Training')"
# Differences from a released config that are known and explained: (grid, released run name or
# '*', setting) -> why. The test fails on any difference not listed here.
RECORDED = {
    ("*", "mor3-expert", "steps"): "the authors' FLOP convention gives 14,160.01 steps (round: 14,160); they "
                                   "released 14,161, while their save steps 1,373 / 3,433 / 11,328 follow 14,160.01 "
                                   "(mor.flops_authors): one step, unexplained",
    ("*", "mor3-token", "steps"): "as MoR-3 expert: 14,160 by the convention, 14,161 released (mor.flops_authors)",
    ("*", "mor3-expert", "tokens"): "follows the steps: one step (2,097,152 tokens) short of the released run",
    ("*", "mor3-token", "tokens"): "follows the steps: one step (2,097,152 tokens) short of the released run",
    ("table9", "*", "warmup_steps"): "table9 keeps paper-10B's 1 % warmup (our choice before issue 55); the "
                                     "authors' fixed 57 / 86 come with the branched decays (issue 55, item 4)",
}
_BUDGET = 16.5e18


@dataclass(frozen=True)
class Setting:
    run_id: str
    label: str
    setting: str
    value: str
    source: str
    released: str = ""  # the authors' value where the run stands for a released one
    authors_file: str = ""  # their conf/pretrain/<file> it is read from
    status: str = ""  # '' (no released run), 'same', 'recorded: <why>' or 'UNEXPLAINED'


def released_for(run: RunConfig) -> ReleasedRun | None:
    """The released 360M run ``run`` stands for, or None (another scale, budget or design)."""
    m, t = run.model, run.train
    if run.paper_scale != "360M" or m.scale != "360M" or t.budget_flops != _BUDGET:
        return None
    router = (router_kind(m.router.type).authors_section or None) if m.variant == "mor" else ""
    nr = m.num_recursions if m.variant != "vanilla" else 1
    for r in load_released()[1]:
        if (r.variant, r.num_recursions, r.router, r.kv) == (m.variant, nr, router, m.kv) and not m.reduced:
            return r
    return None


def _router_rows(run: RunConfig) -> list[tuple[str, object, str, str]]:
    """(setting, ours, the authors' common value's key, source) of the router settings."""
    m = run.model
    if m.variant != "mor":
        return []
    r = m.router
    grid_src = (f"grids/{run.grid}.yaml: the authors' released router settings" if released_for(run)
                else f"grids/{run.grid}.yaml (paper App. G; its best router unless the grid ablates it)")
    rows = router_kind(r.type).authors_settings(r)  # (setting, ours, the authors' key), the kind's
    return [("router", r.type, "", grid_src)] + [(setting, ours, key, grid_src) for setting, ours, key in rows]


def _common(key: str):
    value = load_released()[0]
    for part in key.split("."):
        value = value[part]
    if key.endswith("z_loss") and value is False:  # expert-choice: z_loss false = coefficient 0
        return 0.0
    return value


def _same(ours, theirs) -> bool:
    if isinstance(theirs, (int, float)) and not isinstance(theirs, bool) and isinstance(ours, (int, float)):
        return abs(float(ours) - float(theirs)) <= 1e-12 * max(1.0, abs(float(theirs)))
    return str(ours) == str(theirs) or (str(theirs), str(ours)) in _NAMES


# the authors' names for our values (their config keys read as ours)
_NAMES = {("aux_loss", "aux_loss"), ("linear", "linear"), ("loss", "loss"), ("smollm-360m", "360M")}


def recipe(grid: Grid) -> list[Setting]:
    """Every training run's settings with their sources (module docstring)."""
    out: list[Setting] = []
    for run in (r.config for r in grid.runs):
        out += run_recipe(grid.name, run)
    return out


def run_recipe(grid: str, run: RunConfig) -> list[Setting]:
    m, t = run.model, run.train
    shape = model_shape(m)
    rel = released_for(run)
    src_rel = f"conf/pretrain/{rel.file}" if rel else ""
    mode_src = f"grids/{grid}.yaml and its mode base"
    layers = len(plan_for(m, shape).order)
    depth_src = ("model.layers in the grid (paper App. E: MoR-4 at 360M has 34 layers; authors' "
                 "model_config.num_hidden_layers: 34)" if m.layers else
                 f"scale {m.scale} (grids/scales.yaml; SmolLM's shape) with the authors' floor rule (mor.depth)")
    if t.budget_flops:
        steps_src = (f"budget {t.budget_flops:.3g} FLOPs (paper § 5.1 / Table 3) in the authors' FLOP convention "
                     "(mor.flops_authors, derived from their released step counts)")
    else:
        steps_src = f"train.tokens = {t.tokens:,} ({mode_src}; PAPER.md: ablations train 10B tokens [seed])"
    warmup = t.warmup_steps or int(round(t.steps * t.warmup_frac))
    warmup_src = ("train.warmup_steps: the authors' fixed warmup (57 Vanilla / Recursive, 86 MoR)" if t.warmup_steps
                  else f"train.warmup_frac {t.warmup_frac:g} of the steps (our choice: {mode_src})")
    rows: list[tuple[str, object, object, str]] = [  # (setting, ours, theirs or None, source)
        ("layers", layers, rel.layers if rel else None, depth_src),
        ("steps", t.steps, rel.num_train_steps if rel else None, steps_src),
        ("tokens", t.steps * t.tokens_per_step, rel.num_train_steps * _common("total_batch_size") *
         _common("max_length") if rel else None, "steps x global batch x sequence length"),
        ("warmup_steps", warmup, rel.num_warmup_steps if rel else None, warmup_src),
        ("decay_steps", int(round(t.steps * t.decay_frac)), rel.num_decay_steps if rel else None,
         f"train.decay_frac {t.decay_frac:g}: warmup-stable-decay, linear decay ({PAPER_TRAINING}; authors' "
         "num_decay_steps = 20 %)"),
        ("lr", t.lr, _common("learning_rate") if rel else None, PAPER_TRAINING),
        ("global_batch", t.global_batch, _common("total_batch_size") if rel else None, PAPER_TRAINING),
        ("seq_len", t.seq_len, _common("max_length") if rel else None, PAPER_TRAINING),
        ("adam_betas", f"{t.beta1:g}/{t.beta2:g}", f"{_common('adam_beta1'):g}/{_common('adam_beta2'):g}" if rel
         else None, PAPER_TRAINING),
        ("weight_decay", t.weight_decay, _common("weight_decay") if rel else None, PAPER_TRAINING),
        ("grad_clip", t.grad_clip, _common("max_grad_norm") if rel else None, PAPER_TRAINING),
        ("precision", t.precision, _common("precision") if rel else None, PAPER_TRAINING),
        ("tying", m.tying if m.variant != "vanilla" else "-", (_common("sharing") if rel.variant != "vanilla" else "-")
         if rel else None, "paper App. F (Middle-Cycle is the best scheme)" if m.variant != "vanilla" else "-"),
        ("num_recursions", m.num_recursions if m.variant != "vanilla" else 1, rel.num_recursions if rel else None,
         f"grids/{grid}.yaml"),
        ("kv", m.kv, rel.kv if rel else None, f"grids/{grid}.yaml (paper App. H)"),
        ("initialisation", f"{m.tied_init}, N(0, {shape.init_std:g})", f"{_common('initialization')}, N(0, 0.02)"
         if rel else None, "paper: from scratch; authors' initialization: random and HF's N(0, 0.02) "
                           "(grids/scales.yaml init_std)"),
    ]
    for setting, ours, key, src in _router_rows(run):
        rows.append((setting, ours, (_common(key) if key else ours) if rel else None, src))
    out = []
    for setting, ours, theirs, src in rows:
        if rel is None or theirs is None:
            status, shown = "", ""
        elif _same(ours, theirs):
            status, shown = "same", str(theirs)
        else:
            why = (RECORDED.get((grid, rel.name, setting)) or RECORDED.get(("*", rel.name, setting))
                   or RECORDED.get((grid, "*", setting)))
            status, shown = (f"recorded: {why}" if why else "UNEXPLAINED"), str(theirs)
        out.append(Setting(run.run_id, run.label, setting, _fmt(ours), src, shown, src_rel if rel else "", status))
    return out


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, int):
        return f"{v:,}" if abs(v) >= 10_000 else str(v)
    return str(v)


def unexplained(settings: list[Setting]) -> list[Setting]:
    return [s for s in settings if s.status == "UNEXPLAINED"]


def format_recipe(settings: list[Setting], fmt: str = "text") -> str:
    """The recipe as text (one block per run) or CSV (one row per run and setting)."""
    if fmt == "csv":
        buf = io.StringIO()
        w = csv.writer(buf)
        w.writerow(["run_id", "label", "setting", "value", "source", "authors_value", "authors_file", "status"])
        for s in settings:
            w.writerow([s.run_id, s.label, s.setting, s.value, s.source, s.released, s.authors_file, s.status])
        return buf.getvalue()
    lines, last = [], None
    for s in settings:
        if s.run_id != last:
            held = (f": held against the authors' {s.authors_file} ([= authors] where equal)" if s.authors_file
                    else ": no released config of the authors stands for it")
            lines.append(f"{s.run_id} ({s.label}){held}")
            last = s.run_id
        theirs = f"  [authors {s.released}: {s.status}]" if s.status and s.status != "same" else \
            ("  [= authors]" if s.status == "same" else "")
        lines.append(f"  {s.setting:<30} {s.value:<22} {s.source}{theirs}")
    bad = unexplained(settings)
    if bad:
        lines.append(f"UNEXPLAINED: {len(bad)} setting(s) differ from the authors' released configs without a "
                     "recorded reason (mor.recipe.RECORDED)")
    return "\n".join(lines) + "\n"
