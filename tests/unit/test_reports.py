"""Reports are drawn from parquet alone: synthetic result rows in, tables and figures out."""


import pandas as pd
import pytest

from helpers.figures import errorbar_points, overlapping_texts, png_size, stamped_note
from helpers.tiny import _row
from mor.config import ModelConfig, RouterConfig, RunConfig, TrainConfig
from mor.reports import RENDERERS, render
from mor.reports.ablation import varying_axes
from mor.results import write_rows


def test_varying_axes_finds_only_what_changes():
    a = {"model": {"router": {"aux": "aux_loss", "alpha": 0.1}, "scale": "s"}, "grid": "g"}
    b = {"model": {"router": {"aux": "aux_router", "alpha": 0.1}, "scale": "t"}, "grid": "g"}
    assert varying_axes([a, b]) == ["model.router.aux"]


def test_table13_renders_router_metrics(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # artifacts are written relative to the working directory
    runs = [RunConfig(grid="table13", paper_scale="135M",
                      model=ModelConfig(scale="small", variant="mor", num_recursions=3, router=RouterConfig(aux=aux)))
            for aux in ("aux_router", "aux_loss")]
    write_rows(tmp_path / "r.parquet", [_row(runs[0], val_nll=5.1, dead_token_ratio=0.5, sampling_accuracy=0.99),
                                        _row(runs[1], val_nll=5.0, dead_token_ratio=0.0, sampling_accuracy=0.95)])
    grid = tmp_path / "table13.yaml"
    grid.write_text("reference: []\n")
    files = render("tables/table13", str(tmp_path / "r.parquet"), str(grid))
    assert [f.name for f in files] == ["table13.csv", "table13.html", "table13.md", "table13.tex"]
    csv = pd.read_csv(files[0])
    page = files[1].read_text()  # the report's view: every row of the csv, under the .md's title
    assert page.count("<tr") == len(csv) + 1 and "Table 13: expert-choice router designs" in page
    assert list(csv["aux"]) == ["aux_loss", "aux_router"]
    assert list(csv["Dead token ratio"]) == [0.0, 0.5]
    assert "Sampling acc" in files[1].read_text()
    # the paper's one Table 13 number that no row matches stands beside the largest aux-router ratio
    assert "reaches 66.7%; here the largest is 50.0%." in files[2].read_text()


def test_table10_puts_paper_numbers_beside_reproduced(tmp_path, monkeypatch, drawn_figures):
    monkeypatch.chdir(tmp_path)
    mk = lambda **kw: RunConfig(grid="table10", paper_scale="135M", model=ModelConfig(scale="small", **kw))  # noqa: E731
    runs = [mk(), mk(variant="vanilla", reduced=True, num_recursions=2),
            mk(variant="recursive", tying="cycle", num_recursions=2),
            mk(variant="recursive", tying="middle_cycle", num_recursions=2)]
    nll = [5.0, 5.4, 5.2, 5.1]
    write_rows(tmp_path / "r.parquet", [_row(r, val_nll=v) for r, v in zip(runs, nll)])
    grid = tmp_path / "table10.yaml"
    grid.write_text("reference:\n  - {paper_scale: 135M, variant: recursive, tying: cycle, num_recursions: 2, val_nll: 3.0071}\n")
    csv = pd.read_csv(render("tables/table10", str(tmp_path / "r.parquet"), str(grid))[0])
    assert list(csv["Model"]) == ["Vanilla", "Vanilla (reduced)", "Cycle", "Middle-Cycle"]
    assert csv.loc[csv["Model"] == "Cycle", "Paper NLL"].item() == 3.0071
    assert csv.loc[csv["Model"] == "Middle-Cycle", "dNLL vs reduced"].item() == pytest.approx(-0.3)
    files = render("figures/fig6", str(tmp_path / "r.parquet"), str(grid))
    assert {f.suffix for f in files} == {".png", ".pdf", ".csv"}
    # what the figure shows: one panel for the one scale, a point per recursive scheme at its NLL
    # (one seed: no error bar), a line per vanilla run at its NLL, the paper's number under the
    # scheme it belongs to (never over a line), the evidence level and seeds in the image
    [fig] = drawn_figures
    [ax] = fig.axes
    assert [t.get_text() for t in ax.get_xticklabels()] == ["Cycle", "Middle-Cycle"]
    assert {t.get_gid(): t.get_text() for t in ax.texts} == {"paper:Cycle": "paper\nNr=2: 3.007"}
    assert errorbar_points(ax) == {"Nr=2": [(0, pytest.approx(5.2), 0), (1, pytest.approx(5.1), 0)]}
    lines = {ln.get_label(): ln.get_ydata()[0] for ln in ax.get_lines() if not ln.get_label().startswith("_")}
    assert lines == pytest.approx({"Vanilla": 5.0, "Vanilla reduced Nr=2": 5.4})
    assert ax.get_ylabel() == "validation NLL (lower is better)" and ax.get_title() == "135M (run at small, mode local)"
    lo, hi = ax.get_ylim()
    assert lo < 5.0 and hi > 5.4  # every series inside the axes
    # one seed: the axis is at least 5 x the stated local seed spread (0.10) tall, so the Cycle /
    # Middle-Cycle gap of 0.1 (inside that spread) fills at most a fifth of it
    assert hi - lo >= 5 * 0.10 and 0.1 / (hi - lo) <= 0.2
    assert overlapping_texts(fig) == []
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert set(legend) == {"Nr=2", "Vanilla", "Vanilla reduced Nr=2"}
    note = stamped_note(fig)
    assert note == ("Evidence: not stated by the grid (grids/table10.yaml, mode local). n = 1 seed per point (seed 0); "
                    "no error bars; a local NLL's seed spread is 0.04-0.10 (docs/paper.md), more than most gaps shown.")
    png = next(f for f in files if f.suffix == ".png")
    w, h = fig.get_size_inches() * 150
    assert png_size(png) == pytest.approx((w, h), abs=1)  # the PNG is this figure at 150 dpi


def _legend_bars(fig) -> dict[str, bool]:
    """{legend label: whether its glyph draws an error bar} of a figure's legend (each entry is
    an HPacker of the glyph's DrawingArea and the label's TextArea; a bar is a LineCollection)."""
    from matplotlib.collections import LineCollection
    from matplotlib.offsetbox import DrawingArea, HPacker, TextArea

    fig.canvas.draw()
    out = {}
    for entry in fig.legends[0].findobj(HPacker):
        glyph, *label = entry.get_children()
        if isinstance(glyph, DrawingArea) and len(label) == 1 and isinstance(label[0], TextArea):
            out[label[0].get_text()] = any(isinstance(c, LineCollection) for c in glyph.get_children())
    return out


def test_fig6_puts_each_paper_number_on_its_own_scheme_without_overlap(tmp_path, monkeypatch, drawn_figures):
    """Issue 57: the 135M panel's paper numbers sat under the wrong scheme (Middle-Cycle's under
    Sequence) and overlapped. Four schemes x Nr 2, 3 at two scales, every cell with a paper
    number: each scheme's numbers are one text whose drawn box lies inside that scheme's slot
    (so on its own category, apart from the others), holding exactly its own numbers; no text
    overlaps another; one seed: no error bar in the plot and none in the legend."""
    monkeypatch.chdir(tmp_path)
    paper = {("135M", "cycle", 2): 3.0071, ("135M", "cycle", 3): 3.1154, ("135M", "sequence", 2): 3.0560,
             ("135M", "sequence", 3): 3.1400, ("135M", "middle_cycle", 2): 3.0330, ("135M", "middle_cycle", 3): 3.1048,
             ("135M", "middle_sequence", 2): 3.0450, ("135M", "middle_sequence", 3): 3.1200}
    paper.update({("360M", t, n): v - 0.3 for (_, t, n), v in list(paper.items())})
    rows, ref = [], []
    for i, ((scale, tying, nr), value) in enumerate(paper.items()):
        run = RunConfig(grid="table10", paper_scale=scale,
                        model=ModelConfig(scale="small" if scale == "135M" else "medium", variant="recursive",
                                          tying=tying, num_recursions=nr))
        rows.append(_row(run, val_nll=5.0 + 0.01 * i))
        ref.append(f"  - {{paper_scale: {scale}, variant: recursive, tying: {tying}, num_recursions: {nr}, val_nll: {value}}}")
    write_rows(tmp_path / "r.parquet", rows)
    grid = tmp_path / "table10.yaml"
    grid.write_text("reference:\n" + "\n".join(ref) + "\n")
    render("figures/fig6", str(tmp_path / "r.parquet"), str(grid))
    [fig] = drawn_figures
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    names = {"Cycle": "cycle", "Sequence": "sequence", "Middle-Cycle": "middle_cycle", "Middle-Sequence": "middle_sequence"}
    for ax, scale in zip(fig.axes, ("135M", "360M")):
        order = [t.get_text() for t in ax.get_xticklabels()]
        assert order == ["Cycle", "Sequence", "Middle-Cycle", "Middle-Sequence"]
        texts = {t.get_gid(): t for t in ax.texts if (t.get_gid() or "").startswith("paper:")}
        assert sorted(texts) == sorted(f"paper:{s}" for s in order)
        for i, scheme in enumerate(order):
            box = texts[f"paper:{scheme}"].get_window_extent(renderer)
            left, right = (ax.transData.transform((x, 0))[0] for x in (i - 0.5, i + 0.5))
            assert left <= box.x0 and box.x1 <= right, f"{scale} {scheme}: its paper numbers leave its slot"
            want = [f"Nr={n}: {paper[(scale, names[scheme], n)]:.3f}" for n in (2, 3)]
            assert texts[f"paper:{scheme}"].get_text().split("\n") == ["paper", *want]
            tick = ax.get_xticklabels()[i].get_window_extent(renderer)
            assert box.y1 <= tick.y0, f"{scale} {scheme}: its paper numbers are not under its name"
    # no paper text on another text or crossed by a line (the helper also reports stale y tick labels
    # left over from an earlier layout, outside the axes' view, which nobody sees: not this test's subject)
    assert [pair for pair in overlapping_texts(fig) if any(t.startswith("paper") for t in pair)] == []
    assert _legend_bars(fig) == {"Nr=2": False, "Nr=3": False}  # what is drawn: markers without bars


def test_fig6_legend_colour_of_an_nr_is_its_colour_in_every_panel(tmp_path, monkeypatch, drawn_figures):
    """The real local run drew 135M with Nr 3 alone in Nr 2's colour beside a 360M panel with both;
    the one legend entry per Nr must be the colour every panel draws it in."""
    from matplotlib.colors import to_hex

    monkeypatch.chdir(tmp_path)
    mk = lambda scale, local, nr: RunConfig(grid="table10", paper_scale=scale, model=ModelConfig(  # noqa: E731
        scale=local, variant="recursive", tying="cycle", num_recursions=nr))
    write_rows(tmp_path / "r.parquet", [_row(mk("135M", "small", 3), val_nll=5.0), _row(mk("360M", "medium", 2), val_nll=4.9),
                                        _row(mk("360M", "medium", 3), val_nll=4.8)])
    grid = tmp_path / "table10.yaml"
    grid.write_text("reference: []\n")
    render("figures/fig6", str(tmp_path / "r.parquet"), str(grid))
    [fig] = drawn_figures
    drawn = {}
    for ax in fig.axes:
        for c in ax.containers:
            drawn.setdefault(c.get_label(), set()).add(to_hex(c.lines[0].get_color()))
    assert all(len(colours) == 1 for colours in drawn.values()) and drawn["Nr=2"] != drawn["Nr=3"], drawn
    legend = {t.get_text(): to_hex(h.get_color()) for t, h in zip(fig.legends[0].get_texts(), fig.legends[0].legend_handles)}
    assert legend == {k: next(iter(v)) for k, v in drawn.items()}
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["Nr=2", "Nr=3"]


def test_fig6_axis_does_not_magnify_a_gap_inside_the_seed_spread(tmp_path, monkeypatch, drawn_figures):
    """Two seeds per scheme, means 0.02 apart with an sd of ~0.05: the y-axis spans at least
    SPAN_PER_SPREAD sds (the gap fills under a fifth of it), each point has a ±1 sd bar, and the
    image says n = 2 and the grid's evidence level."""
    from mor.reports.common import SPAN_PER_SPREAD

    monkeypatch.chdir(tmp_path)
    mk = lambda seed, **kw: RunConfig(grid="table10", paper_scale="135M",  # noqa: E731
                                      model=ModelConfig(scale="small", variant="recursive", num_recursions=2, **kw),
                                      train=TrainConfig(seed=seed))
    rows = [_row(mk(s, tying=t), val_nll=v, seed=s) for t, vs in (("cycle", (5.50, 5.58)), ("middle_cycle", (5.52, 5.60)))
            for s, v in zip((0, 1), vs)]
    write_rows(tmp_path / "r.parquet", rows)
    grid = tmp_path / "table10.yaml"
    grid.write_text("modes:\n  local: {evidence: demonstration}\nreference: []\n")
    render("figures/fig6", str(tmp_path / "r.parquet"), str(grid))
    [fig] = drawn_figures
    [ax] = fig.axes
    sd = (0.08 ** 2 / 2) ** 0.5  # two seeds 0.08 apart
    points = errorbar_points(ax)["Nr=2"]
    assert [(y, e) for _, y, e in points] == [(pytest.approx(5.54), pytest.approx(sd)), (pytest.approx(5.56), pytest.approx(sd))]
    lo, hi = ax.get_ylim()
    assert hi - lo >= SPAN_PER_SPREAD * sd and (5.56 - 5.54) / (hi - lo) < 1 / SPAN_PER_SPREAD
    assert _legend_bars(fig) == {"Nr=2": True}  # two seeds: bars drawn, and in the legend's glyph
    note = stamped_note(fig)
    assert note.startswith("Evidence: demonstration (grids/table10.yaml, mode local). n = 2 seeds per point (seeds 0, 1); "
                           "error bars: ±1 sd over seeds.")


def test_every_grid_artifact_has_a_renderer():
    from mor.grids import all_grids, load_grid

    for path in all_grids():
        for artifact in load_grid(path, "local").artifacts:
            assert artifact in RENDERERS, f"{path}: no renderer for {artifact}"


def test_every_renderer_resolves_and_the_ablation_names_match_their_specs():
    from mor.reports import ABLATIONS, renderer
    from mor.reports.ablation import SPECS

    assert set(ABLATIONS) == set(SPECS)
    for artifact in RENDERERS:
        assert callable(renderer(artifact)), artifact
    assert renderer("tables/table13").args[0] is SPECS["table13"]  # the spec of that name, not another
    with pytest.raises(KeyError, match="no renderer for 'tables/nope'"):
        renderer("tables/nope")


def test_the_workflow_imports_no_plotting_library_for_captions():
    """Every Snakemake parse imports the report's captions and landing page (rules/report.smk);
    the figure modules (matplotlib, seaborn, scipy) load only when a figure is drawn."""
    import subprocess
    import sys

    code = ("import sys, mor.reports.captions, mor.reports.landing; "
            "print(sorted(m for m in ('matplotlib', 'seaborn', 'scipy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_accuracy_columns_show_each_task_and_the_average_with_stderr(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    mk = lambda **kw: RunConfig(grid="table15", paper_scale="135M", model=ModelConfig(scale="small", **kw))  # noqa: E731
    runs = [mk(variant="vanilla"), mk(variant="mor", tying="cycle", num_recursions=2)]
    acc = {"mor_piqa": 0.55, "mor_lambada": 0.0, "mor_arc_easy": 0.3}
    se = {"mor_piqa": 0.05, "mor_lambada": 0.0, "mor_arc_easy": 0.046}
    write_rows(tmp_path / "r.parquet", [
        _row(runs[0], val_nll=5.0, val_nll_causal=5.0, accuracy=acc, accuracy_stderr=se, avg_accuracy=0.2833,
             avg_accuracy_stderr=0.0227, accuracy_topk=acc, accuracy_topk_stderr=se, avg_accuracy_topk=0.2833,
             avg_accuracy_topk_stderr=0.0227),
        _row(runs[1], val_nll=5.1, val_nll_causal=5.3)])  # no lm-eval: blank accuracy cells
    grid = tmp_path / "table15.yaml"
    grid.write_text("reference: []\n")
    csv_file, _, md_file, _ = render("tables/table15", str(tmp_path / "r.parquet"), str(grid))
    csv = pd.read_csv(csv_file)
    cols = list(csv.columns)
    assert cols.index("LAMBADA (causal)") < cols.index("PIQA (causal)") < cols.index("ARC-e (causal)")  # the paper's order
    van = csv[csv["variant"] == "vanilla"].iloc[0]
    assert van["PIQA (causal)"] == 0.55 and van["PIQA (causal) stderr"] == 0.05 and van["Avg acc (causal)"] == 0.2833
    assert sorted(csv["NLL (causal)"]) == [5.0, 5.3] and sorted(csv["NLL (top-k, sees future)"]) == [5.0, 5.1]
    md = md_file.read_text()
    assert "0.550 ± 0.050" in md and "0.283 ± 0.023" in md and "stderr" not in md.split("\n\n")[-1].split("\n")[0]
    # each column says its direction and n says what it counts; LAMBADA, 0 in every row, is explained
    header = [c.strip() for c in md.split("\n\n")[-1].split("\n")[0].strip("|").split("|")]
    assert {"NLL (top-k, sees future) ↓", "NLL (causal) ↓", "Avg acc (causal) ↑", "Avg acc (top-k, sees future) ↑",
            "LAMBADA (causal) ↑", "PIQA (top-k, sees future) ↑", "n (seeds)"} <= set(header), header
    assert "LAMBADA reads 0.000 ± 0.000 in every row" in md and "PIQA reads" not in md
    html = next(f for f in md_file.parent.iterdir() if f.suffix == ".html").read_text()
    assert "<th>NLL (causal) ↓</th>" in html and "<th>n (seeds)</th>" in html  # the report's view says them too


def test_tables_with_paper_numbers_show_both_protocols_the_paper_beside_the_authors(tmp_path, monkeypatch):
    """Table 10 and an ablation table: NLL and accuracy under the authors' protocol (labelled as
    seeing future tokens) and the causal one, each 'Paper' column right after the authors'
    protocol, and the note says which is which."""
    monkeypatch.chdir(tmp_path)
    mk = lambda grid, **kw: RunConfig(grid=grid, paper_scale="135M", model=ModelConfig(scale="small", **kw))  # noqa: E731
    for grid_name, artifact in (("table10", "tables/table10"), ("table15", "tables/table15")):
        runs = [mk(grid_name), mk(grid_name, variant="mor", tying="cycle", num_recursions=2)]
        write_rows(tmp_path / "r.parquet", [
            _row(runs[0], val_nll=5.0, val_nll_causal=5.0, accuracy={"mor_piqa": 0.5}, avg_accuracy=0.5,
                 accuracy_topk={"mor_piqa": 0.5}, avg_accuracy_topk=0.5),
            _row(runs[1], val_nll=5.1, val_nll_causal=5.3, accuracy={"mor_piqa": 0.52}, avg_accuracy=0.52,
                 accuracy_topk={"mor_piqa": 0.61}, avg_accuracy_topk=0.61)])
        grid = tmp_path / f"{grid_name}.yaml"
        grid.write_text("reference:\n  - {paper_scale: 135M, variant: mor, tying: cycle, num_recursions: 2, "
                        "val_nll: 2.9, avg_accuracy: 0.43}\n")
        csv_file, _, md_file, _ = render(artifact, str(tmp_path / "r.parquet"), str(grid))
        csv = pd.read_csv(csv_file)
        cols = list(csv.columns)
        top, causal = "NLL (top-k, sees future)", "NLL (causal)"
        assert cols.index(top) < cols.index("Paper NLL") < cols.index(causal), cols
        assert cols.index("Avg acc (top-k, sees future)") < cols.index("Paper Avg acc") < cols.index("Avg acc (causal)")
        mor = csv[csv["Paper NLL"].notna()].iloc[0]
        assert (mor[top], mor[causal], mor["Paper NLL"]) == (5.1, 5.3, 2.9)
        assert (mor["PIQA (top-k, sees future)"], mor["PIQA (causal)"], mor["Paper Avg acc"]) == (0.61, 0.52, 0.43)
        md = md_file.read_text()
        assert "'(top-k, sees future)': the authors' protocol" in md and "each 'Paper' column stands beside it" in md


def test_caption_states_claims_verdicts_runs_and_evidence(tmp_path):
    """A report caption names each claim resting on the artifact's grid with its verdict from
    claims.csv, the run and seed counts, and the grid's evidence note read from the
    configured grids folder (not ./grids)."""
    from mor.claims import CLAIMS
    from mor.reports.captions import Captions

    run = RunConfig(grid="table13", paper_scale="135M", model=ModelConfig(scale="small"))
    (tmp_path / "results").mkdir()
    write_rows(tmp_path / "results" / "table13.parquet", [_row(run, val_nll=5.0)])
    grids = tmp_path / "elsewhere"
    grids.mkdir()
    (grids / "table13.yaml").write_text("modes:\n  local: {seeds: 2, evidence: deciding}\n")
    mine = [c.id for c in CLAIMS if "table13" in c.grids]
    assert mine  # aux-router-dead-tokens
    (tmp_path / "tables" / "claims").mkdir(parents=True)
    pd.DataFrame({"claim": [c.id for c in CLAIMS], "verdict": "inconclusive", "n seeds": 1}).to_csv(
        tmp_path / "tables" / "claims" / "claims.csv", index=False)
    text = Captions({"tables/table13": "table13"}, root=tmp_path, grids_dir=grids).caption("tables/table13")
    assert text.count("Local verdict: **inconclusive (n = 1 seeds)**") == len(mine)
    assert "1 runs, seeds [0]" in text and "Evidence: deciding." in text and "(2)" in text


def _note(md_text: str) -> str:
    """A table .md's note: the paragraph after its title."""
    return md_text.split("\n\n")[1]


def test_every_table_note_opens_with_its_evidence_level(tmp_path, monkeypatch):
    """Issue 57: Table 10's evidence level was the last sentence of a ~290-word note. Table 10,
    two ablation tables now open with it, also where the grid's mode states none."""
    monkeypatch.chdir(tmp_path)
    mk = lambda grid, **kw: RunConfig(grid=grid, paper_scale="135M", model=ModelConfig(scale="small", **kw))  # noqa: E731
    for grid_name, evidence in (("table10", "demonstration"), ("table15", "demonstration"), ("table11", None)):
        write_rows(tmp_path / "r.parquet", [_row(mk(grid_name), val_nll=5.0),
                                            _row(mk(grid_name, variant="recursive", tying="cycle", num_recursions=2), val_nll=5.1)])
        grid = tmp_path / f"{grid_name}.yaml"
        grid.write_text(("modes:\n  local: {evidence: demonstration}\n" if evidence else "") + "reference: []\n")
        md = next(f for f in render(f"tables/{grid_name}", str(tmp_path / "r.parquet"), str(grid)) if f.name == f"{grid_name}.md")
        first = _note(md.read_text()).split(". ")[0]
        want = "Evidence: demonstration" if evidence else f"Evidence: not stated by the grid (grids/{grid_name}.yaml, mode local)"
        assert first == want, (grid_name, first)


def test_table10_marks_a_dnll_inside_the_seed_spread(tmp_path, monkeypatch):
    """Issue 57: 'dNLL vs reduced' was 4 bare decimals. Two seeds per row (sd ~0.07): Middle-Cycle
    0.03 under the reduced Vanilla is inside the spread (marked), Cycle 0.5 under it is not; the
    csv keeps the number and says which; one seed in mode local reads against the stated 0.10."""
    from mor.reports.common import SPREAD_MARK

    monkeypatch.chdir(tmp_path)
    mk = lambda seed, **kw: RunConfig(grid="table10", paper_scale="135M", train=TrainConfig(seed=seed),  # noqa: E731
                                      model=ModelConfig(scale="small", num_recursions=2, **kw))
    nll = {"reduced": (5.40, 5.50), "cycle": (4.90, 5.00), "middle_cycle": (5.35, 5.49)}
    rows = []
    for name, values in nll.items():
        kw = dict(variant="vanilla", reduced=True) if name == "reduced" else dict(variant="recursive", tying=name)
        rows += [_row(mk(s, **kw), val_nll=v, seed=s) for s, v in zip((0, 1), values)]
    write_rows(tmp_path / "r.parquet", rows)
    grid = tmp_path / "table10.yaml"
    grid.write_text("reference: []\n")
    csv_file, _, md_file, _ = render("tables/table10", str(tmp_path / "r.parquet"), str(grid))
    csv = pd.read_csv(csv_file).set_index("Model")
    assert csv.loc["Middle-Cycle", "dNLL vs reduced"] == pytest.approx(-0.03)
    assert bool(csv.loc["Middle-Cycle", "dNLL inside seed spread"]) and not bool(csv.loc["Cycle", "dNLL inside seed spread"])
    md = md_file.read_text()
    rows_md = {line.split("|")[4].strip(): line for line in md.splitlines() if line.startswith("| 135M")}
    assert f"-0.030 {SPREAD_MARK}" in rows_md["Middle-Cycle"] and "-0.500" in rows_md["Cycle"]
    assert SPREAD_MARK not in rows_md["Cycle"]
    assert f"-0.500 {SPREAD_MARK}" not in md and "-0.0300" not in md
    assert f"'{SPREAD_MARK}' after a 'dNLL vs reduced': the difference is inside the seed spread" in md
    # one seed, mode local: the stated local spread (0.10) decides
    write_rows(tmp_path / "r.parquet", [r for r in rows if r["seed"] == 0])
    csv = pd.read_csv(render("tables/table10", str(tmp_path / "r.parquet"), str(grid))[0]).set_index("Model")
    assert bool(csv.loc["Middle-Cycle", "dNLL inside seed spread"]) and not bool(csv.loc["Cycle", "dNLL inside seed spread"])
