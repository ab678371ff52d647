"""Tests for the embedded Django-docs corpus: reST cleaning and the deterministic split."""
import io
import json
import tarfile

import pytest

from mor.data import corpus
from mor.data.corpus import build_corpus, clean_rst, is_val


def test_roles_and_inline_markup():
    src = ("See :doc:`the tutorial </intro/tutorial01>` and :class:`~django.db.models.Model`,\n"
           ":setting:`DEBUG`, ``QuerySet.filter()``, `Python <https://python.org>`_, `docs`_,\n"
           "*emphasis*, **strong**, :rfc:`7231`, a footnote [#]_ and ``*args, **kwargs``.\n")
    assert clean_rst(src) == (
        "See the tutorial and Model, DEBUG, QuerySet.filter(), Python, docs, emphasis, "
        "strong, RFC 7231, a footnote and *args, **kwargs.")


def test_headings_targets_comments_and_code_dropped():
    src = """.. _intro:

=====
Title
=====

Some *intro* text
over two lines.

.. code-block:: python

    def f():
        return 1

Section
-------

.. Just a comment
   spanning lines.

.. |sub| replace:: substituted

After the comment.

.. toctree::
   :maxdepth: 2

   intro/index
"""
    assert clean_rst(src) == (
        "Title\n\nSome intro text over two lines.\n\nSection\n\nAfter the comment.")


def test_literal_blocks_and_admonitions():
    src = """For example::

    >>> x = 1

Expanded form ::

    code

.. note::

    Keep this ``note`` body.

    .. code-block:: console

        $ python -m pip install django

    And this.

.. admonition:: A title

    Body text.

.. method:: QuerySet.filter(**kwargs)

    :noindex:

    Returns a new ``QuerySet``.

.. versionchanged:: 5.1

    Changed behavior.
"""
    assert clean_rst(src).split("\n\n") == [
        "For example:", "Expanded form", "Keep this note body.", "And this.",
        "A title", "Body text.", "Returns a new QuerySet.", "Changed behavior."]


def test_lists_and_tables():
    src = """* first item
  continues here
* second item

#. numbered

=====  =====
A      B
=====  =====
x      y
=====  =====

+-----+-----+
| a   | b   |
+-----+-----+

term
    Definition text.
"""
    assert clean_rst(src).split("\n\n") == [
        "first item continues here", "second item", "numbered", "term", "Definition text."]


def test_clean_rst_is_pure():
    src = "Hello\n=====\n\nWorld ``x``.\n"
    assert clean_rst(src) == clean_rst(src) == "Hello\n\nWorld x."


def _make_sdist(path, docs):
    with tarfile.open(path, "w:gz") as tar:
        for name, text in sorted(docs.items()):
            data = text.encode("utf-8")
            info = tarfile.TarInfo(f"pkg-1.0/docs/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def test_build_corpus_deterministic_split(tmp_path):
    names = [f"topics/doc{i:02d}.txt" for i in range(40)]
    docs = {n: f"Doc {i}\n=====\n\nParagraph one of {n}.\n\nParagraph two.\n"
            for i, n in enumerate(names)}
    docs["releases/1.0.txt"] = "Release notes\n=============\n\n* changelog\n"
    docs["topics/code.py"] = "print('not a doc')\n"
    sdist = tmp_path / "pkg-1.0.tar.gz"
    _make_sdist(sdist, docs)
    m1 = build_corpus(tmp_path / "a", sdist=sdist, prefix="pkg-1.0/docs/",
                      val_fraction=0.25, expected=None)
    build_corpus(tmp_path / "b", sdist=sdist, prefix="pkg-1.0/docs/",
                      val_fraction=0.25, expected=None)
    for f in ("train.txt", "val.txt", "manifest.json"):
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes()
    val = [n for n in names if is_val(f"pkg-1.0/docs/{n}", 0.25)]
    assert 0 < len(val) < len(names)
    assert m1["splits"]["val"]["documents"] == len(val)
    assert m1["splits"]["train"]["documents"] == len(names) - len(val)
    train_txt = (tmp_path / "a" / "train.txt").read_text(encoding="utf-8")
    val_txt = (tmp_path / "a" / "val.txt").read_text(encoding="utf-8")
    assert "changelog" not in train_txt + val_txt and "not a doc" not in train_txt
    for n in val:
        assert n in val_txt and n not in train_txt
    assert train_txt.count(corpus.DOC_SEP) == len(names) - len(val) - 1
    man = json.loads((tmp_path / "a" / "manifest.json").read_text())
    assert man == m1 and man["source"]["sdist_sha256"] == corpus.sha256_file(sdist)
    assert man["verified"] is False
    assert man["splits"]["train"]["bytes"] == len(train_txt.encode("utf-8"))
    assert not any(p.name.endswith(".tmp") for p in (tmp_path / "a").iterdir())


def test_build_corpus_checksum_mismatch(tmp_path):
    sdist = tmp_path / "pkg-1.0.tar.gz"
    _make_sdist(sdist, {"a.txt": "Some text.\n"})
    with pytest.raises(RuntimeError, match="cleaning code or the source"):
        build_corpus(tmp_path / "out", sdist=sdist, prefix="pkg-1.0/docs/",
                     expected={"train.txt": "0" * 64})
    assert not (tmp_path / "out" / "train.txt").exists()
    build_corpus(tmp_path / "out", sdist=sdist, prefix="pkg-1.0/docs/",
                 expected={"train.txt": "0" * 64}, verify=False)


def test_fetch_sdist_checksum_error_names_file(tmp_path, monkeypatch):
    bad = tmp_path / corpus.SDIST_NAME
    bad.write_bytes(b"corrupt")

    class Done:
        returncode, stdout, stderr = 0, "", ""

    monkeypatch.setattr(corpus.subprocess, "run", lambda *a, **k: Done())
    with pytest.raises(RuntimeError, match=corpus.SDIST_NAME):
        corpus.fetch_sdist(tmp_path)


def test_real_corpus_matches_pinned_checksums(tmp_path, data_root):
    cache = data_root / "cache"  # the sdist the session fixture fetched with pip
    m = build_corpus(tmp_path / "corpus", cache)
    assert m["source"]["sdist_sha256"] == corpus.SDIST_SHA256
    for info in m["splits"].values():
        assert info["sha256"] == corpus.EXPECTED[info["file"]]
    assert m["verified"] is True
