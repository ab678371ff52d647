"""The CI's machine-state check (tests/helpers/machine_state.py): what it blames on the suite.

A file some process already held open for writing before the snapshot (the CI runner's own
log) is not the suite's doing; a file changed by anyone else, or opened for writing only
after the snapshot, is.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from helpers import machine_state
from helpers.paths import TESTS

# Appends each line it reads on stdin to the file named on its command line, and says "ok".
WRITER = r"""
import sys
with open(sys.argv[1], "a") as log:
    for line in sys.stdin:
        log.write(line); log.flush()
        print("ok", flush=True)
"""


@pytest.fixture
def writer(tmp_path):
    log = tmp_path / "runner.log"
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(log)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)

    def write(line: str) -> None:
        proc.stdin.write(line + "\n")
        proc.stdin.flush()
        assert proc.stdout.readline() == "ok\n"  # the event: the line is in the file

    write("first")
    yield proc, log, write
    proc.stdin.close()
    proc.wait()


def test_open_for_writing_names_the_writer_and_not_readers(tmp_path, writer):
    proc, log, _ = writer
    read_only = tmp_path / "read.txt"
    read_only.write_text("x")
    with open(read_only) as _held:
        held = machine_state.open_for_writing()
    assert proc.pid in held[str(log)]
    assert str(read_only) not in held


def test_a_log_written_by_an_earlier_process_is_not_blamed_on_the_suite(tmp_path, writer):
    _, log, write = writer
    (tmp_path / "config.txt").write_text("a")
    before = machine_state.snapshot(str(tmp_path))
    write("second")                                   # the runner's log grows
    (tmp_path / "config.txt").write_text("changed")   # something else changes a file
    with open(tmp_path / "late.log", "a") as late:     # a file opened for writing afterwards
        diff = machine_state.compare(before, None, str(tmp_path))
    assert log.read_text() == "first\nsecond\n"
    assert diff["files changed"] == [str(tmp_path / "config.txt")]
    assert diff["files added"] == [str(tmp_path / "late.log")]
    late.close()


def test_the_checks_own_output_file_is_not_blamed(tmp_path):
    """`.ci/run > log`: the log is the check's (inherited) standard output."""
    log = tmp_path / "ci.log"
    code = ("import json, sys; sys.path.insert(0, sys.argv[1]); from helpers import machine_state as m; "
            "print(json.dumps(sorted(m.ancestors_output())), file=sys.stderr)")
    with open(log, "w") as out:
        r = subprocess.run([sys.executable, "-c", code, str(TESTS)], stdout=out,
                           stderr=subprocess.PIPE, text=True, check=True)
    assert str(log) in json.loads(r.stderr)
