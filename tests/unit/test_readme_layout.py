"""The README's Layout block names every module under ``src/``, so a reader finds a new file in
the manual's map; a failure names the module and the entry it belongs in.

How the block is read: below ``src/mor/`` each entry starts at a line indented two spaces and
runs over the lines indented deeper. An entry whose first word ends in ``/`` is a package: each
of its modules (``__init__`` aside) appears in it as a word (``step.py``, ``step`` or
``routers/step``); any other entry lists top-level modules as ``name.py``. A package of
``src/`` beside ``mor`` (the executor plugin) appears by its folder name.
"""

from __future__ import annotations

import re

from helpers.paths import REPO, SRC

README = REPO / "README.md"


def layout_block() -> str:
    """The fenced block under ``## Layout``."""
    text = README.read_text()
    start = text.index("## Layout")
    fence = text.index("```", start)
    return text[fence + 3: text.index("```", fence + 3)]


def entries(block: str) -> dict[str, str]:
    """``src/mor/`` entries: package name (``model/``) or ``""`` (top-level modules) -> their text."""
    lines = block.splitlines()
    top = next(i for i, line in enumerate(lines) if line.startswith("src/mor/"))
    out: dict[str, str] = {}
    key = None
    for line in lines[top + 1:]:
        if not line.startswith("  "):  # the next top-level folder of the repository
            break
        if not line.startswith("   "):  # a new entry
            first = line.split()[0]
            key = first if first.endswith("/") else ""
        out[key] = out.get(key, "") + "\n" + line
    return out


def _has(text: str, word: str) -> bool:
    return re.search(rf"(?<![\w/.]){re.escape(word)}(?![\w])", text) is not None


def missing(block: str) -> list[str]:
    found = entries(block)
    bad = []
    for path in sorted((SRC / "mor").rglob("*.py")):
        rel = path.relative_to(SRC / "mor")
        if rel.name == "__init__.py" and len(rel.parts) == 2:
            continue  # a package's own __init__: the package entry stands for it
        if len(rel.parts) == 1:
            if rel.name != "__init__.py" and not _has(found.get("", ""), rel.name):
                bad.append(f"src/mor/{rel}: add {rel.name} to a top-level entry under src/mor/")
            continue
        package = rel.parts[0] + "/"
        inner = "/".join((*rel.parts[1:-1], path.stem if rel.name != "__init__.py" else ""))
        text = found.get(package)
        if text is None:
            bad.append(f"src/mor/{rel}: the Layout has no {package} entry under src/mor/")
        elif not any(_has(text, w) for w in (inner, inner + ".py", rel.parts[-1] if len(rel.parts) == 2 else inner)):
            bad.append(f"src/mor/{rel}: add {inner or rel.parts[-2] + '/'} to the {package} entry")
    for pkg in sorted(p for p in SRC.iterdir() if p.is_dir() and p.name != "mor" and (p / "__init__.py").exists()):
        if not _has(block, f"src/{pkg.name}/"):
            bad.append(f"src/{pkg.name}/: add a src/{pkg.name}/ line to the Layout")
    return bad


def test_every_module_under_src_is_in_the_readme_layout():
    bad = missing(layout_block())
    assert not bad, "README.md's Layout block misses:\n" + "\n".join(bad)


def test_the_check_names_a_missing_module():
    block = layout_block()
    assert missing(block.replace("measure.py", "")) == ["src/mor/rehearsal/measure.py: add measure to the rehearsal/ entry"]
