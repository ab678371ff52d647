"""Timing and read-back without a host sync between passes: ``PassClock`` (CUDA events on a
GPU, read once when the run ends; host and process clocks on a CPU) and ``Readback`` (a
pass's routing decisions and tokens copied to pinned host memory behind an event, waited
on only when the scheduler needs them)."""

from __future__ import annotations

import time

import torch


class PassClock:
    """Time inside each pass without a host sync between passes: CUDA events on a GPU (read
    once, when the run ends), the host clock on a CPU (where a pass runs synchronously),
    and there also the process's CPU seconds (what other jobs on a shared CPU inflate least).

    On a GPU a pass's start event is recorded at ``launch`` (the stepper calls it when the
    pass's device work starts: its upload), after the host planned it: a pass planned while
    the device was idle (lockstep, a partial pass after WAIT) would otherwise count the
    planning, one planned while the device ran the previous pass would not, and the two
    kinds of pass would not compare. The whole run's wall time (``wall_s``) counts it all.
    On a CPU the pass runs on the host, planning included, from ``start``."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.marks: list = []
        self.cpu: list = []

    def start(self) -> None:
        if self.cuda:
            self.marks.append([None, None])  # the start event: at launch
        else:
            self.marks.append([time.perf_counter(), None])
            self.cpu.append([time.process_time(), None])

    def launch(self) -> None:
        if self.cuda and self.marks and self.marks[-1][0] is None:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            self.marks[-1][0] = ev

    def stop(self) -> None:
        if self.cuda:
            self.launch()  # a pass that launched nothing: zero seconds
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            self.marks[-1][1] = ev
        else:
            self.marks[-1][1] = time.perf_counter()
            self.cpu[-1][1] = time.process_time()

    def seconds(self) -> list[float]:
        if self.cuda:
            if self.marks:
                self.marks[-1][1].synchronize()
            return [a.elapsed_time(b) / 1e3 for a, b in self.marks]
        return [b - a for a, b in self.marks]

    def cpu_seconds(self) -> list[float]:
        """Per pass: the process's CPU seconds in it (a CPU run; empty on a GPU)."""
        return [b - a for a, b in self.cpu]


class Readback:
    """A pass's results to the host, deferred: ``start`` queues one device-to-host copy of the
    routing decisions and tokens (into a pinned buffer, asynchronously, an event behind it);
    ``get`` waits for that event only when the scheduler needs the values, after the next
    pass is launched. On a CPU the values are read at ``get``."""

    RING = 4

    def __init__(self, device: torch.device, size: int):
        self.cuda = device.type == "cuda"
        if self.cuda:
            self.bufs = [torch.empty(size, dtype=torch.long, pin_memory=True) for _ in range(self.RING)]
        self.at = 0

    def start(self, routed, tokens):
        live = [t for t in (routed, tokens) if t is not None]
        if not live:
            return None, None, None, None
        flat = torch.cat([t.reshape(-1).to(torch.long) for t in live])
        ev = None
        if self.cuda:
            host = self.bufs[self.at][: flat.shape[0]]
            self.at = (self.at + 1) % self.RING
            host.copy_(flat, non_blocking=True)
            ev = torch.cuda.Event()
            ev.record()
            flat = host
        return flat, ev, None if routed is None else routed.shape[0], None if tokens is None else tokens.shape[0]

    @staticmethod
    def get(handle) -> tuple[list[int] | None, list[int] | None]:
        flat, ev, n_r, n_t = handle
        if flat is None:
            return None, None
        if ev is not None:
            ev.synchronize()
        vals = flat.tolist()  # host memory on a GPU (the event has completed); the pass's one read
        routed = vals[:n_r] if n_r is not None else None
        tokens = vals[n_r or 0:] if n_t is not None else None
        return routed, tokens
