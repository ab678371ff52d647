"""The results schema, declared once, and the only code that writes or reads result parquet.

One row per run. Every row carries its identity (run id, grid, config hash, git commit,
scale, seed) so any number in a table traces back to the config and code that made it.
Metrics a run does not have (router metrics of a vanilla model, accuracies before lm-eval
ran) are null. Tables and figures read these files only, never logs.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from mor.atomic import atomic_path

SCHEMA_VERSION = 8  # 8: lm-eval accuracy under the authors' top-k protocol too (accuracy_topk, ...); 7: one-window decode figures with whole-run values beside (decode_*_run_*); 6: decode batching figures, realised speed-up, same-depth baseline; 5: decode throughput (mor.engine.job); 4: budget_flops, mfu, model_flops_per_s; 3: val_nll_causal, accuracy stderr / acc_norm maps

RUN_SCHEMA = pa.schema(
    [
        # identity and provenance
        ("run_id", pa.string()),
        ("grid", pa.string()),
        ("config_hash", pa.string()),
        ("git_commit", pa.string()),
        ("mode", pa.string()),
        ("scale", pa.string()),  # the scale actually built (e.g. 'small')
        ("paper_scale", pa.string()),  # the paper's scale it stands for (e.g. '135M')
        ("seed", pa.int64()),
        ("label", pa.string()),
        # model
        ("variant", pa.string()),
        ("tying", pa.string()),
        ("num_recursions", pa.int64()),
        ("reduced", pa.bool_()),
        ("router_type", pa.string()),
        ("kv", pa.string()),
        ("n_params", pa.int64()),
        ("unique_layers", pa.int64()),
        ("effective_layers", pa.int64()),
        # training
        ("train_tokens", pa.int64()),
        ("train_steps", pa.int64()),
        ("budget_flops", pa.float64()),  # train.budget_flops (isoFLOP grids; null = tokens set by hand)
        ("train_flops", pa.float64()),  # the FLOPs actually spent (mor.flops over the steps trained)
        ("train_time_s", pa.float64()),
        ("train_tokens_per_s", pa.float64()),
        ("model_flops_per_s", pa.float64()),  # train_flops / train_time_s
        ("mfu", pa.float64()),  # model_flops_per_s / the devices' peak (presets' peak_tflops_per_gpu); null on CPU
        ("final_train_loss", pa.float64()),
        # evaluation
        ("val_nll", pa.float64()),  # teacher-forced: MoR routes with the training top-k (the paper's number)
        ("val_nll_causal", pa.float64()),  # MoR routes with the causal decision decoding uses (= val_nll otherwise)
        ("val_tokens", pa.int64()),
        # lm-eval (mor.lm_eval.job): per task acc, acc_norm and their stderr; the average over tasks of acc
        ("accuracy", pa.map_(pa.string(), pa.float64())),  # lm-eval task -> acc
        ("accuracy_stderr", pa.map_(pa.string(), pa.float64())),
        ("accuracy_norm", pa.map_(pa.string(), pa.float64())),  # tasks that report acc_norm
        ("accuracy_norm_stderr", pa.map_(pa.string(), pa.float64())),
        ("avg_accuracy", pa.float64()),
        ("avg_accuracy_stderr", pa.float64()),  # sqrt(sum of squared task stderrs) / number of tasks
        # the same under the authors' protocol (mor.lm_eval.adapter, 'topk'): expert-choice top-k over the
        # whole right-padded request, the router seeing future tokens; the columns above are the causal one
        ("accuracy_topk", pa.map_(pa.string(), pa.float64())),
        ("accuracy_topk_stderr", pa.map_(pa.string(), pa.float64())),
        ("avg_accuracy_topk", pa.float64()),
        ("avg_accuracy_topk_stderr", pa.float64()),
        # decoding throughput (App. E, mor.engine.job; null for runs without a throughput job):
        # tokens/s over the forward passes and over the wall time, mean live sequences / the
        # engine's admission limit (occupancy), rows per shared-block pass / batch (row_fill) and
        # shared-block passes per generated token, at the fixed batch (32 rows) and at the
        # relative maximum batch; the model's maximum batch in the protocol's memory, and the
        # FLOPs-predicted speedup over the same-depth Vanilla (design and kept capacities)
        ("decode_max_batch", pa.int64()),
        ("decode_batch_max", pa.int64()),
        ("decode_flops_speedup", pa.float64()),
        ("decode_flops_speedup_realised", pa.float64()),  # at the recursion shares the routers kept
        ("decode_baseline_layers", pa.int64()),  # effective depth of the same-depth Vanilla it is normalised to
        ("decode_tokens_per_s_fixed", pa.float64()),
        ("decode_tokens_per_s_wall_fixed", pa.float64()),
        ("decode_occupancy_fixed", pa.float64()),
        ("decode_row_fill_fixed", pa.float64()),  # mean rows per shared-block pass / batch, queue non-empty
        ("decode_passes_per_token_fixed", pa.float64()),  # shared-block passes per generated token
        ("decode_tokens_per_s_max", pa.float64()),
        ("decode_tokens_per_s_wall_max", pa.float64()),
        ("decode_occupancy_max", pa.float64()),
        ("decode_row_fill_max", pa.float64()),
        ("decode_passes_per_token_max", pa.float64()),
        # the fixed/max figures above share one window (passes run while requests wait);
        # the same over the whole run beside them
        ("decode_tokens_per_s_run_fixed", pa.float64()),
        ("decode_row_fill_run_fixed", pa.float64()),
        ("decode_passes_per_token_run_fixed", pa.float64()),
        ("decode_tokens_per_s_run_max", pa.float64()),
        ("decode_row_fill_run_max", pa.float64()),
        ("decode_passes_per_token_run_max", pa.float64()),
        # router metrics (App. G.2); null where they do not apply
        ("dead_token_ratio", pa.float64()),
        ("sampling_accuracy", pa.float64()),
        ("max_vio", pa.float64()),
        ("entropy", pa.float64()),
        ("mean_depth", pa.float64()),
        ("depth_histogram", pa.list_(pa.int64())),
        # for figures: Fig. 5b router outputs (JSON: per recursion, selected vs unselected
        # histograms) and Table 17 / Fig. 1 tokens with the recursion depth each received
        ("router_output_hist", pa.string()),
        ("sample_token_ids", pa.list_(pa.int64())),
        ("sample_token_depths", pa.list_(pa.int64())),
        # the whole resolved config, for anything not broken out above
        ("config_json", pa.string()),
        ("created_at", pa.string()),
    ],
    metadata={"mor_schema_version": str(SCHEMA_VERSION)},
)

MAPS = tuple(f.name for f in RUN_SCHEMA if pa.types.is_map(f.type))
IDENTITY = ("run_id", "grid", "config_hash", "git_commit", "scale", "seed")
FINITE = ("val_nll", "val_nll_causal", "final_train_loss")  # a NaN here means a broken run, not a result


class ResultsError(ValueError):
    """A results file does not match the declared schema."""


def validate_row(row: dict[str, Any]) -> dict[str, Any]:
    """Reject unknown columns and missing identity; fill absent metrics with null."""
    unknown = sorted(set(row) - set(RUN_SCHEMA.names))
    if unknown:
        raise ResultsError(f"unknown result column(s) {unknown}; declare them in mor.results.RUN_SCHEMA")
    missing = [k for k in IDENTITY if row.get(k) in (None, "")]
    if missing:
        raise ResultsError(f"result row lacks identity column(s) {missing}")
    for k in FINITE:
        v = row.get(k)
        if v is not None and not math.isfinite(v):
            raise ResultsError(f"run {row['run_id']}: {k} is {v}; a non-finite metric is never written")
    return {name: row.get(name) for name in RUN_SCHEMA.names}


def write_rows(path: str | Path, rows: list[dict[str, Any]]) -> None:
    """Write rows atomically (tmp file + rename): readers never see half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.Table.from_pylist([validate_row(r) for r in rows], schema=RUN_SCHEMA)
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp)


def read_rows(paths: list[str | Path] | str | Path) -> pa.Table:
    """Read one or many result files, checking each against the schema."""
    if isinstance(paths, (str, Path)):
        paths = [paths]
    tables = []
    for p in paths:
        try:
            t = pq.read_table(p)
        except (OSError, pa.ArrowInvalid) as e:
            raise ResultsError(f"{p}: unreadable parquet ({e}); delete it and re-run the workflow, "
                               "which writes it again from the run's files") from None
        if t.schema.remove_metadata() != RUN_SCHEMA.remove_metadata():
            meta = t.schema.metadata or {}
            version = meta.get(b"mor_schema_version", b"?").decode()
            missing = sorted(set(RUN_SCHEMA.names) - set(t.schema.names))
            extra = sorted(set(t.schema.names) - set(RUN_SCHEMA.names))
            raise ResultsError(
                f"{p}: schema differs from mor.results.RUN_SCHEMA: written with results schema version {version}, "
                f"this code reads version {SCHEMA_VERSION}"
                + (f" (missing column(s) {missing})" if missing else "") + (f" (unknown column(s) {extra})" if extra else "")
                + "; regenerate it: re-run the workflow (eval jobs re-run when the schema version changes), "
                "or delete it and its grid's results/<grid>.parquet, then re-run; training is not redone")
        tables.append(t)
    if not tables:
        return RUN_SCHEMA.empty_table()
    return pa.concat_tables(tables)


def collect(paths: list[str | Path], out: str | Path, grid: str) -> int:
    """Merge per-run files into one grid file, one row per run id (no duplicates)."""
    table = read_rows(paths)
    rows = {r["run_id"]: r for r in table.to_pylist()}
    for r in rows.values():
        if r["grid"] != grid:
            raise ResultsError(f"run {r['run_id']} belongs to grid {r['grid']!r}, not {grid!r}")
    for r in rows.values():  # maps come back as lists of pairs
        for k in MAPS:
            if isinstance(r[k], list):
                r[k] = dict(r[k])
    write_rows(out, sorted(rows.values(), key=lambda r: r["run_id"]))
    return len(rows)


def read_frame(path: str | Path):
    """The grid's results as a pandas DataFrame (reports use this)."""
    df = read_rows(path).to_pandas()
    for k in MAPS:
        df[k] = df[k].apply(lambda v: dict(v) if v is not None else {})
    return df


def config_of(row: dict[str, Any]) -> dict[str, Any]:
    return json.loads(row["config_json"])


# What a table or figure is drawn from: exactly the runs its grid lists under the tags in force,
# all of one mode. The workflow's table and figure rules wait for each of those runs' rows (so a
# new run is trained however Snakemake's metadata stands), and the drawing step checks the merged
# file against the grid before drawing (mor.cli report), so a stale merge fails, never draws.
PROFILES = {"local": "--profile local", "cluster": "--profile slurm"}  # each mode's profile (local/, slurm/)


def parquet_identity(path: str | Path) -> tuple[list[str], set[str]]:
    """The run ids and the modes in a grid's results file (two columns read, not the rows)."""
    try:
        t = pq.read_table(path, columns=["run_id", "mode"])
    except (OSError, pa.ArrowInvalid, KeyError) as e:
        raise ResultsError(f"{path}: unreadable parquet ({e}); delete it and re-run the workflow, "
                           "which writes it again from the run's files") from None
    return t.column("run_id").to_pylist(), set(t.column("mode").to_pylist())


def check_mode(path: str | Path, mode: str, also: tuple[str, ...] = ()) -> None:
    """``path`` (a grid's results) holds rows of ``mode`` only; else one line naming the mode it
    holds, and what to move (``path`` and ``also``, the tables and figures drawn from it)."""
    modes = parquet_identity(path)[1] - {mode}
    if modes:
        other = sorted(modes)[0]
        files = [str(path), *also]
        raise ResultsError(
            f"{path}: holds mode {other}'s results ({PROFILES.get(other, other)}), and this workflow runs mode {mode} "
            f"({PROFILES.get(mode, mode)}); the two modes never share a checkout's results/, tables/ and figures/: "
            f"run {PROFILES.get(mode, mode)} in another checkout (or with --directory elsewhere), or move "
            + (", ".join(files[:-1]) + " and " if len(files) > 1 else "") + files[-1] + " away first")


def check_drawn_from(path: str | Path, want: list[str], grid: str, mode: str, tags: list[str] | None) -> None:
    """The run ids of ``path`` (a grid's merged results) are exactly ``want``, the runs grid file
    ``grid`` lists in ``mode`` under ``tags``: a missing or extra run is one line naming them."""
    check_mode(path, mode)
    have = parquet_identity(path)[0]
    missing, extra = sorted(set(want) - set(have)), sorted(set(have) - set(want))
    if missing or extra:
        def some(ids):
            return ", ".join(ids[:4]) + (f" (+{len(ids) - 4} more)" if len(ids) > 4 else "")

        under = f"tags {sorted(tags)}" if tags else "all tags"
        raise ResultsError(
            f"{path}: not the runs grid {grid} lists (mode {mode}, {under}): "
            + "; ".join(filter(None, [f"missing {len(missing)}: {some(missing)}" if missing else "",
                                      f"extra {len(extra)}: {some(extra)}" if extra else ""]))
            + f"; nothing drawn. Rebuild it from the grid's runs: snakemake {path} --forcerun collect "
            "(with the same --profile and --config), which trains what is missing")


def run_list_hash(run_ids: list[str]) -> str:
    """A short hash of a run list (the rules' `params`, so a changed list re-runs them where
    Snakemake keeps metadata; without it the inputs and mor.cli's check decide)."""
    import hashlib

    return hashlib.sha256("\n".join(sorted(run_ids)).encode()).hexdigest()[:16]
