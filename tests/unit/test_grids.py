
import pytest
import yaml

from helpers.paths import REPO
from mor.grids import GridError, all_grids, load_grid


@pytest.mark.parametrize("path", all_grids(), ids=lambda p: p.stem)
def test_every_shipped_grid_expands_in_every_mode(path):
    raw = yaml.safe_load(path.read_text())
    for mode in raw["modes"]:
        grid = load_grid(path, mode)
        ids = [r.run_id for r in grid.runs]
        assert len(ids) == len(set(ids)) > 0
        assert all(r.config.paper_scale for r in grid.runs)


def test_table10_has_the_papers_axes():
    grid = load_grid(REPO / "grids" / "table10.yaml", "local")
    rec = [r.config for r in grid.runs if r.config.model.variant == "recursive"]
    assert {c.model.tying for c in rec} == {"cycle", "sequence", "middle_cycle", "middle_sequence"}
    assert {c.model.num_recursions for c in rec} == {2, 3}
    assert {c.paper_scale for c in rec} == {"135M", "360M"}
    assert {c.model.scale for c in rec} == {"small", "medium"}  # distinct CPU scales
    assert len(grid.runs) == 16 + 2 + 4
    cluster = load_grid(REPO / "grids" / "table10.yaml", "cluster")
    assert {r.config.model.scale for r in cluster.runs} == {"135M", "360M"}
    assert not set(r.run_id for r in grid.runs) & set(r.run_id for r in cluster.runs)


ID_GRID = """
name: g
description: a grid
artifacts: [tables/table10]
runs:
  - name: vanilla
    label: Vanilla
    set: {model.variant: vanilla}
    axes: {model.scale: [135M]}
modes:
  local: {scale_map: {135M: tiny}, set: {train.tokens: 4096, eval.nll_tokens: 2048}}
reference:
  - {paper_scale: 135M, variant: vanilla, val_nll: 2.9}
"""


def _ids(tmp_path, text):
    runs = load_grid(_write(tmp_path, text), "local").runs
    return [(r.run_id, r.config.eval_hash) for r in runs]


def test_run_id_is_the_training_config_alone(tmp_path):
    (rid, eval_hash), = _ids(tmp_path, ID_GRID)
    assert _ids(tmp_path, ID_GRID) == [(rid, eval_hash)]  # stable across loads
    cosmetic = (ID_GRID.replace("label: Vanilla", "label: Vanilla 6L").replace("a grid", "edited")
                .replace("val_nll: 2.9", "val_nll: 3.1").replace("[tables/table10]", "[tables/table12]"))
    assert _ids(tmp_path, cosmetic) == [(rid, eval_hash)]
    (rid_e, eval_e), = _ids(tmp_path, ID_GRID.replace("eval.nll_tokens: 2048", "eval.nll_tokens: 1024"))
    assert rid_e == rid and eval_e != eval_hash  # same run, its eval re-runs
    for training_edit in ("train.tokens: 8192", "train.tokens: 4096, train.seed: 1", "train.tokens: 4096, train.lr: 0.001",
                          "train.tokens: 4096, data.val_tokens: 1000", "train.tokens: 4096, model.reduced: true, model.num_recursions: 2"):
        (rid_t, _), = _ids(tmp_path, ID_GRID.replace("train.tokens: 4096", training_edit))
        assert rid_t != rid, training_edit


def test_two_blocks_with_one_training_config_name_both_blocks(tmp_path):
    text = ID_GRID.replace("modes:", """  - name: vanilla-again
    label: the same model under another label
    set: {model.variant: vanilla, eval.batch: 4}
    axes: {model.scale: [135M]}
modes:""")
    with pytest.raises(GridError, match=r"g\.yaml, line \d+: runs\[1\] \(vanilla-again\) with model\.scale=135M: resolves to "
                                        r"the same training config .* as runs\[0\] \(vanilla\) with model\.scale=135M"):
        load_grid(_write(tmp_path, text), "local")


def test_duplicate_block_names_are_an_error(tmp_path):
    text = ID_GRID.replace("modes:", """  - name: vanilla
    set: {model.variant: vanilla, model.reduced: true, model.num_recursions: 2}
    axes: {model.scale: [135M]}
modes:""")
    with pytest.raises(GridError, match=r"g\.yaml, line \d+: runs\[1\]: block name 'vanilla' is already used by runs\[0\]"):
        load_grid(_write(tmp_path, text), "local")


def _write(tmp_path, text, name="g"):
    p = tmp_path / f"{name}.yaml"
    p.write_text(text)
    return p


BASE = """
name: g
runs:
  - axes: {model.scale: [135M]}
modes:
  local: {scale_map: {135M: tiny}, set: {train.tokens: 4096}}
"""


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda t: t.replace("runs:", "rnus:"), r"g\.yaml: key <top level>: .*'rnus' was unexpected.*allowed keys are \['artifacts', 'defaults'"),
        (lambda t: t + "bogus: 1\n", r"g\.yaml: .*'bogus' was unexpected"),
        (lambda t: t.replace("axes: {model.scale: [135M]}", "axes: {model.scale: [135M], model.tying: [zigzag]}"),
         r"g\.yaml, line 4: key model\.tying \(runs\[0\] \(block0\) axes\): runs\[0\].*model\.tying='zigzag' is not allowed; choose one of \['cycle', 'sequence', 'middle_cycle', 'middle_sequence'\]"),
        (lambda t: t.replace("train.tokens: 4096", "train.tokenz: 4096"), r"g\.yaml, line 6: key train\.tokenz \(modes\.local\.set\): train has no field 'tokenz' \(did you mean train\.tokens\?\)"),
        (lambda t: t.replace("{135M: tiny}", "{135M: huge}"), r"g\.yaml, line 6: key modes\.local\.scale_map\.135M: unknown scale 'huge'"),
        (lambda t: t.replace("[135M]", "[999M]"), r"g\.yaml, line 4: key model\.scale \(runs\[0\] \(block0\) axes\): .*model\.scale='999M' has no entry in the mode's scale_map"),
        (lambda t: t.replace("train.tokens: 4096", "train.tokens: 10"), r"g\.yaml, line 6: key train\.tokens \(modes\.local\.set\): .*less than one step"),
        (lambda t: t.replace("name: g", "name: other"), r"g\.yaml, line 2: key name: 'other' must equal the file name"),
        (lambda t: t + "  : [\n", r"g\.yaml, line \d+: not valid YAML"),
    ],
)
def test_bad_grids_fail_with_file_and_key(tmp_path, mutate, message):
    path = _write(tmp_path, mutate(BASE))
    with pytest.raises(GridError, match=message):
        load_grid(path, "local")


def test_impossible_shape_is_rejected_at_load(tmp_path):
    text = BASE.replace("axes: {model.scale: [135M]}",
                        "set: {model.variant: mor, model.num_recursions: 3, model.router.capacity: [1.0, 0.5]}\n    axes: {model.scale: [135M]}")
    with pytest.raises(GridError, match="capacity has 2 entries"):
        load_grid(_write(tmp_path, text), "local")


def test_missing_mode_is_named(tmp_path):
    with pytest.raises(GridError, match="no 'cluster' mode"):
        load_grid(_write(tmp_path, BASE), "cluster")


# Every grid error names the key as the user wrote it, its file and its line (issue 57, item 4).
TYPO_GRID = """name: g
defaults:
  model.variant: recursive
  data: {source: django-docs}
runs:
  - name: recursive
    label: "{model_tying}"
    set: {model.num_recursions: 2}
    axes:
      model.scale: [135M]
      model.tying: [cycle, middle_cycle]
modes:
  local:
    scale_map: {135M: tiny}
    set: {train.tokens: 4096, eval.nll_tokens: 2048}
"""


@pytest.mark.parametrize("old, new, key, layer", [
    ("model.tying: [cycle", "model.tyng: [cycle", "model.tyng", "runs[0] (recursive) axes"),  # axis key typo
    ("  model.variant: recursive\n", "  model.variant: recursive\n  train.lrr: 0.01\n", "train.lrr", "defaults"),
    ("data: {source: django-docs}", "data: {source: django-docs, tokenzer: bpe-4096}", "data.tokenzer", "defaults"),
    ("{model.num_recursions: 2}", "{model.num_recursions: 2, model.router.tpye: x}", "model.router.tpye",
     "runs[0] (recursive) set"),
    ("eval.nll_tokens: 2048", "eval.nll_tokns: 2048", "eval.nll_tokns", "modes.local.set"),
    ("model.tying: [cycle, middle_cycle]", "model.tying: [cycle, zigzag]", "model.tying", "runs[0] (recursive) axes"),
    ("  model.variant: recursive\n", "  model.variant: recursiv\n", "model.variant", "defaults"),
    ("{model.num_recursions: 2}", "{model.num_recursions: two}", "model.num_recursions", "runs[0] (recursive) set"),
])
def test_a_grid_error_names_the_written_key_its_file_and_line(tmp_path, old, new, key, layer):
    text = TYPO_GRID.replace(old, new)
    assert text != TYPO_GRID
    line = 1 + next(i for i, (a, b) in enumerate(zip(text.splitlines(), TYPO_GRID.splitlines())) if a != b)  # the edit
    with pytest.raises(GridError) as e:
        load_grid(_write(tmp_path, text), "local")
    msg = str(e.value)
    assert msg.startswith(f"{tmp_path / 'g.yaml'}, line {line}: key {key} ({layer}): "), msg
    assert "\n" not in msg and "unknown placeholder" not in msg and "runs[0] (recursive) with" not in msg.split(": ")[1]


def test_a_label_placeholder_typo_names_the_label_line_and_the_placeholders(tmp_path):
    text = TYPO_GRID.replace('"{model_tying}"', '"{model_tyng}"')
    with pytest.raises(GridError, match=r"g\.yaml, line 7: runs\[0\] \(recursive\) with .*: key label: placeholder "
                                        r"\{model_tyng\} names no axis of this block; its placeholders are "
                                        r"\['model_scale', 'model_tying'\]"):
        load_grid(_write(tmp_path, text), "local")
