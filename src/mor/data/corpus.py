"""Embedded default corpus for the CPU reproduction: Django's reST documentation.

Why: the local scales need real English expository text that every machine can
obtain reproducibly without the HF hub. The Django sdist is pinned on PyPI by
version and sha256, so ``pip download`` of it is the only network step. The docs
are cleaned to plain prose paragraphs by a small deterministic reST stripper and
split into train/val per *document* by a hash of the member name, so the split
never depends on file order, machine or Python version. The sha256 of the
resulting train.txt / val.txt is pinned below: a mismatch means either the
cleaning code or the source changed, and results would no longer be comparable.

CLI: ``python -m mor.data.corpus --out data/corpus --cache data/cache``
"""
from __future__ import annotations

import argparse
import hashlib
import json
import re
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from mor.atomic import sha256_file, write_bytes_atomic

PACKAGE = "Django"
VERSION = "5.2.8"
SDIST_NAME = "django-5.2.8.tar.gz"
SDIST_SIZE = 10_849_032
SDIST_SHA256 = "23254866a5bb9a2cfa6004e8b809ec6246eba4b58a7589bc2772f1bcc8456c7f"
DOCS_PREFIX = "django-5.2.8/docs/"
# Release notes are bullet-list changelogs, not prose; requirements.txt is pip input;
# _theme/ and _ext/ hold Sphinx theme/extension files (a font license), not docs.
EXCLUDE_PREFIXES = ("releases/", "requirements.txt", "_theme/", "_ext/")
# Paragraphs are separated by one blank line, documents by two, so that tokens.py
# can recover document boundaries (clean_rst output never contains "\n\n\n").
DOC_SEP = "\n\n\n"
# sha256 of the files build_corpus writes from the pinned sdist at VAL_FRACTION; other
# fractions have no recorded checksum and are built unverified.
VAL_FRACTION = 0.02
EXPECTED = {
    "train.txt": "9d6b47413074a4e53ce61454845d30b129dc96d30e016edb76edd77b4f0f574f",
    "val.txt": "38ca42f56fede83e6696bf52f5e630475effc87d08d41d1c7608eaabd96eb87c",
}


def fetch_sdist(cache_dir: Path) -> Path:
    """Return the verified pinned sdist in cache_dir, downloading it with pip if needed."""
    cache_dir = Path(cache_dir)
    path = cache_dir / SDIST_NAME
    if path.exists() and sha256_file(path) == SDIST_SHA256:
        return path
    cache_dir.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
           f"{PACKAGE}=={VERSION}", "-d", str(cache_dir)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0 or not path.exists():
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
        raise RuntimeError(f"pip download of {PACKAGE}=={VERSION} failed "
                           f"(rc={proc.returncode}): {' '.join(cmd)}\n{tail}")
    got = sha256_file(path)
    if got != SDIST_SHA256:
        raise RuntimeError(f"checksum mismatch for {path}: sha256 {got}, expected "
                           f"{SDIST_SHA256}; delete the file and retry")
    return path


# ----------------------------------------------------------------------------- reST
# Directives whose whole block (argument, options, indented body) is code or markup.
DROP_DIRECTIVES = {
    "code-block", "code", "sourcecode", "console", "highlight", "literalinclude",
    "parsed-literal", "toctree", "image", "figure", "index", "contents", "raw",
    "include", "table", "csv-table", "list-table", "math", "only", "ifconfig",
    "doctest", "testcode", "testoutput", "productionlist", "sectionauthor",
    "currentmodule", "default-role", "highlightlang", "tabularcolumns",
}
# Kept directives whose argument is prose (a title or the first body line).
PROSE_ARG_DIRECTIVES = {
    "admonition", "rubric", "note", "warning", "tip", "hint", "important",
    "caution", "attention", "danger", "error", "seealso", "topic", "sidebar",
}
_DIRECTIVE = re.compile(r"\.\.\s+([\w:.-]+)::(?:\s+(.*))?$")
_ADORNMENT = re.compile(r"""([!-/:-@\[-`{-~])\1{2,}$""")
_SIMPLE_TABLE = re.compile(r"=+( +=+)+$")
_OPTION = re.compile(r":[\w -]+:(\s|$)")
_BULLET = re.compile(r"([-*+\u2022]|#\.|\d+\.|\(\d+\)|\d+\))\s+")
_INLINE = re.compile(
    r"\\(.)"                                            # 1 escape
    r"|``(.+?)``"                                       # 2 inline literal
    r"|(?::([\w:.+-]+):)?`([^`]+)`(?:__?)?"             # 3,4 role / interpreted / link
    r"|\[(?:#[\w-]*|\*|\d+)\]_"                         # footnote reference
    r"|(?<![\w*])\*\*(?=\S)(.+?)(?<=\S)\*\*(?![\w*])"   # 5 strong
    r"|(?<![\w*])\*(?=[^\s*])(.+?)(?<=[^\s*])\*(?![\w*])"  # 6 emphasis
    r"|(?<![\w|])\|(\w[\w -]*)\|(?![\w|])",             # 7 substitution reference
    re.S)


def _role(role: str | None, body: str) -> str:
    m = re.match(r"(.*?)\s*<([^<>]*)>$", body, re.S)
    if m and m.group(1):
        return m.group(1)          # explicit title: :doc:`title </path>`, `text <url>`_
    if m:
        body = m.group(2)
    name = (role or "").split(":")[-1]
    if name in ("rfc", "pep"):
        return f"{name.upper()} {body}"
    body = body.lstrip("!")
    if body.startswith("~"):
        body = body[1:].rsplit(".", 1)[-1]
    return body


def _inline(m: re.Match) -> str:
    if m.group(1) is not None:
        return "" if m.group(1).isspace() else m.group(1)
    if m.group(2) is not None:
        return m.group(2)
    if m.group(4) is not None:
        return _role(m.group(3), m.group(4))
    for g in (5, 6, 7):
        if m.group(g) is not None:
            return m.group(g)
    return ""                       # footnote reference


def clean_rst(text: str) -> str:
    """Convert one reST document to plain prose paragraphs separated by blank lines.

    Line-based state machine: headings become their own paragraph, code/markup
    directives, literal blocks, comments, targets, tables and directive options
    are dropped with their indented bodies; admonition and API-description bodies
    are kept. Paragraphs break on blank lines, bullets and indentation changes;
    inline markup is then reduced to its display text and whitespace collapsed.
    """
    lines = text.replace("\r\n", "\n").replace("\r", "\n").expandtabs(8).split("\n")
    paras: list[str] = []
    cur: list[str] = []
    col = 0                 # text column of the current paragraph
    drop = None             # skip blank lines and lines indented more than this
    literal = None          # text column of a paragraph that ended with '::'
    options = None          # directive indent while its option lines may follow
    table = None            # "grid" / "simple" while inside a table

    def flush() -> None:
        if cur:
            paras.append(" ".join(cur))
            cur.clear()

    for i, raw in enumerate(lines):
        line = raw.rstrip()
        s = line.lstrip()
        ind = len(line) - len(s)
        if drop is not None:
            if not s or ind > drop:
                continue
            drop = None
        if table == "grid":
            if s[:1] in ("+", "|"):
                continue
            table = None
        if table == "simple":
            nxt = lines[i + 1].strip() if i + 1 < len(lines) else ""
            if _SIMPLE_TABLE.match(s) and not nxt:
                table = None
            continue
        if not s:
            flush()
            options = None
            continue
        if options is not None:
            if ind > options and _OPTION.match(s):
                continue
            options = None
        if literal is not None:
            lit, literal = literal, None
            if ind > lit:
                drop = lit
                continue
        if s.startswith(("+-", "+=")):
            flush(); table = "grid"; continue
        if _SIMPLE_TABLE.match(s):
            flush(); table = "simple"; continue
        if _ADORNMENT.match(s):
            flush(); continue
        if s == ".." or s.startswith((".. ", "..\t", "__ ")) or s == "__":
            flush()
            m = _DIRECTIVE.match(s)
            name = m.group(1).split(":")[-1].lower() if m else None
            if m is None or name in DROP_DIRECTIVES:
                drop = ind          # comment, target, substitution def, code directive
                continue
            if name in PROSE_ARG_DIRECTIVES and m.group(2):
                paras.append(m.group(2))
            options = ind
            continue
        if _OPTION.match(s) and not s.split(":", 2)[2].strip():
            continue                # bare field such as :orphan:
        b = _BULLET.match(s)
        if b:
            flush()
            s, col = s[b.end():], ind + b.end()
        elif cur and ind != col:
            flush()
        if not cur:
            col = col if b else ind
        if s.endswith("::"):
            literal = col
            s = s[:-2].rstrip() if (s == "::" or s.endswith(" ::")) else s[:-1]
        if s:
            cur.append(s)
    flush()

    out = []
    for p in paras:
        if p.startswith((">>>", "$ ", "{%", "{{")):
            continue
        p = " ".join(_INLINE.sub(_inline, p).split())
        if p:
            out.append(p)
    return "\n\n".join(out)


# --------------------------------------------------------------------------- build
def _atomic_write(path: Path, data: bytes) -> None:
    write_bytes_atomic(path, data)


def is_val(member_name: str, val_fraction: float) -> bool:
    """Deterministic per-document split: hash of the tar member name."""
    h = int(hashlib.sha256(member_name.encode("utf-8")).hexdigest(), 16)
    return h % 1000 < round(val_fraction * 1000)


def read_docs(sdist: Path, prefix: str = DOCS_PREFIX) -> list[tuple[str, str]]:
    """(member name, raw text) for every docs/**/*.txt in the tarball, sorted by name."""
    docs = []
    with tarfile.open(sdist, "r:gz") as tar:
        for m in tar.getmembers():
            rel = m.name[len(prefix):] if m.name.startswith(prefix) else None
            if not m.isfile() or rel is None or not rel.endswith(".txt"):
                continue
            if rel.startswith(EXCLUDE_PREFIXES):
                continue
            docs.append((m.name, tar.extractfile(m).read().decode("utf-8")))
    return sorted(docs)


def build_corpus(out_dir: Path, cache_dir: Path | None = None, val_fraction: float = VAL_FRACTION,
                 sdist: Path | None = None, prefix: str = DOCS_PREFIX,
                 expected: dict | None = EXPECTED, verify: bool = True) -> dict:
    """Write train.txt, val.txt and manifest.json to out_dir; return the manifest.

    ``sdist`` overrides the pinned download (tests pass a tiny tarball together
    with ``prefix`` and ``expected=None``). With ``verify`` and ``expected``, the
    output checksums must match the pinned ones (the default EXPECTED only applies
    at the pinned VAL_FRACTION); manifest["verified"] records whether they were checked.
    """
    if expected is EXPECTED and val_fraction != VAL_FRACTION:
        expected = None
    if sdist is None:
        if cache_dir is None:
            raise ValueError("build_corpus needs cache_dir or sdist")
        sdist = fetch_sdist(Path(cache_dir))
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    splits: dict[str, list[str]] = {"train": [], "val": []}
    for name, raw in read_docs(Path(sdist), prefix):
        text = clean_rst(raw)
        if text:
            splits["val" if is_val(name, val_fraction) else "train"].append(text)
    manifest = {"source": {"package": PACKAGE, "version": VERSION,
                           "sdist": Path(sdist).name, "sdist_sha256": sha256_file(Path(sdist))},
                "docs_prefix": prefix, "excluded": list(EXCLUDE_PREFIXES),
                "val_fraction": val_fraction, "splits": {}}
    blobs = {}
    for split, docs in splits.items():
        data = (DOC_SEP.join(docs) + "\n").encode("utf-8") if docs else b""
        fname = f"{split}.txt"
        blobs[fname] = data
        manifest["splits"][split] = {
            "file": fname, "documents": len(docs), "characters": len(data.decode("utf-8")),
            "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    if verify and expected:         # check before writing: never leave a wrong corpus on disk
        for info in manifest["splits"].values():
            want = expected.get(info["file"])
            if want and info["sha256"] != want:
                raise RuntimeError(
                    f"{info['file']} built from {Path(sdist).name} has sha256 {info['sha256']}, "
                    f"expected {want}: the reST cleaning code or the source sdist changed, so the "
                    "corpus is not the recorded one (use verify=False / --no-verify for development)")
    manifest["verified"] = bool(verify and expected)
    for fname, data in blobs.items():
        _atomic_write(out_dir / fname, data)
    _atomic_write(out_dir / "manifest.json",
                  (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode("utf-8"))
    return manifest


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("data/corpus"))
    ap.add_argument("--cache", type=Path, default=Path("data/cache"))
    ap.add_argument("--val-fraction", type=float, default=VAL_FRACTION)
    ap.add_argument("--no-verify", action="store_true", help="skip the pinned output checksums")
    args = ap.parse_args(argv)
    t0 = time.time()
    m = build_corpus(args.out, args.cache, args.val_fraction, verify=not args.no_verify)
    tr, va = m["splits"]["train"], m["splits"]["val"]
    print(f"corpus {PACKAGE}-{VERSION} -> {args.out}: train {tr['documents']} docs "
          f"{tr['characters']:,} chars sha256 {tr['sha256'][:12]} | val {va['documents']} docs "
          f"{va['characters']:,} chars sha256 {va['sha256'][:12]} | "
          f"{'verified' if m['verified'] else 'UNVERIFIED'} | {time.time() - t0:.1f}s")


if __name__ == "__main__":
    main()
