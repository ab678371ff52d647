"""The repository's folders, named once for every test and helper (tests/ sits one level
below the repository root, its files two or three)."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SRC = REPO / "src"
TESTS = REPO / "tests"
