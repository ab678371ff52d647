"""Deadlines that only bound a hang (a helper of the tests, not a test module).

A test waits on events: a line in a log, a file appearing, a process ending. A deadline is
there only so that a hang fails the test instead of blocking CI; it must never be what a
slow machine trips over. So every deadline is a generous base (several times what the wait
takes on an idle machine) multiplied by how slow this machine is right now: the
``machine_factor``, measured once per session as the median time of a fixed pure-Python
loop over the time it takes on an idle core of the dev machine (``REFERENCE_S``), never
below 1. ``MOR_TEST_SLOWDOWN=<factor>`` sets it instead (a known slow runner, a debugger).
"""

from __future__ import annotations

import functools
import os
import statistics
import time

REFERENCE_S = 0.04  # the loop below on one idle core of the 2-core dev machine (measured: 0.033-0.040 s)
SLOWDOWN_ENV = "MOR_TEST_SLOWDOWN"


def _loop() -> float:
    t = time.perf_counter()
    sum(i * i for i in range(1_000_000))
    return time.perf_counter() - t


@functools.cache
def machine_factor() -> float:
    """How many times slower than the reference this machine runs Python now (>= 1)."""
    if os.environ.get(SLOWDOWN_ENV):
        return max(1.0, float(os.environ[SLOWDOWN_ENV]))
    return max(1.0, statistics.median(_loop() for _ in range(3)) / REFERENCE_S)


def deadline(base_s: float) -> float:
    """``base_s`` scaled by the machine factor: the bound for a wait that normally takes far less."""
    return base_s * machine_factor()


def wait_for(pred, what: str, base_s: float, every_s: float = 0.05):
    """Poll ``pred`` (a cheap check of an event: a file, a line, a process state) until it is
    truthy; fail naming ``what`` if the hang bound ``deadline(base_s)`` passes first."""
    limit = deadline(base_s)
    end = time.monotonic() + limit
    while not (value := pred()):
        assert time.monotonic() < end, f"no {what} within {limit:.0f}s (a hang: {base_s:.0f}s x machine factor " \
                                       f"{machine_factor():.2f})"
        time.sleep(every_s)
    return value
