"""``python -m mor status``: every state from the files a workflow leaves, read without writing.

table10's local runs get made-up files: one evaluated, one trained, one training now, one
whose log stopped with an error, one stopped without one, one queued and one running on
Slurm (the launcher's query replaced by a table of answers); the rest have nothing.
"""

import json
import os
import re
import time
from pathlib import Path

import pytest
from rich.console import Console

from helpers.paths import REPO
from mor.grids import GridError, load_grid
from mor.results import RUN_SCHEMA, write_rows
from mor.status import Paths, collect, log_tail, render, resolve_targets

GRIDS = REPO / "grids"


def no_info(job_id):  # Slurm's node / elapsed / limit: none (no Slurm clients asked)
    return None


class FakeState:
    def __init__(self, state):  # what mor.launch.slurm.slurm_state returns, reduced to .state
        self.state = state


def write_log(run_dir: Path, steps: int, tokens_per_s: float = 1000.0, torn: bool = False, age_s: float = 0.0):
    run_dir.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"step": s, "loss": 8.0 - s / 100, "aux_loss": 0.0, "tokens_per_s": tokens_per_s,
                         "tokens_seen": s * 2048}) for s in range(1, steps + 1)]
    log = run_dir / "train_log.jsonl"
    log.write_text("\n".join(lines) + "\n" + ('{"step": 99, "lo' if torn else ""))
    if age_s:
        t = time.time() - age_s
        os.utime(log, (t, t))


@pytest.fixture
def workspace(tmp_path):
    grid = load_grid(GRIDS / "table10.yaml", "local")
    ids = [r.run_id for r in grid.runs]
    paths = Paths(tmp_path / "runs", tmp_path / "results", tmp_path / "logs", tmp_path / "logs" / "slurm")
    run = lambda i: paths.run_dir("table10", ids[i])  # noqa: E731
    # 0: evaluated
    write_log(run(0), 128, age_s=3600)
    (run(0) / "train_summary.json").write_text("{}")
    row = {n: None for n in RUN_SCHEMA.names}
    row.update(run_id=ids[0], grid="table10", config_hash="x", git_commit="abc", scale="small", seed=0, val_nll=5.4321)
    write_rows(paths.result("table10", ids[0]), [row])
    # 1: trained, eval pending
    write_log(run(1), 128, age_s=60)
    (run(1) / "train_summary.json").write_text("{}")
    # 2: training now (fresh log, torn last line)
    write_log(run(2), 32, tokens_per_s=2048.0, torn=True)
    # 3: failed: stale log, the rule's log ends in an error
    write_log(run(3), 8, age_s=3600)
    err = paths.rule_log("table10", ids[3], "train")
    err.parent.mkdir(parents=True)
    err.write_text("Traceback (most recent call last):\n  ...\nFloatingPointError: run x: loss is nan at step 9\n")
    # 4: stopped (killed workflow): stale log, no error, checkpoints at 8 (the newest)
    write_log(run(4), 16, age_s=3600)
    for step in (4, 8):
        (run(4) / "checkpoints" / f"step-{step:06d}").mkdir(parents=True)
    # 5 / 6: queued / running on Slurm
    answers = {"111": "PENDING", "222": "RUNNING"}
    for i, job in ((5, "111"), (6, "222")):
        rec = paths.slurm_job("table10", ids[i], "train")
        rec.parent.mkdir(parents=True)
        rec.write_text(json.dumps({"job_id": job}))
    write_log(run(6), 64, age_s=1000)  # Slurm's word beats the log's age
    return grid, ids, paths, lambda job_id: FakeState(answers.get(job_id, ""))


def snapshot(root: Path) -> dict:
    return {str(p): (p.stat().st_mtime_ns, p.stat().st_size) for p in root.rglob("*")}


def test_every_state_progress_eta_and_hours(workspace, tmp_path):
    grid, ids, paths, query = workspace
    before = snapshot(tmp_path)
    (gs,) = collect([grid], paths, slurm_query=query, slurm_info=no_info)
    assert snapshot(tmp_path) == before  # read only
    by = {r.run_id: r for r in gs.runs}
    assert [by[ids[i]].state for i in range(8)] == [
        "done", "trained", "running", "failed", "stopped", "queued", "running", "not started"]
    done, running = by[ids[0]], by[ids[2]]
    assert done.val_nll == pytest.approx(5.4321) and done.hours_spent == done.hours_total > 0
    assert running.step == 32 and running.steps == 128 and running.loss == pytest.approx(7.68)
    assert running.tokens_per_s == 2048.0 and running.eta_s == pytest.approx(96 * 2048 / 2048.0)
    assert 0 < running.hours_spent < running.hours_total
    assert by[ids[3]].note == "FloatingPointError: run x: loss is nan at step 9; restarts from step 0 (no checkpoint yet)"
    assert by[ids[4]].note == "resumes at step 8 (checkpoint)"
    assert by[ids[5]].note == "Slurm job 111 PENDING" and by[ids[5]].estimated
    assert by[ids[7]].estimated and by[ids[7]].eta_s > 0 and by[ids[7]].hours_spent == 0
    assert gs.counts() == {"done": 1, "trained": 1, "running": 2, "queued": 1, "failed": 1, "stopped": 1,
                           "not started": 15}


def test_rendered_table_and_summary(workspace):
    grid, ids, paths, query = workspace
    console = Console(record=True, width=240)
    statuses = collect([grid, load_grid(GRIDS / "table13.yaml", "local")], paths, slurm_query=query, slurm_info=no_info)
    console.print(render(statuses, wide=True))
    text = console.export_text()
    assert ids[2] in text and "32/128" in text and "5.4321" in text and "loss is nan" in text
    assert "table10: 22 runs: 1 done, 1 trained, 2 running, 1 queued, 1 failed, 1 stopped, 15 not started" in text
    assert re.search(r"^  plan +[\d.]+ of [\d.]+ wall-h done, [\d.]+ left \(priced, not measured\)", text, re.M)
    # wall time called wall time (CPU time is the cpu line's, in CPU-min); tok/s says over which steps
    assert "CPU-h" not in text and "tok/s: mean over the last 20 logged steps" in text
    assert re.search(r"^  measured +nothing yet", text, re.M) and "all: 1/" in text


@pytest.mark.parametrize("width", [80, 100, 120])
def test_the_table_fits_the_terminal_and_never_squeezes_a_number(workspace, width):
    """At 80, 100 and 120 columns no line is wider than the terminal, nothing is cut ("…"),
    and every number of every run appears whole on its run's row, formatted here from the
    collected values (not from the renderer); each run's short name is a unique prefix of its
    id, and a note sits under the table beside its run's short name."""
    from mor.status import short_ids

    grid, ids, paths, query = workspace
    statuses = collect([grid], paths, slurm_query=query, slurm_info=no_info)
    console = Console(record=True, width=width)
    console.print(render(statuses, width=width))
    text = console.export_text()
    assert max(len(line.rstrip()) for line in text.splitlines()) <= width and "…" not in text
    short = short_ids(ids)
    assert len(set(short.values())) == len(ids) and all(i.startswith(short[i]) for i in ids)
    rows = text.split("\nnotes:")[0].splitlines()
    for r in statuses[0].runs:
        first = short[r.run_id].split("-")[0]
        numbers = [f"{r.step}/{r.steps}"] + [f"{v:.3f}" for v in [r.loss] if v is not None] + \
                  [f"{v:.4f}" for v in [r.val_nll] if v is not None] + [f"{v:.0f}" for v in [r.tokens_per_s] if v]
        row = next(line for line in rows if line.startswith(first) and r.state in line and all(
            n in line.split() for n in numbers)) if width >= 80 else None
        assert row is not None, (r.run_id, numbers)
    failed = next(r for r in statuses[0].runs if r.state == "failed")
    notes = " ".join(line.strip() for line in text.split("\nnotes:")[1].splitlines())
    assert f"{short[failed.run_id]} FloatingPointError: run x: loss is nan" in notes


def test_short_ids_keep_the_hash_only_where_it_tells_runs_apart():
    """Three seeds of one config differ only in their hash: they keep its shortest unique prefix
    (>= 4); an id whose stem is unique loses its hash; an id without one stays."""
    from mor.status import short_ids

    ids = ["135M-vanilla-764b48f1", "135M-vanilla-764b0000", "135M-vanilla-5669dc3c", "360M-mor-nr3-73bdb7c3", "odd"]
    assert short_ids(ids) == {"135M-vanilla-764b48f1": "135M-vanilla-764b4", "135M-vanilla-764b0000": "135M-vanilla-764b0",
                              "135M-vanilla-5669dc3c": "135M-vanilla-5669", "360M-mor-nr3-73bdb7c3": "360M-mor-nr3",
                              "odd": "odd"}


@pytest.mark.parametrize("grid", ["table10", "deciding"])
def test_every_short_id_is_a_prefix_of_its_run_alone(grid):
    """What ``mor status`` shows at 80 columns pastes (issue 45): no other run id of the grid
    starts with it. table10 has 135M-vanilla beside 135M-vanilla-reduced2, deciding has seed 0
    beside its -s1 and -s2, whose stems are prefixes of one another."""
    from mor.status import short_ids

    ids = [r.run_id for r in load_grid(GRIDS / f"{grid}.yaml", "local").runs]
    short = short_ids(ids)
    for i in ids:
        assert [j for j in ids if j.startswith(short[i])] == [i], (i, short[i])
    assert sum(len(v) < len(k) for k, v in short.items()) > len(ids) // 2  # and they are shorter


def test_slurm_notes_give_node_elapsed_limit_and_the_job_logs_last_error(tmp_path):
    """A running job's note names its node and elapsed time against its limit; a failed one's
    adds the last error line of its own Slurm log (beside job.json), which beats the rule's."""
    grid = load_grid(GRIDS / "table10.yaml", "cluster")
    ids = [r.run_id for r in grid.runs]
    paths = Paths(tmp_path / "runs", tmp_path / "results", tmp_path / "logs", tmp_path / "logs" / "slurm")
    for i, job in ((0, "7"), (1, "8")):
        rec = paths.slurm_job("table10", ids[i], "train")
        rec.parent.mkdir(parents=True)
        rec.write_text(json.dumps({"job_id": job}))
    (paths.slurm_job("table10", ids[1], "train").parent / "8_0_log.err").write_text(
        "Traceback (most recent call last):\ntorch.OutOfMemoryError: CUDA out of memory\nsrun: error: node4: task 0\n")
    rule = paths.rule_log("table10", ids[1], "train")
    rule.parent.mkdir(parents=True)
    rule.write_text("LaunchError: Slurm job 8 FAILED\n")
    from mor.status import JobInfo

    info = {"7": JobInfo("node3", "3:12:05", "1-00:00:00"), "8": JobInfo("node4", "0:04:10", "1-00:00:00")}
    states = {"7": "RUNNING", "8": "FAILED"}
    (gs,) = collect([grid], paths, slurm_query=lambda j: FakeState(states[j]), slurm_info=info.get)
    by = {r.run_id: r for r in gs.runs}
    assert by[ids[0]].state == "running" and by[ids[0]].note == "Slurm job 7 RUNNING on node3, 3:12:05 of 1-00:00:00"
    assert by[ids[1]].state == "failed"
    assert by[ids[1]].note == "Slurm job 8 FAILED on node4, 0:04:10 of 1-00:00:00: torch.OutOfMemoryError: CUDA out of memory"


def test_cluster_plan_counts_gpu_hours(tmp_path):
    grid = load_grid(GRIDS / "table10.yaml", "cluster")
    (gs,) = collect([grid], Paths(tmp_path / "runs", tmp_path / "results", tmp_path / "logs", tmp_path / "s"),
                    slurm_query=lambda j: FakeState(""))
    assert gs.device == "GPU" and sum(r.hours_total for r in gs.runs) > 100


def test_presets_without_the_grids_scale_give_no_hours_and_say_why(tmp_path):
    """A site's presets without table9's local `micro` scale: table9's runs are still listed
    and its summary names the missing key instead of counting hours, while table13 (scale
    `small`, priced) keeps its hours, and the total counts table13's alone and names table9."""
    import yaml

    presets = yaml.safe_load((REPO / "slurm" / "presets.yaml").read_text())
    del presets["scales"]["micro"]
    site = tmp_path / "site-presets.yaml"
    site.write_text(yaml.safe_dump(presets))
    grids = [load_grid(GRIDS / "table9.yaml", "local"), load_grid(GRIDS / "table13.yaml", "local")]
    statuses = collect(grids, Paths(tmp_path / "runs", tmp_path / "results", tmp_path / "logs", tmp_path / "s"),
                       presets_file=site, slurm_query=lambda j: FakeState(""))
    assert [len(gs.runs) for gs in statuses] == [len(g.runs) for g in grids]
    table9, table13 = statuses
    assert "scales.micro is missing" in table9.no_plan and not table13.no_plan
    assert all(r.hours_total == 0 for r in table9.runs) and all(r.hours_total > 0 for r in table13.runs)
    console = Console(record=True, width=400)
    console.print(render(statuses))
    text = console.export_text()
    assert "table9: " in text and re.search(r"^  no hours +no plan from the presets \(", text, re.M)
    whole = sum(r.hours_total for r in table13.runs)
    total = text[text.index("all: 0/"):]
    shown = f"{whole:.2f}" if whole >= 0.1 else f"{whole:.2g}"  # the table's rounding of hours
    assert f"plan      0.00 of {shown} wall-h done, {shown} left" in total, (total, whole)
    assert "no plan from the presets: table9" in total


def test_the_shipped_presets_price_every_local_grid(tmp_path):
    """Every grid's local scales have an entry in slurm/presets.yaml (table9's ladder included),
    so `python -m mor status paper` shows hours, and a forecast, for all of them."""
    from mor.grids import all_grids

    grids = [g for g in (load_grid(p, "local") for p in all_grids(GRIDS)) if g.artifacts]
    statuses = collect(grids, Paths(tmp_path / "runs", tmp_path / "results", tmp_path / "logs", tmp_path / "s"),
                       slurm_query=lambda j: FakeState(""))
    assert {gs.grid.name: gs.no_plan for gs in statuses if gs.no_plan} == {}
    assert all(r.hours_total > 0 for gs in statuses for r in gs.runs)


def test_seeds_the_claims_design_added_are_listed(tmp_path):
    """After round 1 of the adaptive design raised deciding's vanilla block to 3 fresh seeds, the
    status lists those runs too, and not the pilot's seeds below the design's first fresh one
    (the latest round's plan wins; other folders are ignored)."""
    from mor.claims import load_specs
    from mor.status import with_design_seeds

    first = load_specs(mode="local")[0].first_seed
    assert first > 3  # the shipped local design has a pilot (seeds 3 .. first - 1)
    grids = resolve_targets(["tables/deciding", "tables/table13"], GRIDS, "local")
    deciding = grids[0]
    for r, seeds in ((0, {"deciding": {"vanilla": 3}}), (1, {"deciding": {"vanilla": first + 3}})):
        (tmp_path / "claims" / f"round{r}").mkdir(parents=True)
        (tmp_path / "claims" / f"round{r}" / "plan.json").write_text(json.dumps({"seeds": seeds}))
    (tmp_path / "claims" / "roundabout").mkdir()
    more = with_design_seeds(grids, tmp_path)
    assert more[1] is grids[1]  # no seeds added to table13
    added = {r.run_id for r in more[0].runs} - {r.run_id for r in deciding.runs}
    assert len(added) == 3 and {more[0].run(i).block for i in added} == {"vanilla"}
    assert {more[0].run(i).config.train.seed for i in added} == {first, first + 1, first + 2}
    statuses = collect(more, Paths(tmp_path / "runs", tmp_path, tmp_path / "logs", tmp_path / "s"),
                       slurm_query=lambda j: FakeState(""))
    assert {r.run_id for r in statuses[0].runs if r.state == "not started"} >= added
    (tmp_path / "claims" / "round1" / "plan.json").write_text("{")
    with pytest.raises(GridError, match="round1/plan.json: not a round plan"):
        with_design_seeds(grids, tmp_path)


def test_targets_resolve_to_grids():
    assert [g.name for g in resolve_targets(["tables/table10", "figures/fig6"], GRIDS, "local")] == ["table10"]
    assert [g.name for g in resolve_targets(["table13", str(GRIDS / "table10.yaml")], GRIDS, "local")] == \
        ["table13", "table10"]
    assert len(resolve_targets([], GRIDS, "local")) > 3
    with pytest.raises(GridError, match="unknown target 'tables/nope'"):
        resolve_targets(["tables/nope"], GRIDS, "local")


def test_log_tail_reads_only_the_end(tmp_path):
    write_log(tmp_path, 5000, torn=True)
    tail = log_tail(tmp_path / "train_log.jsonl", max_bytes=4096)
    assert tail[-1]["step"] == 5000 and 10 < len(tail) < 100
    assert log_tail(tmp_path / "missing.jsonl") == []


def test_cli_prints_the_table(tmp_path, capsys):
    from mor.cli import main

    assert main(["status", "tables/table10", "figures/fig6", "--root", str(tmp_path), "--grids-dir", str(GRIDS)]) == 0
    out = capsys.readouterr().out
    assert "table10: 22 runs: 22 not started; steps 0/2816" in out and not list(tmp_path.iterdir())


def test_watch_refreshes_until_interrupted(workspace, tmp_path, monkeypatch, capsys):
    """--watch redraws from the files each period (sleep replaced: the second wake-up is ^C)."""
    import mor.status.cli as status_cli
    import mor.status.state as status_state
    from mor.cli import main

    grid, ids, paths, query = workspace
    wakes = []

    def sleep(s):
        wakes.append(s)
        if len(wakes) == 1:  # between two refreshes a run finishes its training
            (paths.run_dir("table10", ids[2]) / "train_summary.json").write_text("{}")
        else:
            raise KeyboardInterrupt

    monkeypatch.setattr(status_cli.time, "sleep", sleep)
    monkeypatch.setattr(status_state, "slurm_job_state", lambda record, query=None: None)
    assert main(["status", "table10", "--root", str(tmp_path), "--grids-dir", str(GRIDS), "--watch", "2"]) == 0
    assert wakes == [2.0, 2.0]
    assert "2 trained" in capsys.readouterr().out


def test_forecast_is_a_ratio_of_sums():
    """Runs measured 2x (planned 100 s, took 200 s) and 3x (planned 300 s, took 900 s) slower:
    1100 / 400 = 2.75x, not the mean 2.5x; 10 h left become 27.5 h, 6.875 h on 4 cores."""
    from mor.status import forecast

    f = forecast([(200.0, 100.0), (900.0, 300.0)], 10.0, cores=4)
    assert f.factor == pytest.approx(2.75) and f.runs == 2
    assert f.hours_left == pytest.approx(27.5) and f.wall_hours == pytest.approx(6.875)
    assert forecast([(200.0, 100.0)], 10.0).wall_hours is None  # no cores: cluster
    assert forecast([], 10.0) is None and forecast([(50.0, 0.0)], 10.0) is None  # nothing planned to compare with


def summary(text: str, head: str) -> dict[str, str]:
    """The labelled lines under the summary line starting with ``head`` (``table10: ``,
    ``all: ``): label -> text, an unlabelled line joined to the one above with " | "."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(head))
    out, last = {}, None
    for line in lines[start + 1:]:
        if not line.startswith("  "):
            break
        label, body = line[:12].strip(), line[12:].strip()
        if label:
            out[label], last = body, label
        else:
            out[last] += " | " + body
    return out


def write_summary(paths: Paths, run_id: str, summary: dict | str) -> None:
    paths.run_dir("table10", run_id).mkdir(parents=True, exist_ok=True)
    text = summary if isinstance(summary, str) else json.dumps(summary)
    (paths.run_dir("table10", run_id) / "train_summary.json").write_text(text)


def plan_left(grid, trained: list[str]) -> tuple[dict, float]:
    """The plan's train jobs by run id, and its device-hours left once ``trained`` are trained
    (every job's hours x devices, less those runs' train jobs), straight from mor.launch.plan."""
    from mor.launch.cost import plan_grid
    from mor.launch.presets import load_presets

    jobs = plan_grid(grid, load_presets())
    train = {j.run_id: j for j in jobs if j.kind == "train"}
    device_h = lambda j: j.hours * (j.gpus or j.world_size)  # noqa: E731
    return train, sum(device_h(j) for j in jobs) - sum(device_h(train[i]) for i in trained)


def test_rendered_forecast_scales_the_plan_by_the_measured_speed(tmp_path):
    """Two trained runs whose summaries say they took k = 2.5 times the plan's training time
    (on the plan's ranks); a third's summary is malformed and a fourth's covers other steps:
    neither is counted. The summary shows 2.50x from 2 runs and the plan's hours left x 2.5,
    both derived here from the plan itself, and the wall time on the cores given."""
    k, cores = 2.5, 4
    grid = load_grid(GRIDS / "table10.yaml", "local")
    ids = [r.run_id for r in grid.runs]
    paths = Paths(tmp_path / "runs", tmp_path / "results", tmp_path / "logs", tmp_path / "s")
    train, left = plan_left(grid, ids[:4])
    for i in (0, 1):
        j = train[ids[i]]
        write_summary(paths, ids[i], {"train_time_s": k * j.hours * 3600, "world_size": j.world_size,
                                      "steps": grid.run(ids[i]).config.train.steps, "tokens_seen": 1,
                                      "tokens_per_s": 1.0, "resumed_from": None})
    write_summary(paths, ids[2], '{"train_time_s": "soon"')
    write_summary(paths, ids[3], {"train_time_s": 1e6, "world_size": 1, "steps": 1})
    console = Console(record=True, width=400)
    console.print(render(collect([grid], paths, slurm_query=lambda j: FakeState("")), cores=cores))
    text = console.export_text()
    assert "4 trained" in text
    lines = summary(text, "table10: ")
    measured = sum(k * train[ids[i]].hours * train[ids[i]].world_size for i in (0, 1))  # device-hours
    priced = measured / k
    h = lambda x: f"{x:.2f}" if x >= 0.1 else f"{x:.2g}"  # noqa: E731 - hours: 2 decimals, 2 digits below 0.1
    assert lines["measured"] == f"{h(measured)} wall-h of training in 2 runs, priced at {h(priced)} (2.50x)"
    assert lines["plan"].endswith(f", {left:.2f} left (priced, not measured)")  # the plan's own numbers are kept
    # both runs took 2.5x: the range is one point, and it says it rests on the 2 runs
    assert lines["forecast"].startswith(f"~{k * left:.2f} wall-h left, {k * left:.2f} to {k * left:.2f} "
                                        "(2.50x the plan; 2 runs, fastest to slowest); ~"), lines
    wall = re.search(r"; ~(\d+)m(\d\d)s on 4 cores$", lines["forecast"])  # under an hour: minutes and seconds
    assert wall and int(wall[1]) * 60 + int(wall[2]) == round(k * left / cores * 3600)


def test_total_forecast_takes_each_grid_at_its_own_speed(tmp_path):
    """table10's finished runs took 2x their plan and table13's 0.5x; table12 has none. The
    total forecasts table10's hours left x 2, table13's x 0.5 and table12's x the factor pooled
    over all four runs (sum measured / sum planned), each derived here from the plan itself;
    one pooled factor for everything would give a different total, and the test tells them apart."""
    paths = Paths(tmp_path / "runs", tmp_path / "results", tmp_path / "logs", tmp_path / "s")
    speed = {"table10": 2.0, "table13": 0.5, "table12": None}
    grids, left, measured, planned = [], {}, 0.0, 0.0
    for name, k in speed.items():
        grid = load_grid(GRIDS / f"{name}.yaml", "local")
        grids.append(grid)
        ids = [r.run_id for r in grid.runs][:2] if k else []
        train, left[name] = plan_left(grid, ids)
        for i in ids:
            planned_s = train[i].hours * 3600 * train[i].world_size
            paths.run_dir(name, i).mkdir(parents=True)
            (paths.run_dir(name, i) / "train_summary.json").write_text(json.dumps(
                {"train_time_s": k * planned_s / train[i].world_size, "world_size": train[i].world_size,
                 "steps": grid.run(i).config.train.steps}))
            measured, planned = measured + k * planned_s, planned + planned_s
    pooled = measured / planned
    expected = left["table10"] * 2.0 + left["table13"] * 0.5 + left["table12"] * pooled
    assert abs(expected - sum(left.values()) * pooled) > 0.05
    console = Console(record=True, width=400)
    console.print(render(collect(grids, paths, slurm_query=lambda j: FakeState("")), cores=2))
    total = summary(console.export_text(), "all: ")["forecast"]
    # the range: table12, never measured, anywhere between the speeds seen (0.5x, 2x) and the plan's (1x)
    low = left["table10"] * 2.0 + left["table13"] * 0.5 + left["table12"] * 0.5
    high = left["table10"] * 2.0 + left["table13"] * 0.5 + left["table12"] * 2.0
    assert total.startswith(f"~{expected:.2f} wall-h left, {low:.2f} to {high:.2f} "
                            f"({expected / sum(left.values()):.2f}x the plan); ~"), (total, expected)
    assert total.endswith(" | rests on table10 2.00x (2 runs), table13 0.50x (2 runs)"
                          " | not measured yet, priced at 0.50x to 2.00x: table12"), total


def test_cluster_forecast_counts_device_seconds_and_no_cores(tmp_path):
    """On GPUs (135M trains on 2 per job) one run took k x its planned wall time on the plan's
    ranks, another ran on 1 rank for 2k x: both are k x the planned GPU-seconds (train_time_s x
    world_size), so the factor is k; Slurm runs jobs in parallel, so no wall time on cores."""
    k = 0.5
    grid = load_grid(GRIDS / "table10.yaml", "cluster")
    ids = [r.run_id for r in grid.runs]
    paths = Paths(tmp_path / "runs", tmp_path / "results", tmp_path / "logs", tmp_path / "s")
    train, left = plan_left(grid, ids[:2])
    assert train[ids[0]].world_size == train[ids[1]].world_size == 2
    for i, ranks in ((0, 2), (1, 1)):
        j = train[ids[i]]
        write_summary(paths, ids[i], {"train_time_s": k * j.hours * 3600 * j.world_size / ranks, "world_size": ranks,
                                      "steps": grid.run(ids[i]).config.train.steps})
    console = Console(record=True, width=400)
    console.print(render(collect([grid], paths, slurm_query=lambda j: FakeState("")), cores=4))
    lines = summary(console.export_text(), "table10: ")
    spent = train[ids[0]].gpu_hours + train[ids[1]].gpu_hours
    assert lines["plan"] == f"{spent:.2f} of {left + spent:.2f} GPU-h done, {left:.2f} left (priced, not measured)"
    assert lines["measured"] == f"{k * spent:.2f} GPU-h of training in 2 runs, priced at {spent:.2f} (0.50x)"
    assert lines["forecast"] == (f"~{k * left:.2f} GPU-h left, {k * left:.2f} to {k * left:.2f} "
                                 "(0.50x the plan; 2 runs, fastest to slowest)")


def test_no_measured_run_no_forecast(workspace, tmp_path):
    """Summaries without the keys (the workspace's "{}") and runs without one add nothing."""
    grid, ids, paths, query = workspace
    console = Console(record=True, width=400)
    console.print(render(collect([grid, load_grid(GRIDS / "table13.yaml", "local")], paths, slurm_query=query, slurm_info=no_info)))
    text = console.export_text()
    assert "wall-h done" in text and "nothing yet" in text and "forecast" not in text and "cores" not in text


def test_a_run_two_grids_list_is_shown_once_with_the_grids_that_use_it(tmp_path):
    """Issue 58: table10 and table15 share runs (one id, one home, runs/<id>/): each shared run is
    one row, under the first grid, its note naming the other; the second grid's summary counts
    it as shared rather than listing it again."""
    grids = [load_grid(GRIDS / "table10.yaml", "cluster"), load_grid(GRIDS / "table15.yaml", "cluster")]
    shared = {r.run_id for r in grids[0].runs} & {r.run_id for r in grids[1].runs}
    assert shared  # derived from the grids, not assumed
    rid = sorted(shared)[0]
    write_log(tmp_path / "runs" / rid, steps=3, age_s=10_000)  # one folder, whatever grid lists it
    statuses = collect(grids, Paths(tmp_path / "runs", tmp_path / "results", tmp_path / "logs", tmp_path / "s"),
                       slurm_query=lambda j: FakeState(""), slurm_info=no_info)
    rows = [r.run_id for gs in statuses for r in gs.runs]
    assert len(rows) == len(set(rows)) == len({r.run_id for g in grids for r in g.runs})
    first = {r.run_id: r for r in statuses[0].runs}
    assert first[rid].grids == ["table10", "table15"] and first[rid].note.startswith("shared with table15")
    assert first[rid].step == 3  # read from runs/<id>/ for the grid it is shown under
    assert set(statuses[1].shared) == shared and set(statuses[1].shared.values()) == {"table10"}
    console = Console(record=True, width=400)
    console.print(render(statuses))
    assert f"and {len(shared)} shared, shown under table10" in console.export_text()


def test_an_imported_run_plans_no_steps_and_says_it_is_imported(tmp_path):
    """A run whose weights are the authors' checkpoint (model.import_checkpoint) trains nothing:
    status shows 0 steps, not the steps its schedule would have trained, and says why; once its
    import job wrote train_summary.json it is 'trained' with the note 'imported'."""
    grid = load_grid(GRIDS / "imported" / "imported.yaml", mode="local")
    (run,) = grid.runs
    assert run.config.train.steps > 0  # the schedule has steps; the run trains none of them
    paths = Paths(runs=tmp_path / "runs", results=tmp_path / "results", logs=tmp_path / "logs")
    (gs,) = collect([grid], paths, now=time.time())
    (st,) = gs.runs
    assert (st.state, st.step, st.steps) == ("not started", 0, 0) and "nothing is trained" in st.note
    run_dir = paths.run_dir(grid.name, run.run_id)
    run_dir.mkdir(parents=True)
    (run_dir / "train_summary.json").write_text("{}")
    (st,) = collect([grid], paths, now=time.time())[0].runs
    assert st.state == "trained" and st.steps == 0 and st.note.endswith("imported, nothing trained")
