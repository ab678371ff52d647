"""Tokenizers: a small byte-level BPE trained locally, or a hub tokenizer on the cluster.

Why: the CPU scales cannot afford (or download) the 49k-vocab SmolLM tokenizer, so
they train a byte-level BPE of a few thousand merges on the train split only
(no val leakage). HuggingFace ``tokenizers`` BPE training has no randomness, so the
JSON is a pure function of (train text, vocab size) -- the tests check this.
``load_tokenizer`` hides which kind is used behind one tiny interface.

CLI: ``python -m mor.data.tokenizer --train data/corpus/train.txt --vocab-size 4096
--out data/tokenizer/bpe-4096.json``
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

from mor.atomic import write_text_atomic

EOS = "<|endoftext|>"


def _build(vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=[EOS], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet())  # all 256 bytes: no UNK ever
    return tok, trainer


def train_bpe(train_txt: Path, vocab_size: int, out_json: Path) -> Path:
    """Train a byte-level BPE (``<|endoftext|>`` = id 0) on train_txt; save JSON atomically."""
    tok, trainer = _build(vocab_size)
    tok.train([str(train_txt)], trainer)
    if tok.token_to_id(EOS) != 0:
        raise RuntimeError(f"{EOS} did not get id 0")
    out_json = Path(out_json)
    out_json.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out_json, tok.to_str(pretty=True))
    return out_json


class TokenizerWrapper:
    """Uniform view of a ``tokenizers.Tokenizer`` or a ``transformers`` tokenizer."""

    def __init__(self, tok, kind: str):
        self._tok, self.kind = tok, kind
        if kind == "json":
            self.vocab_size = tok.get_vocab_size()
            self.eos_id = tok.token_to_id(EOS)
        else:
            self.vocab_size = len(tok)
            self.eos_id = tok.eos_token_id

    def encode(self, text: str) -> list[int]:
        if self.kind == "json":
            return self._tok.encode(text, add_special_tokens=False).ids
        return self._tok.encode(text, add_special_tokens=False)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        if self.kind == "json":
            return [e.ids for e in self._tok.encode_batch(texts, add_special_tokens=False)]
        # one call of the fast (Rust) backend for the whole batch, same ids as encode()
        return list(self._tok(list(texts), add_special_tokens=False)["input_ids"])

    def decode(self, ids: list[int]) -> str:
        if self.kind == "json":
            return self._tok.decode(list(ids), skip_special_tokens=False)
        return self._tok.decode(list(ids))


def load_tokenizer(spec: str | Path) -> TokenizerWrapper:
    """Load a tokenizer.json path (CPU scales), or a HF hub name or a local folder laid out as the
    hub's (cluster, needs transformers)."""
    path = Path(spec)
    if path.suffix == ".json" or path.is_file():
        from tokenizers import Tokenizer

        if not path.is_file():
            raise FileNotFoundError(f"tokenizer file not found: {path}")
        return TokenizerWrapper(Tokenizer.from_file(str(path)), "json")
    try:
        from transformers import AutoTokenizer
    except ImportError as e:
        raise ImportError(
            f"loading hub tokenizer {spec!r} needs the 'transformers' package (cluster "
            "environment); CPU scales should pass a local tokenizer .json instead") from e
    return TokenizerWrapper(AutoTokenizer.from_pretrained(str(spec)), "hf")


def vocab_size(paths) -> int:
    """The vocabulary a model's embedding needs for the data at ``paths`` (``mor.data.paths.DataPaths``),
    with no hub call, so a GPU job never loads a tokenizer just for its size:

    - a local tokenizer file (the CPU scales' BPE): the file's own size;
    - a hub tokenizer (the cluster's SmolLM): the size the data job recorded in the prepared
      corpus's manifest, i.e. of the tokenizer that made the tokens the run reads.
    """
    if str(paths.tokenizer).endswith(".json"):
        return load_tokenizer(paths.tokenizer).vocab_size
    from mor.data.shards import read_manifest

    manifest = read_manifest(Path(paths.train_tokens))
    recorded = manifest.get("tokenizer", {})
    if recorded.get("name") != str(paths.tokenizer) or not recorded.get("vocab_size"):
        raise ValueError(f"token manifest {paths.train_tokens} records tokenizer {recorded!r}, not "
                         f"{paths.tokenizer!r} with a vocabulary size; run the data rule again for this tokenizer")
    return int(recorded["vocab_size"])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="train a byte-level BPE on the corpus train split")
    ap.add_argument("--train", type=Path, required=True)
    ap.add_argument("--vocab-size", type=int, required=True)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    t0 = time.time()
    train_bpe(args.train, args.vocab_size, args.out)
    tok = load_tokenizer(args.out)
    print(f"bpe vocab {tok.vocab_size} eos_id {tok.eos_id} -> {args.out} "
          f"({time.time() - t0:.1f}s)")


if __name__ == "__main__":
    main()
