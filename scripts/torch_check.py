"""Does this machine's torch match what the rehearsal modelled? (docs/cluster.md, issue 60)

    python scripts/torch_check.py            # on a GPU node, with the cluster environment active

The rehearsal (``rehearsal/<grid>``, docs/rehearsal.md) measures memory with the torch of
``.venv-rehearsal`` (locks/rehearsal.txt: the GPU image's torch, PyPI's CUDA build);
the cluster environment is built from ``locks/cuda.txt``. A different torch version or CUDA
build allocates differently, so the rehearsal's peak memory per GPU is evidence for the torch
it ran on only. This prints three lines (this torch, the cluster lock's pin, the rehearsal's
torch) and a verdict; exit status 1 when this torch's version or CUDA build differs from the
rehearsal's. No project import: it runs in any environment that has torch.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PROBE = ("import json, torch; print(json.dumps({'version': torch.__version__, 'cuda': torch.version.cuda, "
         "'cudnn': torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None, "
         "'gpu': torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}))")


def probe(python: str) -> dict | None:
    """The torch of the interpreter ``python``: version, CUDA build, cuDNN, first GPU; None if absent."""
    try:
        out = subprocess.run([python, "-c", PROBE], capture_output=True, text=True, timeout=300, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return json.loads(out.strip().splitlines()[-1])


def pinned(path: Path, pattern: str) -> str | None:
    m = re.search(pattern, path.read_text(), re.M) if path.is_file() else None
    return m.group(1) if m else None


def base(version: str | None) -> str:
    """``2.11.0+cu130`` -> ``2.11.0`` (the local part names the build, compared apart)."""
    return (version or "").split("+")[0]


def main() -> int:
    here = probe(sys.executable)
    lock = pinned(REPO / "locks" / "cuda.txt", r"^torch==(\S+)")
    rehearsal_python = REPO / ".venv-rehearsal" / "bin" / "python"
    modelled = probe(str(rehearsal_python)) if rehearsal_python.exists() else None
    rehearsal_pin = pinned(REPO / "locks" / "rehearsal.txt", r"^torch==(\S+)")
    print(f"this torch:       {here or 'not installed'}")
    print(f"cluster lock:     torch=={lock} (locks/cuda.txt, PyPI's CUDA build)")
    print("rehearsal torch:  " + (f"{modelled} ({rehearsal_python})" if modelled else
                                  f"torch=={rehearsal_pin} (locks/rehearsal.txt; .venv-rehearsal not built here, "
                                  "so its CUDA build is not known)"))
    if here is None:
        return 1
    want_version = base(modelled["version"]) if modelled else rehearsal_pin
    differs = []
    if base(here["version"]) != want_version:
        differs.append(f"version {base(here['version'])} vs {want_version}")
    if modelled and here["cuda"] != modelled["cuda"]:
        differs.append(f"CUDA build {here['cuda']} vs {modelled['cuda']}")
    if differs:
        print("DIFFERS from what the rehearsal modelled: " + "; ".join(differs)
              + ". Its memory per GPU was measured on the rehearsal's torch; re-lock .venv-rehearsal with this "
              "version (TORCH in scripts/setup_rehearsal.sh, locks/rehearsal.in, locks/rehearsal-override.txt) and rerun the rehearsal before trusting it here.")
        return 1
    print("matches what the rehearsal modelled")
    return 0


if __name__ == "__main__":
    sys.exit(main())
