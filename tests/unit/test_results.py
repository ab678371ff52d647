import pyarrow.parquet as pq
import pytest

from mor.results import RUN_SCHEMA, ResultsError, collect, read_frame, read_rows, validate_row, write_rows


def _row(run_id="r1", grid="g", **kw):
    base = {"run_id": run_id, "grid": grid, "config_hash": "abc", "git_commit": "deadbeef", "scale": "tiny", "seed": 0,
            "val_nll": 4.2, "accuracy": {"piqa": 0.6}}
    base.update(kw)
    return base


def test_write_read_roundtrip_fills_nulls(tmp_path):
    write_rows(tmp_path / "a.parquet", [_row()])
    t = read_rows(tmp_path / "a.parquet")
    assert t.schema.names == RUN_SCHEMA.names
    row = t.to_pylist()[0]
    assert row["val_nll"] == 4.2 and row["dead_token_ratio"] is None
    assert read_frame(tmp_path / "a.parquet")["accuracy"].iloc[0] == {"piqa": 0.6}
    assert not list(tmp_path.glob("*.tmp"))


def test_rows_need_identity_and_known_columns(tmp_path):
    with pytest.raises(ResultsError, match="identity"):
        write_rows(tmp_path / "x.parquet", [_row(git_commit="")])
    with pytest.raises(ResultsError, match="unknown result column"):
        write_rows(tmp_path / "x.parquet", [_row(nll=1.0)])
    assert not (tmp_path / "x.parquet").exists()


def test_collect_dedupes_and_checks_grid(tmp_path):
    write_rows(tmp_path / "1.parquet", [_row("a")])
    write_rows(tmp_path / "2.parquet", [_row("b")])
    write_rows(tmp_path / "3.parquet", [_row("a", val_nll=3.0)])
    assert collect([tmp_path / f"{i}.parquet" for i in (1, 2, 3)], tmp_path / "g.parquet", "g") == 2
    assert pq.read_table(tmp_path / "g.parquet").num_rows == 2
    with pytest.raises(ResultsError, match="belongs to grid"):
        collect([tmp_path / "1.parquet"], tmp_path / "h.parquet", "h")


def test_foreign_parquet_is_rejected(tmp_path):
    import pyarrow as pa

    pq.write_table(pa.table({"x": [1]}), tmp_path / "bad.parquet")
    with pytest.raises(ResultsError, match="schema differs"):
        read_rows(tmp_path / "bad.parquet")
    (tmp_path / "junk.parquet").write_bytes(b"junk")
    with pytest.raises(ResultsError, match="unreadable"):
        read_rows(tmp_path / "junk.parquet")


@pytest.mark.parametrize("column", ["val_nll", "final_train_loss"])
@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_a_non_finite_metric_never_reaches_parquet(tmp_path, column, value):
    out = tmp_path / "r.parquet"
    write_rows(out, [_row("a")])
    before = out.read_bytes()
    with pytest.raises(ResultsError, match=f"run a: {column} is {value}"):
        write_rows(out, [_row("a", **{column: value})])
    assert out.read_bytes() == before  # the old file stands, no temporary is left
    assert [p.name for p in tmp_path.iterdir()] == ["r.parquet"]


def test_an_old_schema_version_says_how_to_regenerate(tmp_path):
    """A per-run file of schema 2 (before val_nll_causal and the accuracy stderr maps)."""
    import pyarrow as pa

    from mor.results import RUN_SCHEMA, SCHEMA_VERSION

    new = ["val_nll_causal", "accuracy_stderr", "accuracy_norm", "accuracy_norm_stderr", "avg_accuracy_stderr"]
    old = pa.schema([f for f in RUN_SCHEMA if f.name not in new], metadata={"mor_schema_version": "2"})
    row = {k: v for k, v in validate_row(_row("a")).items() if k not in new}
    pq.write_table(pa.Table.from_pylist([row], schema=old), tmp_path / "old.parquet")
    with pytest.raises(ResultsError) as e:
        read_rows(tmp_path / "old.parquet")
    msg = str(e.value)
    assert f"version 2, this code reads version {SCHEMA_VERSION}" in msg
    assert all(c in msg for c in new) and "re-run the workflow" in msg and "training is not redone" in msg
