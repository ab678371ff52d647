"""``mor`` / ``python -m mor``: the console script points at the CLI, and every subcommand and
every argument says what it is for in ``--help`` (issue 60: ``collect`` and ``report`` had none)."""

import argparse
import tomllib

import pytest

from helpers.paths import REPO
from mor import cli


def _subcommands():
    ap = cli.build_parser()
    sub = next(a for a in ap._actions if isinstance(a, argparse._SubParsersAction))
    helps = {c.dest: c.help for c in sub._choices_actions}
    return sub.choices, helps


def test_the_console_script_is_the_cli_main():
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    module, _, func = scripts["mor"].partition(":")
    assert (module, func) == ("mor.cli", "main")
    assert getattr(__import__(module, fromlist=[func]), func) is cli.main


def test_the_console_script_names_itself_mor(monkeypatch, capsys):
    monkeypatch.setattr("sys.argv", ["/venv/bin/mor", "--help"])
    with pytest.raises(SystemExit) as e:
        cli.main()
    assert e.value.code == 0
    assert capsys.readouterr().out.startswith("usage: mor ")


def test_every_subcommand_has_a_help_line():
    choices, helps = _subcommands()
    assert {"collect", "report", "claims", "status", "runs", "train"} <= set(choices)
    missing = sorted(name for name in choices if not (helps.get(name) or "").strip())
    assert not missing, f"subcommands without a help line: {missing}"


@pytest.mark.parametrize("name", sorted(n for n in _subcommands()[0] if n not in cli.LAUNCH_VERBS))
def test_every_argument_of_a_subcommand_has_help(name):
    """The launcher's verbs are parsed (and documented) by ``python -m mor.launch``."""
    parser = _subcommands()[0][name]
    bare = [a.dest for a in parser._actions if not isinstance(a, argparse._HelpAction) and not (a.help or "").strip()]
    assert not bare, f"`{name}` arguments without help: {bare}"
