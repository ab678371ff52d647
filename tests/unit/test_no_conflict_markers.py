"""No tracked text file holds a merge's conflict markers: a README or a YAML grid with them
still parses as text, so nothing else would notice (one reached README's Layers paragraph)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MARKER = re.compile(r"^(<{7} |>{7} |={7}$)", re.M)
TEXT = (".py", ".md", ".yaml", ".yml", ".smk", ".toml", ".txt", ".sh", ".cfg", ".in")


def tracked_text_files() -> list[Path]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [ROOT / f for f in out.splitlines() if f.endswith(TEXT) or f in ("Snakefile", ".ci/run")]


def test_marker_pattern_sees_a_conflict():
    assert MARKER.search("a\n<<<<<<< HEAD\nb\n=======\nc\n>>>>>>> branch\n")
    assert not MARKER.search("a heading\n=======\n".replace("=======\n", "====\n"))


def test_no_tracked_file_holds_conflict_markers():
    files = tracked_text_files()
    assert len(files) > 100  # the listing worked
    bad = [f"{p.relative_to(ROOT)}:{p.read_text(errors='replace')[:m.start()].count(chr(10)) + 1}"
           for p in files if p.exists() for m in [MARKER.search(p.read_text(errors="replace"))] if m]
    assert not bad, "merge conflict markers in: " + ", ".join(bad)
