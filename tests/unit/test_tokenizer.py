"""Tests for the local byte-level BPE and the flat token arrays built from it."""
import sys

import numpy as np
import pytest

pytest.importorskip("tokenizers")

from mor.data.corpus import DOC_SEP  # noqa: E402
from mor.data.tokenizer import EOS, load_tokenizer, train_bpe  # noqa: E402
from mor.data.tokens import encode_corpus  # noqa: E402

DOCS = [
    "The quick brown fox jumps over the lazy dog.\n\nA second paragraph about foxes.",
    "Django is a high-level Python web framework that encourages rapid development.",
    "Unicode survives: café, naïve, 日本語, emoji 🙂 and tabs\tand  double  spaces.",
] * 20


@pytest.fixture()
def corpus_txt(tmp_path):
    p = tmp_path / "train.txt"
    p.write_text(DOC_SEP.join(DOCS) + "\n", encoding="utf-8")
    return p


def test_bpe_deterministic(corpus_txt, tmp_path):
    a = train_bpe(corpus_txt, 300, tmp_path / "a.json")
    b = train_bpe(corpus_txt, 300, tmp_path / "b.json")
    assert a.read_bytes() == b.read_bytes()
    assert not list(tmp_path.glob("*.tmp"))


def test_roundtrip_and_eos(corpus_txt, tmp_path):
    tok = load_tokenizer(train_bpe(corpus_txt, 300, tmp_path / "t.json"))
    assert tok.eos_id == 0 and tok.vocab_size == 300
    for text in DOCS[:3] + ["unseen words: zyzzyva Ωmega\n"]:
        ids = tok.encode(text)
        assert 0 not in ids and tok.decode(ids) == text
    assert tok.encode(EOS) == [0]
    assert len(tok.encode(DOCS[0])) < len(DOCS[0].encode("utf-8"))  # merges learned


def test_encode_corpus_dtype_and_eos(corpus_txt, tmp_path):
    tj = train_bpe(corpus_txt, 300, tmp_path / "t.json")
    n = encode_corpus(corpus_txt, tj, tmp_path / "out" / "train.npy")
    arr = np.load(tmp_path / "out" / "train.npy")
    assert arr.dtype == np.uint16 and arr.size == n
    tok = load_tokenizer(tj)
    eos = np.flatnonzero(arr == tok.eos_id)
    assert len(eos) == len(DOCS) and eos[-1] == n - 1
    starts = np.concatenate([[0], eos[:-1] + 1])
    for i, (s, e) in enumerate(zip(starts, eos)):
        assert tok.decode(arr[s:e].tolist()) == DOCS[i]


def test_hub_name_without_transformers(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # as if not installed: import raises
    with pytest.raises(ImportError, match="transformers"):
        load_tokenizer("HuggingFaceTB/SmolLM-135M")


def test_missing_json_path(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_tokenizer(tmp_path / "nope.json")
