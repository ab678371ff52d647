"""A grid value that cannot take effect is refused, naming both places (issue 45, item 1).

Every place where today's merge order (defaults -> the mode's base file -> modes.<mode>.set ->
block set -> block mode_set -> axes) would drop a value without a word, each with a grid that
does it; and the places where overriding is the point (a block changing a default, a grid's
mode over its shared base, a block's mode_set, a block over the base) still load.
"""

import re
import textwrap

import pytest

from mor.grids import GridError, load_grid

BASE = """\
set:
  data: {source: django-docs, tokenizer: bpe-4096}
  train: {tokens: 4096, lr: 3.0e-3}
  eval: {nll_tokens: 2048}
"""


def grid(tmp_path, defaults="", blocks=None, mode="{base: tiny-base, scale_map: {135M: tiny}}", name="g"):
    """A grid file under tmp_path (its base mode beside it); blocks: YAML list items."""
    (tmp_path / "modes").mkdir(exist_ok=True)
    (tmp_path / "modes" / "tiny-base.yaml").write_text(BASE)
    blocks = blocks or ["- name: rec\n  set: {model.variant: recursive, model.num_recursions: 2}\n  axes: {model.scale: [135M]}",
                        "- name: van\n  set: {model.variant: vanilla, model.num_recursions: 1}\n"
                        "  axes: {model.scale: [135M]}"]
    text = (f"name: {name}\ndescription: d\nartifacts: [tables/table10]\n"
            + (f"defaults:\n{textwrap.indent(textwrap.dedent(defaults), '  ')}" if defaults else "")
            + "runs:\n" + "".join(textwrap.indent(b, "  ") + "\n" for b in blocks)
            + f"modes:\n  local: {mode}\n")
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    return path


def refused(path, *patterns, mode="local"):
    with pytest.raises(GridError) as e:
        load_grid(path, mode)
    msg = str(e.value)
    assert "\n" not in msg
    for p in patterns:
        assert re.search(p, msg), (p, msg)
    return msg


def line_of(path, text):
    return next(i for i, ln in enumerate(path.read_text().splitlines(), 1) if text in ln)


def test_the_issues_case_a_negative_lr_under_defaults_is_refused_as_a_value(tmp_path):
    p = grid(tmp_path, "train.lr: -0.001\n")
    refused(p, rf"g\.yaml, line {line_of(p, 'train.lr: -0.001')}: ", r"train\.lr=-0\.001 must be > 0")


def test_a_default_the_base_mode_overrides_names_both_lines(tmp_path):
    p = grid(tmp_path, "train.lr: 1.0e-3\n")
    base = tmp_path / "modes" / "tiny-base.yaml"
    refused(p, rf"g\.yaml, line {line_of(p, 'train.lr: 1.0e-3')}: defaults train\.lr=0\.001 never takes effect "
               r"in mode 'local'", rf"modes/tiny-base\.yaml, line {line_of(base, 'lr: 3.0e-3')}\)",
            r"train\.lr=0\.003")


def test_a_default_the_grids_own_mode_set_overrides_is_refused(tmp_path):
    p = grid(tmp_path, "eval.batch: 4\n", mode="{base: tiny-base, scale_map: {135M: tiny}, set: {eval.batch: 8}}")
    refused(p, rf"line {line_of(p, 'eval.batch: 4')}: defaults eval\.batch=4 never takes effect",
            rf"modes\.local\.set eval\.batch=8 \(.*g\.yaml, line {line_of(p, 'eval.batch: 8')}\)")


def test_a_default_a_mode_axis_sets_is_refused(tmp_path):
    p = grid(tmp_path, "train.seed: 3\n",
             mode="{base: tiny-base, scale_map: {135M: tiny}, axes: {train.seed: [0, 1]}}")
    refused(p, r"defaults train\.seed=3 never takes effect", r"modes\.local\.axes train\.seed")


def test_a_default_every_block_changes_is_refused_and_one_kept_somewhere_loads(tmp_path):
    p = grid(tmp_path, "model.variant: mor\n")  # both blocks set model.variant
    refused(p, r"defaults model\.variant=mor never takes effect: all 2 blocks change it",
            rf"runs\[0\] \(rec\) set model\.variant=recursive \(.*line {line_of(p, 'name: rec') + 1}\)")
    ok = grid(tmp_path, "model.tying: cycle\n", name="h",
              blocks=["- name: rec\n  set: {model.variant: recursive, model.num_recursions: 2}\n  axes: {model.scale: [135M]}",
                      "- name: seq\n  set: {model.variant: recursive, model.num_recursions: 2, model.tying: sequence}\n"
                      "  axes: {model.scale: [135M]}"])
    assert {r.config.model.tying for r in load_grid(ok, "local").runs} == {"cycle", "sequence"}


def test_a_default_a_block_axis_replaces_in_every_block_is_refused(tmp_path):
    p = grid(tmp_path, "model.num_recursions: 2\n",
             blocks=["- name: rec\n  set: {model.variant: recursive}\n"
                     "  axes: {model.scale: [135M], model.num_recursions: [2, 3]}"])
    refused(p, r"defaults model\.num_recursions=2 never takes effect", r"runs\[0\] \(rec\) axes model\.num_recursions")


@pytest.mark.parametrize("where", ["set", "mode_set"])
def test_a_block_value_that_is_also_an_axis_is_refused(tmp_path, where):
    value = "{model.num_recursions: 4}" if where == "set" else "{local: {model.num_recursions: 4}}"
    p = grid(tmp_path, blocks=[f"- name: rec\n  set: {{model.variant: recursive}}\n  {where}: {value}\n"
                               "  axes: {model.scale: [135M], model.num_recursions: [2, 3]}"]
             if where == "mode_set" else
             ["- name: rec\n  set: {model.variant: recursive, model.num_recursions: 4}\n"
              "  axes: {model.scale: [135M], model.num_recursions: [2, 3]}"])
    refused(p, r"model\.num_recursions=4 never takes effect: runs\[0\] \(rec\) axes model\.num_recursions")


def test_a_block_set_against_the_grids_own_mode_set_is_refused_mode_set_is_the_way(tmp_path):
    mode = "{base: tiny-base, scale_map: {135M: tiny}, set: {eval.batch: 8}}"
    p = grid(tmp_path, mode=mode, blocks=["- name: rec\n  set: {model.variant: recursive, model.num_recursions: 2, eval.batch: 2}\n"
                                          "  axes: {model.scale: [135M]}"])
    refused(p, r"runs\[0\] \(rec\) set eval\.batch=2 and modes\.local\.set eval\.batch=8", r"mode_set\.local")
    ok = grid(tmp_path, mode=mode, name="h",
              blocks=["- name: rec\n  set: {model.variant: recursive, model.num_recursions: 2}\n  mode_set: {local: {eval.batch: 2}}\n"
                      "  axes: {model.scale: [135M]}"])
    assert [r.config.eval.batch for r in load_grid(ok, "local").runs] == [2]


def test_a_block_may_override_the_shared_base(tmp_path):
    p = grid(tmp_path, blocks=["- name: rec\n  set: {model.variant: recursive, model.num_recursions: 2, train.lr: 1.0e-3}\n"
                               "  axes: {model.scale: [135M]}"])
    assert [r.config.train.lr for r in load_grid(p, "local").runs] == [1.0e-3]


def test_tokens_beside_a_flops_budget_are_refused(tmp_path):
    mode = "{base: tiny-base, scale_map: {135M: tiny}, axes: {train.budget_flops: [1.0e12, 2.0e12]}}"
    p = grid(tmp_path, mode=mode, blocks=["- name: rec\n  set: {model.variant: recursive, model.num_recursions: 2, "
                                          "train.tokens: 8192}\n  axes: {model.scale: [135M]}"])
    refused(p, r"runs\[0\] \(rec\) set train\.tokens never takes effect in runs\[0\] \(rec\)",
            r"modes\.local\.axes train\.budget_flops \(.*line \d+\) derives the tokens")
    ok = grid(tmp_path, mode=mode, name="h")  # the base's tokens give way to the budget: what a base is for
    assert len(load_grid(ok, "local").runs) == 4


@pytest.mark.parametrize("defaults, first, second", [
    ("train.lr: 1.0e-3\ntrain.lr: 2.0e-3\n", "train.lr: 1.0e-3", "train.lr: 2.0e-3"),  # YAML keeps the last
    ("train.seed: 1\ntrain: {seed: 2}\n", "train.seed: 1", "train: {seed: 2}"),  # dotted and nested
    ("model.router: {type: expert_choice}\nmodel.router.alpha: 0.2\n", "model.router:", "router.alpha"),
])
def test_a_key_given_twice_in_one_mapping_is_refused(tmp_path, defaults, first, second):
    p = grid(tmp_path, defaults)
    refused(p, rf"line {line_of(p, second)}: key defaults\.\S+ is set twice in one mapping "
               rf"\(also at line {line_of(p, first)}\)")


def test_a_repeated_key_in_the_base_mode_file_is_refused(tmp_path):
    p = grid(tmp_path)
    (tmp_path / "modes" / "tiny-base.yaml").write_text(BASE + "set:\n  train: {lr: 1.0}\n")
    refused(p, r"tiny-base\.yaml, line 5: key set is set twice")


def test_the_shipped_grids_set_nothing_that_cannot_take_effect():
    from mor.grids import all_grids

    for path in all_grids():
        import yaml

        for mode in yaml.safe_load(path.read_text())["modes"]:
            assert load_grid(path, mode).runs


@pytest.mark.parametrize("key, value", [("mode_set", "{cluster: {eval.batch: 2}}"), ("only_modes", "[local, cluster]")])
def test_a_block_setting_for_a_mode_the_grid_lacks_is_refused(tmp_path, key, value):
    p = grid(tmp_path, blocks=["- name: rec\n  set: {model.variant: recursive, model.num_recursions: 2}\n"
                               f"  {key}: {value}\n  axes: {{model.scale: [135M]}}"])
    refused(p, rf"line {line_of(p, key)}: runs\[0\] \(rec\) {key} names mode 'cluster', which the grid does not "
               r"define \(modes: \['local'\]\): it never takes effect")
