"""``mor-lm-eval`` / ``python -m mor.lm_eval``: lm-eval's own command line, with the ``mor`` model.

lm-eval (up to 0.4.13) has no plugin loading: ``lm_eval --model mor`` finds a third-party
model only if its module was imported first. This imports ``lm_eval.models`` and our
adapter, then hands the arguments to lm-eval's CLI (``lm_eval.__main__.cli_evaluate``)
unchanged, so every lm-eval flag works::

    mor-lm-eval --model mor --model_args run_dir=runs/<run_id> --tasks mor_piqa --limit 50
    mor-lm-eval ls tasks --include_path data/lm_eval/tasks

When the tasks include our offline copies (``mor_*``) and no ``--include_path`` is given, the
converted folder is added (``$MOR_LM_EVAL_TASKS``, default ``data/lm_eval/tasks`` of this
checkout; built first if missing), and the hub and ``datasets`` are kept offline.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from mor.lm_eval import DEFAULT_TASKS_DIR, is_local_task, offline_env


def _flag(args: list[str], name: str) -> str | None:
    for i, a in enumerate(args):
        if a == name and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    return None


def prepare_args(args: list[str]) -> list[str]:
    """The arguments lm-eval gets: ours plus --include_path for mor_* tasks (env set up too)."""
    tasks = [t for t in (_flag(args, "--tasks") or "").split(",") if t]
    local = [t for t in tasks if is_local_task(t)]
    if tasks and len(local) == len(tasks):
        offline_env()
    if (local or (args[:2] == ["ls", "tasks"])) and _flag(args, "--include_path") is None:
        folder = Path(os.environ.get("MOR_LM_EVAL_TASKS", DEFAULT_TASKS_DIR))
        if not (folder / "manifest.json").is_file():
            from mor.lm_eval.tasks import build

            print(f"mor-lm-eval: converting the offline tasks into {folder}", file=sys.stderr)
            build(folder)
        args = [*args, "--include_path", str(folder)]
    return args


def main(argv: list[str] | None = None) -> None:
    args = prepare_args(list(sys.argv[1:] if argv is None else argv))
    import lm_eval.models  # noqa: F401  (lm-eval's own registry first)

    import mor.lm_eval.adapter  # noqa: F401  (registers "mor")
    from lm_eval.__main__ import cli_evaluate

    sys.argv = ["mor-lm-eval", *args]
    cli_evaluate()


if __name__ == "__main__":
    main()
