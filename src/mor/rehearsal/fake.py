"""Fake devices: torch's FakeTensorMode plus what a job asks a real GPU that a fake one cannot answer.

Under ``fake_device(...)`` a job builds its model, optimizer and batches as fake tensors: shapes,
dtypes, devices and storage sizes are real, no kernel runs. Four things need a stand-in or a fixed path:

* CUDA queries (``is_bf16_supported``, ``get_device_properties``, ``mem_get_info``,
  ``current_device``, and autocast's own check): answered for the preset's GPU, so
  ``autocast("cuda")`` stays on (it turns itself off when CUDA is unavailable) and
  ``micro_batch: auto`` sizes the batch from the preset's memory exactly as on the GPU.
  ``torch.cuda.is_available`` stays False: fake tensors would make a real CUDA context.
* A scalar read (``.item()``, ``float(t)``: ``aten._local_scalar_dense``) has no value on a
  fake tensor; it returns 1.0, so a loss or gradient norm reads as finite.
* FlexAttention traces its mask's joint graph through the autograd engine, which a fake CUDA
  device cannot run (PyTorch issue #92627), and has no CPU backward: masked attention (KV
  sharing, prefix) takes the chunked SDPA path under ``fake_device``
  (``mor.model.flex.masked_path_override``), so the rehearsal measures that path, not the
  FlexAttention kernel a CUDA training run takes (docs/rehearsal.md).
* ``OpTrace`` remembers the last op dispatched, so a failure (a device mismatch, a dtype error,
  an op without a kernel for the device) is raised as ``RehearsalError`` naming the op.
"""

from __future__ import annotations

import contextlib
from types import SimpleNamespace
from unittest import mock

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

from mor.model.flex import masked_path_override

GiB = 1024**3


class RehearsalError(RuntimeError):
    """A job failed on fake tensors: names the run, the job and the op it failed in."""

    def __init__(self, run_id: str, job: str, op: str, cause: BaseException):
        self.run_id, self.job, self.op = run_id, job, op
        first = str(cause).strip().splitlines()[0] if str(cause).strip() else type(cause).__name__
        super().__init__(f"{run_id} / {job}: failed in {op}: {type(cause).__name__}: {first}")


class OpTrace(TorchDispatchMode):
    """Records the last aten op on its way down to the fake mode; answers scalar reads with 1.0."""

    def __init__(self):
        super().__init__()
        self.last = "(no op yet)"
        self.failed = ""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.last = str(func)
        if func is torch.ops.aten._local_scalar_dense.default:
            t = args[0]
            return False if t.dtype == torch.bool else (1 if not t.dtype.is_floating_point else 1.0)
        try:
            return func(*args, **(kwargs or {}))
        except Exception:
            self.failed = self.failed or str(func)  # the first op that raised, not one run while unwinding
            raise


@contextlib.contextmanager
def cuda_queries(gpu_gib: float, devices: int = 1):
    """CUDA's device queries answered for ``devices`` GPUs of ``gpu_gib`` GiB (no context is made)."""
    props = SimpleNamespace(total_memory=int(gpu_gib * GiB), name="rehearsal GPU", major=9, minor=0,
                            multi_processor_count=132)
    free = (int(gpu_gib * GiB), int(gpu_gib * GiB))
    with contextlib.ExitStack() as stack:
        for name, value in (("is_bf16_supported", lambda *a, **k: True),
                            ("get_device_properties", lambda *a, **k: props), ("device_count", lambda: devices),
                            ("current_device", lambda: 0), ("mem_get_info", lambda *a, **k: free),
                            ("set_device", lambda *a, **k: None), ("empty_cache", lambda: None),
                            ("synchronize", lambda *a, **k: None)):
            stack.enter_context(mock.patch.object(torch.cuda, name, value))
        # a fake CUDA tensor would make a real one first when CUDA is said to be there
        stack.enter_context(mock.patch("torch._subclasses.fake_tensor.init_gpu_context", lambda device: None))
        # autocast("cuda") asks the C++ side whether CUDA exists; tell it the fake one does
        stack.enter_context(mock.patch("torch.cuda.amp.common.amp_definitely_not_available", lambda: False))
        yield props


@contextlib.contextmanager
def fake_device(run_id: str, job: str, device: str = "cpu", gpu_gib: float = 80.0, devices: int = 1):
    """Run the body on fake tensors; a failure inside is re-raised as ``RehearsalError``.

    ``device`` 'cuda' also answers the CUDA queries (``cuda_queries``); it needs a CUDA build of
    torch (the CPU build has no CUDA kernels to ask for shapes: ``gather`` fails there)."""
    trace = OpTrace()
    with contextlib.ExitStack() as stack:
        if device == "cuda":
            stack.enter_context(cuda_queries(gpu_gib, devices))
        stack.enter_context(masked_path_override("sdpa"))  # the path the rehearsal measures (docstring)
        stack.enter_context(FakeTensorMode(allow_non_fake_inputs=True))
        stack.enter_context(trace)
        try:
            yield trace
        except RehearsalError:
            raise
        except Exception as e:  # noqa: BLE001 - any failure of the job is the rehearsal's finding
            raise RehearsalError(run_id, job, trace.failed or trace.last, e) from e
