"""The one Slurm watcher (issues 59 and 60): its settings as the executor's flags and profile keys,
the vanished-job rule and the status rate limiter on canned ``sacct`` / ``squeue`` answers, and
the workflows' rules saying ``localrule:`` themselves instead of the plugin editing Snakemake's
private state. Without a cluster: the fake clients of ``helpers.slurm_fakes`` answer."""

from __future__ import annotations

import argparse
import ast
import re
import subprocess
import sys
from dataclasses import fields

import pytest
import yaml

from helpers.deadlines import deadline
from helpers.paths import REPO
from helpers.slurm_fakes import fake  # noqa: F401  (fixture: fake sbatch / sacct / squeue on PATH)
from submitit.core.utils import JobPaths, cloudpickle_dump

from mor.launch.slurm_handoff import InFlight, verdicts
from mor.launch.slurm_state import Pacer, Sighting, SlurmState, WatchSettings

INVALID = "slurm_load_jobs error: Invalid job id specified"
SETTINGS = ("state_poll_s", "poll_s", "unknown_s", "result_wait_s", "steps")


# ------------------------------------------------------------------ settings: flags, profile keys, fallbacks
def _plugin():
    from snakemake_interface_executor_plugins.registry import ExecutorPluginRegistry

    return ExecutorPluginRegistry().get_plugin("mor-slurm")


def test_the_executor_settings_are_flags_listed_in_snakemakes_help():
    proc = subprocess.run([sys.executable, "-m", "snakemake", "--executor", "mor-slurm", "--help"],
                          capture_output=True, text=True, timeout=deadline(120), check=False,
                          env={"PYTHONPATH": str(REPO / "src"), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    section = proc.stdout.split("mor-slurm executor plugin settings:")[1]
    for name in SETTINGS:
        flag = "--mor-slurm-" + name.replace("_", "-")
        assert re.search(rf"{flag} VALUE\s+\S", section), f"{flag} missing from --help"
    assert "$MOR_LAUNCH_UNKNOWN_S" in section  # the help names the fallback


def test_the_slurm_profile_sets_every_setting_as_a_profile_key_read_through_the_plugin():
    """slurm/config.yaml's ``mor-slurm-*`` keys are the plugin's flags (Snakemake turns a profile
    key into its flag) and resolve to the watcher's settings."""
    profile = yaml.safe_load((REPO / "slurm" / "config.yaml").read_text())
    keys = {k: v for k, v in profile.items() if k.startswith("mor-slurm-")}
    assert sorted(keys) == sorted("mor-slurm-" + n.replace("_", "-") for n in SETTINGS)
    plugin = _plugin()
    parser = argparse.ArgumentParser()
    plugin.register_cli_args(parser, "executor")
    args = parser.parse_args([a for k, v in keys.items() for a in (f"--{k}", str(v))])
    given = plugin.get_settings(args)
    assert {f.name for f in fields(given)} == set(SETTINGS)
    assert given.watch() == WatchSettings()  # the profile states the defaults, explicitly
    args = parser.parse_args(["--mor-slurm-state-poll-s", "7.5", "--mor-slurm-steps", "2"])
    assert (given := plugin.get_settings(args).watch()).state_poll_s == 7.5 and given.steps == 2


def test_a_setting_given_wins_over_the_environment_which_wins_over_the_default():
    env = {"MOR_LAUNCH_UNKNOWN_S": "30", "MOR_LAUNCH_STATE_POLL_S": "1"}
    s = WatchSettings.resolve(environ=env, state_poll_s=5.0)
    assert (s.state_poll_s, s.unknown_s, s.poll_s) == (5.0, 30.0, WatchSettings().poll_s)
    assert s.environment()["MOR_LAUNCH_STATE_POLL_S"] == "5"  # what the launcher steps get
    with pytest.raises(ValueError, match="unknown_s: expected a number >= 0, got -1.0"):
        WatchSettings.resolve(environ={}, unknown_s=-1)
    with pytest.raises(ValueError, match="steps: expected a number, got 'four'"):
        WatchSettings.resolve(environ={"MOR_LAUNCH_STEPS": "four"})


def test_an_environment_value_a_setting_overrides_is_named_not_dropped(capsys):
    """The profile sets every setting, so a MOR_LAUNCH_* a user exported loses: it says so."""
    WatchSettings.resolve(environ={"MOR_LAUNCH_STATE_POLL_S": "1"}, state_poll_s=30.0)
    err = capsys.readouterr().err
    assert "MOR_LAUNCH_STATE_POLL_S=1 is overridden" in err and "mor-slurm-state-poll-s=30" in err
    WatchSettings.resolve(environ={"MOR_LAUNCH_STATE_POLL_S": "30"}, state_poll_s=30.0)  # the same value: no word
    WatchSettings.resolve(environ={"MOR_LAUNCH_STATE_POLL_S": "1"})  # the environment itself is used
    assert capsys.readouterr().err == ""


# ------------------------------------------------------------------ the vanished-job rule
def test_the_vanished_rule_counts_unknown_time_in_a_row_and_restarts_when_seen():
    unknown, seen = SlurmState("", "sacct has no record of it; squeue does not know it", True), SlurmState("RUNNING", "")
    s = Sighting(unknown_s=10.0)
    assert s.vanished(unknown, 0.0) is None and s.vanished(unknown, 9.0) is None
    assert s.vanished(seen, 9.5) is None  # seen again: the grace starts over
    assert s.vanished(unknown, 12.0) is None and s.vanished(unknown, 21.0) is None
    assert s.vanished(unknown, 22.0) == 10.0


def _in_flight(tmp_path, job_id: str, unknown_s: float = 300.0) -> InFlight:
    folder = tmp_path / job_id
    folder.mkdir()
    return InFlight(job_id, str(folder), 1, Sighting(unknown_s))


def test_the_watcher_calls_a_job_neither_sacct_nor_squeue_lists_vanished_after_the_grace(fake, tmp_path):
    fake.answer("sacct", out="11|RUNNING\n")  # 12 is in neither answer
    fake.answer("squeue", out="11 RUNNING\n")
    jobs = [_in_flight(tmp_path, "11", 2.0), _in_flight(tmp_path, "12", 2.0)]
    pacer = Pacer(interval_s=1.0)
    clock = iter([0.0, 1.0, 2.0]).__next__  # each query took no time
    assert verdicts(jobs, 0.0, pacer, clock) == {}
    assert verdicts(jobs, 1.0, pacer, clock) == {}
    out = verdicts(jobs, 2.0, pacer, clock)
    assert list(out) == ["12"] and out["12"]["vanished_s"] == 2.0
    assert out["12"]["detail"] == "sacct has no record of it; squeue does not know it"
    assert out["12"]["limit"] == "mor-slurm-unknown-s=2s" and out["12"]["queue_answered"] is True
    assert fake.calls("sacct") == ["sacct -n -X -P -j 11,12 -o JobID,State"] * 3  # one call for both, each time


def test_the_watcher_gives_an_ended_job_its_state_and_a_job_with_results_its_last_answer(fake, tmp_path):
    fake.answer("sacct", out="21|CANCELLED by 0\n22|RUNNING\n")
    fake.answer("squeue", err=INVALID, rc=1)  # slurmctld forgot both
    jobs = [_in_flight(tmp_path, "21"), _in_flight(tmp_path, "22"), _in_flight(tmp_path, "23")]
    cloudpickle_dump(("success", 1), JobPaths(jobs[2].folder, job_id="23", task_id=0).result_pickle)
    out = verdicts(jobs, 0.0, Pacer(interval_s=30.0), lambda: 0.0)
    assert out["21"]["state"] == "CANCELLED" and "vanished_s" not in out["21"]
    assert "22" not in out  # stale database, controller has no such job: unknown, within its grace
    assert out["23"] == {"state": "", "detail": "sacct has no record of it; squeue does not know it",
                         "queue_answered": True}


# ------------------------------------------------------------------ the status rate limiter
def test_the_pacer_spaces_questions_by_the_interval_the_snakemake_limit_and_the_last_duration():
    p = Pacer(interval_s=30.0)
    assert p.due(0.0)
    p.asked(0.0, 0.5)
    assert not p.due(29.9) and p.due(30.0) and p.asks == 1
    p.asked(30.0, 38.0)  # slurmdbd took 8 s to answer: ask no sooner than 10 x that
    assert not p.due(109.9) and p.due(110.0)
    q = Pacer(interval_s=0.1, max_per_s=0.5)  # --max-status-checks-per-second 0.5: every 2 s at most
    q.asked(0.0, 0.0)
    assert not q.due(1.9) and q.due(2.0)


def test_the_watcher_asks_slurm_only_when_the_pacer_allows_but_looks_for_results_every_time(fake, tmp_path):
    fake.answer("sacct", out="31|RUNNING\n")
    fake.answer("squeue", out="31 RUNNING\n")
    jobs = [_in_flight(tmp_path, "31")]
    pacer = Pacer(interval_s=30.0)
    for now in (0.0, 2.0, 4.0, 6.0):
        assert verdicts(jobs, now, pacer, lambda: now) == {}
    assert len(fake.calls("sacct")) == len(fake.calls("squeue")) == 1 and pacer.asks == 1
    cloudpickle_dump(("success", 1), JobPaths(jobs[0].folder, job_id="31", task_id=0).result_pickle)
    assert verdicts(jobs, 8.0, pacer, lambda: 8.0)["31"]["state"] == "RUNNING"  # its results, without asking
    assert len(fake.calls("sacct")) == 1
    verdicts(jobs, 30.0, pacer, lambda: 30.0)
    assert len(fake.calls("sacct")) == 2


# ------------------------------------------------------------------ local rules, said by the rules
def _rules(text: str) -> dict[str, str]:
    """``{rule name: its block}`` of a rules file."""
    parts = re.split(r"^(?:rule|checkpoint) (\w+):\n", text, flags=re.M)
    return {parts[i]: re.split(r"^\S", parts[i + 1], maxsplit=1, flags=re.M)[0] for i in range(1, len(parts), 2)}


def test_every_rule_says_whether_it_is_local_and_only_launcher_rules_may_go_to_slurm():
    blocks = {name: block for p in sorted((REPO / "workflows" / "rules").glob("*.smk"))
              for name, block in _rules(p.read_text()).items()}
    assert len(blocks) > 20
    launchers = {n for n, b in blocks.items() if "{LAUNCH_ARGS}" in b}
    assert launchers == {"train", "eval", "lmeval", "analysis", "throughput", "fineweb"}
    said = {n: re.search(r"^\s+localrule: (\S+)", b, flags=re.M) for n, b in blocks.items()}
    assert [n for n, m in said.items() if m is None] == []
    assert {n for n, m in said.items() if m.group(1) != "True"} == launchers
    assert all(said[n].group(1) == "LOCAL_LAUNCH" for n in launchers)


def test_no_code_edits_snakemakes_private_local_rules():
    users = [f"{p.relative_to(REPO)}:{node.lineno}" for p in (REPO / "src").rglob("*.py")
             for node in ast.walk(ast.parse(p.read_text())) if isinstance(node, ast.Attribute) and node.attr == "_localrules"]
    assert users == []
