"""Keep freed CPU memory in the process, so training steps stop page-faulting.

glibc serves every allocation above its mmap threshold (128 KiB, raised at most to 32 MiB)
with a fresh ``mmap`` and gives it back with ``munmap`` on free. A CPU training step
allocates and frees its activations, logits and gradients every step: each of those
tensors is then faulted in page by page again. Measured on the 2-core VM this suite is
developed on (``small`` scale, batch 16 x 128): about 32,000 minor page faults per step,
and 20-35 % of the step time; a 32 MiB ``exp`` took 29 ms instead of 10 ms.

Raising the mmap and trim thresholds (``mallopt``, the same knobs as the
``MALLOC_MMAP_THRESHOLD_`` / ``MALLOC_TRIM_THRESHOLD_`` environment variables) makes glibc
keep freed blocks on its heap and reuse them: after the first steps a step faults no new
pages. The cost is that the process keeps its peak heap until it exits, which a training
or eval job does anyway. GPU memory is untouched (the CUDA caching allocator already
reuses blocks).

No-op off glibc (macOS, musl), when the user set either environment variable themselves,
or with ``MOR_CPU_ALLOCATOR=default``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

M_TRIM_THRESHOLD = -1  # glibc <malloc.h> parameter numbers
M_MMAP_THRESHOLD = -3

MMAP_THRESHOLD = 1 << 30  # bytes: blocks below 1 GiB come from the reusable heap
TRIM_THRESHOLD = (1 << 31) - 1  # bytes: never hand free heap top back (largest C int)

_tuned = False


def _glibc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if not name:
        return None
    try:
        libc = ctypes.CDLL(name)
        libc.gnu_get_libc_version  # only glibc has it (and mallopt with these numbers)
    except (OSError, AttributeError):
        return None
    return libc


def tune_cpu_allocator() -> bool:
    """Apply the thresholds once per process; True when they are in effect."""
    global _tuned
    if _tuned:
        return True
    if os.environ.get("MOR_CPU_ALLOCATOR", "tuned") == "default":
        return False
    if "MALLOC_MMAP_THRESHOLD_" in os.environ or "MALLOC_TRIM_THRESHOLD_" in os.environ:
        return False  # the user chose their own glibc settings
    libc = _glibc()
    if libc is None:
        return False
    _tuned = bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    return _tuned
