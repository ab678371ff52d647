"""The lm-evaluation-harness model ``mor``: one of our runs, scored the way it decodes.

    lm_eval --model mor --model_args run_dir=runs/<run_id> ...     (via mor-lm-eval)
    lm_eval.simple_evaluate(model="mor", model_args={"run_dir": ...}, ...)

It loads ``<run_dir>/config.json`` (the resolved run config) and ``final/model.safetensors``,
and the run's tokenizer (``data/tokenizer/bpe-<vocab>.json`` locally, a hub name on the
cluster). Constructor kwargs (``--model_args`` and what the harness adds): ``run_dir``,
``data_root`` or ``tokenizer`` (where the tokenizer is when not under ./data), ``device``
(auto, cpu, cuda...), ``batch_size`` (an integer; 'auto' is refused), ``max_batch_size``, ``max_length``
(default: the run's ``train.seq_len``, the context it was trained on), ``threads``.

Two evaluation protocols (``protocol``), because the paper's accuracies and ours are
measured differently (issue 56, docs/accuracy.md):

- ``causal`` (the default): routing must not see the future. Expert-choice top-k picks each
  recursion's tokens over the whole sequence, so in ``model(x)`` the logits at position t
  depend on tokens after t. The harness compares continuations that share a context, so
  every score comes from the causal per-token decision that cached decoding uses
  (``full_forward_causal``: the aux router's or the aux-loss router's own logit > 0, see
  mor.model.decode).
- ``topk`` (the authors' protocol, SEES FUTURE TOKENS): the training forward ``model(x)``,
  expert-choice top-k over the whole right-padded request, as their evaluation ran it
  through lm-eval's HF model: requests sorted longest first, batched, right-padded with
  token id 0 (lm-eval's ``pad_and_concat``) and no attention mask, so the router also ranks
  the padding and each row's top-k capacity counts the padded length. What a row is scored
  with therefore depends on what it was batched with; the batch size is ours (the run's
  eval batch, at least 16): the paper does not state theirs. lm-eval's HF model also merges
  one-token continuations sharing a context into one row, which this adapter does not.

Vanilla and Recursive models have no router: their training forward is causal and used as
is, so the two protocols score them identically.

loglikelihood: lm-eval hands (context, continuation) token lists; the model reads
``(ctx + cont)[:-1]`` and the last ``len(cont)`` positions of its logits score ``cont`` (the
diagram is at ``MoRLM._loglikelihood_tokens``).

loglikelihood_rolling: the text is cut into disjoint windows of ``max_length`` predicted
tokens (the first conditioned on the end-of-text token), each window scored on its own
(lm-eval's ``get_rolling_token_windows`` with context 1, as its HF model does: the last,
shorter window still reads a full ``max_length`` tokens), and the log-probs summed.

generate_until: greedy, through the KV cache (``prefill`` + ``decode_step``), until a stop
string, the end-of-text token or ``max_gen_toks``.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from tqdm import tqdm

log = logging.getLogger(__name__)

DEFAULT_BATCH = 16
PROTOCOLS = ("causal", "topk")  # the module docstring says what each one scores
TOPK_PAD = 0  # lm-eval's HF model right-pads with zeros (lm_eval.models.utils_hf.pad_and_concat)


def _as_int(value: Any, name: str, default: int | None) -> int | None:
    if value is None or value == "":
        return default
    if isinstance(value, str) and value.startswith("auto"):
        # Refused, not quietly replaced: the adapter probes no memory, and under protocol=topk the
        # batch decides what each row is scored with, so a batch the user did not choose would
        # change the accuracies without a word (issue 60).
        raise ValueError(f"mor adapter: {name}={value!r} is not supported (no memory probing; under "
                         f"protocol=topk the batch changes the scores): pass an integer, e.g. "
                         f"{name}={default or DEFAULT_BATCH}")
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ValueError(f"mor adapter: {name} must be an integer, got {value!r}") from None


def _find_tokenizer(spec: str, data_root: str | None, run_dir: Path | None) -> str:
    """The run's tokenizer: a hub name as is, a local .json under the first data root that has it."""
    if not spec.endswith(".json"):
        return spec
    rel = Path(spec)
    name = Path("tokenizer") / rel.name
    roots = [Path(data_root)] if data_root else []
    roots += [Path("data")]
    if run_dir is not None and len(run_dir.resolve().parents) > 1:
        roots.append(run_dir.resolve().parents[1] / "data")  # runs/<id> -> <repo>/data
    from mor.lm_eval import REPO

    roots.append(REPO / "data")
    for root in roots:
        if (root / name).is_file():
            return str(root / name)
    raise FileNotFoundError(f"mor adapter: tokenizer {rel.name} not found under {[str(r) for r in roots]}; "
                            "pass model_args data_root=<folder holding tokenizer/> or tokenizer=<file.json>")


@dataclass(frozen=True)
class AdapterSeams:
    """What a dry run (``mor.rehearsal``, on fake tensors, without the hub or the run's weights)
    replaces when the adapter opens a run; the defaults are the real ones (None: the real one,
    imported where it is used), so lm-eval's own construction never passes this.

    load_tokenizer  (spec) -> tokenizer; None: ``mor.data.tokenizer.load_tokenizer``
    read_weights    (file, model) -> None; None: ``mor.trained.open_run``'s reader
    cuda_available  () -> bool: a requested 'cuda' device is there (else the CPU is used); None:
                    ``torch.cuda.is_available``
    """

    load_tokenizer: Callable | None = None
    read_weights: Callable | None = None
    cuda_available: Callable[[], bool] | None = None


@register_model("mor")
class MoRLM(TemplateLM):
    """A trained run (``run_dir``) or an in-memory model (``MoRLM.from_model``) for lm-eval."""

    def __init__(self, run_dir: str | None = None, data_root: str | None = None, tokenizer: str | None = None,
                 device: str | None = "auto", batch_size: int | str | None = DEFAULT_BATCH,
                 max_batch_size: int | str | None = None, max_length: int | str | None = None,
                 threads: int | str | None = None, protocol: str = "causal", seams: AdapterSeams | None = None,
                 **kwargs) -> None:
        super().__init__()
        seams = seams or AdapterSeams()
        if kwargs:
            log.info("mor adapter: ignoring harness kwargs %s", sorted(kwargs))
        if run_dir is None:
            raise ValueError("mor adapter: model_args needs run_dir=<runs/<run_id>> (a trained run)")
        from mor.config import run_config_from_dict
        from mor.data.paths import data_paths
        from mor.data.tokenizer import load_tokenizer
        from mor.model.build import pick_device
        from mor.trained import open_run

        if threads:
            torch.set_num_threads(int(threads))
        from mor.layout import RunPaths

        files = RunPaths.of(run_dir)
        if not files.config.is_file():
            raise FileNotFoundError(f"mor adapter: {files.config} missing: {run_dir} is not a finished run")
        meta = json.loads(files.config.read_text())
        run = run_config_from_dict(meta["config"])
        tok_spec = tokenizer or _find_tokenizer(data_paths(run.data, Path("data")).tokenizer, data_root, files.dir)
        tok = (seams.load_tokenizer or load_tokenizer)(tok_spec)
        dev = pick_device(device or "auto")
        cuda_available = seams.cuda_available or torch.cuda.is_available
        if dev.type == "cuda" and not cuda_available():  # lm-eval's CLI asks for cuda by default
            log.warning("mor adapter: device %s requested but CUDA is not available; running on the CPU", device)
            dev = torch.device("cpu")
        opened = open_run(files.dir, run, dev, vocab_size=meta.get("vocab_size") or tok.vocab_size,
                          read_weights=seams.read_weights)
        self._setup(opened.model, tok, dev, max_length or run.train.seq_len, batch_size, max_batch_size,
                    name=str(tok_spec), protocol=protocol)
        self.run = run

    @classmethod
    def from_model(cls, model, tokenizer, max_length: int, batch_size: int = DEFAULT_BATCH,
                   protocol: str = "causal") -> "MoRLM":
        """Wrap a model already in memory (tests; notebooks) with a mor TokenizerWrapper."""
        self = cls.__new__(cls)
        TemplateLM.__init__(self)
        self._setup(model, tokenizer, next(model.parameters()).device, max_length, batch_size, None, name="memory",
                    protocol=protocol)
        self.run = None
        return self

    def _setup(self, model, tok, device, max_length, batch_size, max_batch_size, name: str,
               protocol: str = "causal") -> None:
        if protocol not in PROTOCOLS:
            raise ValueError(f"mor adapter: protocol must be one of {PROTOCOLS}, got {protocol!r}")
        self.protocol = protocol
        self.model = model.eval()
        self.tok = tok
        self._device = device
        self._name = name
        hard = model.shape.max_seq_len
        self._max_length = min(int(max_length), hard)
        cap = _as_int(max_batch_size, "max_batch_size", None)
        self.batch_size = _as_int(batch_size, "batch_size", DEFAULT_BATCH)
        if cap:
            self.batch_size = min(self.batch_size, cap)
        if self.tok.eos_id is None:
            raise ValueError("mor adapter: the tokenizer has no end-of-text token")

    # ------------------------------------------------------------------ tokens
    @property
    def eot_token_id(self) -> int:
        return self.tok.eos_id

    @property
    def max_length(self) -> int:
        return self._max_length

    @property
    def tokenizer_name(self) -> str:
        return self._name

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
        return self.tok.encode(string)

    def tok_decode(self, tokens: list[int]) -> str:
        return self.tok.decode(tokens)

    # ------------------------------------------------------------------ the model
    @torch.no_grad()
    def logits(self, idx: torch.Tensor, at: torch.Tensor | None = None) -> torch.Tensor:
        """(B, T, V) next-token logits under the adapter's protocol (see the module docstring),
        or (B, n, V) at positions ``at`` (B, n) only."""
        if self.model.routers and self.protocol == "causal":
            from mor.model.decode import full_forward_causal

            return full_forward_causal(self.model, idx, logits_at=at).logits
        return self.model(idx, logits_at=at).logits

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs) -> list[tuple[float, bool]]:
        """requests: ((context, continuation) or None, context_enc, continuation_enc).

        lm-eval's context/continuation split, for a causal model::

            tokens   c0  c1  c2  c3 | k0  k1  k2        (ctx = c0..c3, cont = k0..k2)
            input    c0  c1  c2  c3   k0  k1            (ctx + cont)[:-1], left-cut to max_length
            logits   .   .   .   ^k0  ^k1 ^k2           the last len(cont) positions
            score    sum log p(k_i | c.., k<i); greedy = every k_i is the argmax there

        A continuation longer than ``max_length`` is scored in pieces of at most
        ``max_length`` tokens, each conditioned on everything before it (context and the
        earlier pieces, left-cut to the window): the sum of the pieces' log-probs, greedy
        if every piece is."""
        L = self.max_length
        pieces = []  # (request index, model input, scored tokens)
        for i, (key, ctx, cont) in enumerate(requests):
            if not cont:
                raise ValueError(f"mor adapter: empty continuation for {key!r}")
            ctx, cont = list(ctx), list(cont)
            for j in range(0, len(cont), L):
                part = cont[j:j + L]
                inp = (ctx + cont[:j] + part)[-(L + 1):][:-1]  # the diagram: input row
                pieces.append((i, inp, part))
        # longest first (less padding), ties by the tokens: lm-eval's HF order (``_collate``), which
        # decides the batches and so, under top-k, what a row is padded to
        order = sorted(range(len(pieces)), key=lambda p: (-len(pieces[p][1]), tuple(pieces[p][1]), p))
        ll = [0.0] * len(requests)
        greedy = [True] * len(requests)
        bar = tqdm(total=len(pieces), disable=disable_tqdm, desc="mor loglikelihood")
        for b in range(0, len(order), self.batch_size):
            chunk = [pieces[p] for p in order[b:b + self.batch_size]]
            T = len(chunk[0][1])
            k = max(len(part) for _, _, part in chunk)
            pad = TOPK_PAD if self.protocol == "topk" else self.eot_token_id
            idx = torch.full((len(chunk), T), pad, dtype=torch.long)
            at = torch.zeros((len(chunk), k), dtype=torch.long)  # the scored positions (padded: repeated)
            # right padding: under causal routing it changes nothing before it; under top-k the
            # router ranks it too (the authors' protocol, module docstring)
            for r, (_, inp, part) in enumerate(chunk):
                idx[r, :len(inp)] = torch.tensor(inp)
                pos = torch.arange(len(inp) - len(part), len(inp))
                at[r] = torch.cat([pos, pos[-1:].expand(k - len(part))])
            logits = self.logits(idx.to(self.device), at.to(self.device))  # (b, k, V)
            for r, (i, inp, part) in enumerate(chunk):
                lp = F.log_softmax(logits[r, :len(part)].float(), dim=-1)  # (len(part), V)
                target = torch.tensor(part, device=lp.device)
                ll[i] += float(lp.gather(-1, target[:, None]).sum())
                greedy[i] = greedy[i] and bool((lp.argmax(-1) == target).all())
            bar.update(len(chunk))
        bar.close()
        out = list(zip(ll, greedy))
        for (key, _, _), answer in zip(requests, out):
            if key is not None:
                self.cache_hook.add_partial("loglikelihood", key, answer)
        return out

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

        results = []
        for req in tqdm(requests, disable=disable_tqdm, desc="mor loglikelihood_rolling"):
            (string,) = req.args
            windows = [make_disjoint_window(w) for w in get_rolling_token_windows(
                self.tok_encode(string), prefix_token=self.prefix_token_id, max_seq_len=self.max_length,
                context_len=1)]
            scores = self._loglikelihood_tokens([(None, ctx, cont) for ctx, cont in windows], disable_tqdm=True)
            total = sum(ll for ll, _ in scores)
            results.append(total)
            self.cache_hook.add_partial("loglikelihood_rolling", (string,), total)
        return results

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        from lm_eval.models.utils import handle_stop_sequences

        from mor.model.decode import decode_step, prefill

        hard = self.model.shape.max_seq_len
        results = []
        for req in tqdm(requests, disable=disable_tqdm, desc="mor generate_until"):
            context, gen_kwargs = req.args
            kw = dict(gen_kwargs or {})
            if kw.get("do_sample") and float(kw.get("temperature", 1.0) or 0.0) > 0:
                log.warning("mor adapter: sampling requested; decoding greedily")
            until = handle_stop_sequences(kw.get("until"), eos=self.tok_decode([self.eot_token_id]))
            max_gen = max(1, min(int(kw.get("max_gen_toks", 256)), hard - 1))
            ctx = self.tok_encode(context) or [self.prefix_token_id]
            ctx = ctx[-min(self.max_length, hard - max_gen):]
            greedy = self._greedy_topk if self.protocol == "topk" and self.model.routers else self._greedy
            results.append(greedy(ctx, max_gen, until, prefill, decode_step))
            self.cache_hook.add_partial("generate_until", (context, gen_kwargs), results[-1])
        return results

    @torch.no_grad()
    def _greedy_topk(self, ctx: list[int], max_gen: int, until: list[str], *_) -> str:
        """Greedy decoding under the top-k protocol: no KV cache (a cached prefix would keep
        routing decisions the next token changes), the whole training forward per new token."""
        seq = list(ctx)
        new: list[int] = []
        text = ""
        for _ in range(max_gen):
            idx = torch.tensor([seq], dtype=torch.long, device=self.device)
            token = int(self.logits(idx, torch.tensor([[len(seq) - 1]], device=self.device))[0, -1].argmax())
            if token == self.eot_token_id:
                break
            new.append(token)
            seq.append(token)
            text = self.tok_decode(new)
            cut = min((text.find(s) for s in until if s and s in text), default=-1)
            if cut >= 0:
                return text[:cut]
        return text

    @torch.no_grad()
    def _greedy(self, ctx: list[int], max_gen: int, until: list[str], prefill, decode_step) -> str:
        idx = torch.tensor([ctx], dtype=torch.long, device=self.device)
        cache, logits = prefill(self.model, idx, len(ctx) + max_gen)
        new: list[int] = []
        text = ""
        for step in range(max_gen):
            token = int(logits[0].argmax())
            if token == self.eot_token_id:
                break
            new.append(token)
            text = self.tok_decode(new)
            cut = min((text.find(s) for s in until if s and s in text), default=-1)
            if cut >= 0:
                return text[:cut]
            if step + 1 < max_gen:
                logits = decode_step(self.model, cache, torch.tensor([token], device=self.device))
        return text

