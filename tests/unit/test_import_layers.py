"""The layers of ``src/mor``, held against its imports (read with ``ast``; nothing is imported).

    model  ->  checkpoints  ->  data  ->  trained  ->  eval / engine / lm_eval / analysis / export_hf  ->  jobs
    model  ->  checkpoints  ->  data  ->  train  ->  launch  ->  cli
    eval / engine / lm_eval / train / jobs / launch  ->  rehearsal   (nothing imports it)

The network (``mor.model``) knows no checkpoint format; the formats (``mor.checkpoints``: our
own, HF, GGUF) sit on the network and import nothing above it. A job that only reads a trained
run opens it with ``mor.trained`` (the model layer builds it, ``mor.checkpoints`` reads its
weights) and never imports training.

Every import counts, at module level or inside a function, and so does the package
``__init__`` an import runs (``tests/helpers/import_graph.py`` builds the graph; run it to print it).
Each check fails naming the offending import, file and line.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from helpers.import_graph import SRC, find_cycle, graph, modules

DOMAIN = ("mor.model", "mor.data", "mor.train", "mor.eval", "mor.engine", "mor.lm_eval", "mor.analysis",
          "mor.metrics")
# what reports and claims must never reach
JOB_MODULES = ("mor.jobs", "mor.train", "mor.launch", "mor.cli", "mor.rehearsal")
# job functions of the domain packages: they run a model or fetch data
JOB_FILES = ("mor.eval.job", "mor.lm_eval.job", "mor.analysis.job", "mor.engine.job", "mor.data.fineweb")
# everything that reads a trained run without training it
READERS = ("mor.model", "mor.checkpoints", "mor.data", "mor.trained", "mor.eval", "mor.engine", "mor.lm_eval",
           "mor.analysis", "mor.export_hf", "mor.metrics")
# what the checkpoint formats may import: the network and the torch-free foundations below it
# mor.layout: the torch-free run-folder layout (it imports only mor), which the authors'
# checkpoint importer writes a run folder in
# mor.checkpoint_identity: a checkpoint folder's sha256 listing (torch-free; mor.atomic, mor.config), which
# the importer records as the run's provenance
BELOW_CHECKPOINTS = ("mor.checkpoints", "mor.model", "mor.config", "mor.capacity", "mor.identity", "mor.yaml_io",
                     "mor.atomic", "mor.errors", "mor.layout", "mor.checkpoint_identity")


def _under(mod: str, prefixes) -> bool:
    return any(mod == p or mod.startswith(p + ".") for p in prefixes)


def _offences(g, sources, forbidden) -> list[str]:
    known = modules()
    return [f"{mod} imports {target} ({known[mod].relative_to(SRC.parent)}:{line})"
            for mod, edges in sorted(g.items()) if _under(mod, sources)
            for target, line in sorted(edges.items()) if _under(target, forbidden)]


@pytest.fixture(scope="module")
def g():
    return graph()


def test_no_import_cycle(g):
    cycle = find_cycle(g)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_domain_packages_know_no_launcher(g):
    bad = _offences(g, DOMAIN, ("mor.launch", "mor.jobs", "mor.cli"))
    assert not bad, "a domain package imports the launcher layer:\n" + "\n".join(bad)


def test_readers_of_a_trained_run_import_no_training(g):
    bad = _offences(g, READERS, ("mor.train",))
    assert not bad, "a reader of trained runs imports training (open it with mor.trained):\n" + "\n".join(bad)


def test_the_network_knows_no_checkpoint_format(g):
    bad = _offences(g, ("mor.model",), ("mor.checkpoints",))
    assert not bad, "the network imports a checkpoint format (weights go through mor.checkpoints):\n" + "\n".join(bad)


def test_checkpoint_formats_sit_on_the_network(g):
    """``mor.checkpoints`` imports the network and the foundations, nothing above them (data, flops,
    training, jobs); its ``__init__`` imports nothing, so the Snakefile reads ``gguf.START_POINTS`` cheaply."""
    bad = [f"{mod} imports {target}" for mod, edges in sorted(g.items()) if _under(mod, ("mor.checkpoints",))
           for target in sorted(edges) if target != "mor" and not _under(target, BELOW_CHECKPOINTS)]
    assert not bad, "a checkpoint format imports above the network:\n" + "\n".join(bad)
    assert not g["mor.checkpoints"], sorted(g["mor.checkpoints"])
    assert [t for t in g["mor.checkpoints.gguf"] if t.startswith("mor.model")] == []  # no torch at parse time


def test_reports_and_claims_read_results_only(g):
    bad = _offences(g, ("mor.reports", "mor.claims"), (*JOB_MODULES, *JOB_FILES))
    assert not bad, "reports/claims reach a job, trainer or launcher module:\n" + "\n".join(bad)


def test_the_job_table_stays_light(g):
    """``mor.jobs`` names functions as strings: importing it pulls no domain package (and so no torch),
    only the torch-free run-folder layout its outputs are spelled in."""
    assert not [t for t in g["mor.jobs"] if t not in ("mor", "mor.layout")], sorted(g["mor.jobs"])
    assert not [t for t in g["mor.layout"] if t != "mor"], sorted(g["mor.layout"])


def test_nothing_imports_the_rehearsal(g):
    """``mor.rehearsal`` runs the job functions on fake tensors through their parameters (it
    reads the presets of ``mor.launch``): it sits on top, so a dry run never changes what a real
    job imports."""
    known = modules()
    bad = [f"{mod} imports {target} ({known[mod].relative_to(SRC.parent)}:{line})"
           for mod, edges in sorted(g.items()) if not _under(mod, ("mor.rehearsal",))
           for target, line in sorted(edges.items()) if _under(target, ("mor.rehearsal",))]
    assert not bad, "a module imports the rehearsal:\n" + "\n".join(bad)


PATCHING = "mor.rehearsal.fake"  # the one module of src/ that patches, and it patches torch only


def test_shipped_code_patches_none_of_our_packages():
    """The rehearsal replaces our jobs' collaborators through their parameters, never by patching
    them: only ``mor.rehearsal.fake`` imports ``unittest.mock``, and each patch it makes is of
    torch (what torch offers no parameter for)."""
    bad = []
    for mod, path in sorted(modules().items()):
        tree = ast.parse(path.read_text())
        mocks = [n.lineno for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
                 and ("unittest.mock" in [a.name for a in n.names] if isinstance(n, ast.Import)
                      else n.module in ("unittest", "unittest.mock"))]
        if mocks and mod != PATCHING:
            bad.append(f"{path.relative_to(SRC.parent)}:{mocks[0]} imports unittest.mock")
        for n in ast.walk(tree):
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.args and \
                    ast.unparse(n.func) in ("mock.patch", "mock.patch.object"):
                target = n.args[0].value if isinstance(n.args[0], ast.Constant) else ast.unparse(n.args[0])
                if not str(target).startswith("torch"):
                    bad.append(f"{path.relative_to(SRC.parent)}:{n.lineno} patches {target}")
    assert not bad, "shipped code patches (pass the collaborator as a parameter instead):\n" + "\n".join(bad)


# ---------------------------------------------------------------- the checker itself
def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        p = tmp_path / "src" / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return tmp_path / "src"


def test_checker_sees_function_level_imports_and_package_inits(tmp_path):
    """A cycle hidden in a function, and one that closes only through a package ``__init__``,
    are both found; sibling imports inside a package that re-exports them are not cycles."""
    src = _tree(tmp_path, {
        "p/__init__.py": "from p.a import A\n",
        "p/a.py": "A = 1\ndef f():\n    from p.b import B\n",
        "p/b.py": "from p.c import C\nB = 2\n",
        "p/c.py": "C = 3\n",
        "p/sub/__init__.py": "from p.sub.x import X\n",
        "p/sub/x.py": "X = 1\n",
        "p/sub/y.py": "from p.sub import X\n",  # needs p.sub's __init__, which does not need y: fine
    })
    g = graph(src, "p")
    assert find_cycle(g) is None
    assert g["p.a"]["p.b"] == 3  # the function-level import, with its line
    (src / "p" / "c.py").write_text("def g():\n    from p.a import A\n")  # p.a -> p.b -> p.c -> p.a
    cycle = find_cycle(graph(src, "p"))
    assert cycle is not None and set(cycle) == {"p.a", "p.b", "p.c"}
    (src / "p" / "c.py").write_text("C = 3\n")
    (src / "p" / "sub" / "x.py").write_text("import p.b\n")
    (src / "p" / "b.py").write_text("from p.sub.y import Y\n")  # p.b -> p.sub (__init__) -> p.sub.x -> p.b
    cycle = find_cycle(graph(src, "p"))
    assert cycle is not None and "p.sub" in cycle and "p.b" in cycle
