"""environment.yml (conda, clusters) and pyproject.toml (pip, here) must pin the same set."""

import re
import tomllib

import yaml
from helpers.paths import REPO


def _pins(specs):
    out = {}
    for s in specs:
        m = re.fullmatch(r"([A-Za-z0-9_.-]+)==([^\s;]+)", s.strip())
        if m:
            out[m.group(1).lower().replace("_", "-")] = m.group(2)
    return out


def test_environment_yml_matches_pyproject():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    wanted = _pins(project["dependencies"])
    wanted |= _pins(project["optional-dependencies"]["test"])
    wanted |= _pins(project["optional-dependencies"]["cluster"])
    env = yaml.safe_load((REPO / "environment.yml").read_text())
    pip_block = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    have = _pins(pip_block)
    assert have == wanted
    assert "-e ." in pip_block
    assert wanted["torch"] == "2.13.0"


def test_constraints_pin_the_cpu_torch():
    lines = [ln.strip() for ln in (REPO / "constraints.txt").read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert f"torch=={_pins(project['dependencies'])['torch']}" in lines
