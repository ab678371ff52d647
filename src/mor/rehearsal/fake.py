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

This is the one module of ``src/`` that patches anything, and it patches torch only: our own
jobs take what a rehearsal replaces as parameters (``mor.train.trainer.TrainerSeams``, the
eval, lmeval and throughput jobs' evaluator, weights reader and measure), while these are
torch's module-level functions and C++ checks, which torch offers no way to pass in: the CUDA
queries above, DDP's parameter checks and FSDP's default mesh (``fake_process_group``), and
``Tensor.pin_memory`` / ``Module.to`` on fake tensors (``engine_tensors``).
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
def free_memory(free: int, total: int):
    """``torch.cuda.mem_get_info`` answers ``(free, total)`` bytes (a GPU holding the model already)."""
    with mock.patch.object(torch.cuda, "mem_get_info", lambda *a, **k: (free, total)):
        yield


@contextlib.contextmanager
def fake_process_group(world: int):
    """torch.distributed initialised as rank 0 of ``world`` over a process group that moves no data."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if world <= 1:
        yield None
        return
    dist.init_process_group("fake", rank=0, world_size=world, store=FakeStore())
    # DDP's constructor compares and broadcasts parameter bytes in C++, which fake tensors have
    # none of; the ranks of a rehearsal hold the same model by construction
    # FSDP makes its device mesh at the first fully_shard; made under the fake mode it fails
    # (the mesh's rank table is built with data-dependent ops), so it is made here, outside it
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (world,))
    try:
        with mock.patch("torch.nn.parallel.distributed._verify_param_shape_across_processes", lambda *a, **k: None), \
                mock.patch("torch.nn.parallel.distributed._sync_module_states", lambda *a, **k: None), \
                mock.patch("torch.distributed.fsdp._fully_shard._fully_shard._init_default_mesh", lambda *a, **k: mesh):
            yield dist.group.WORLD
    finally:
        dist.destroy_process_group()


def module_to(module: torch.nn.Module, *args, **kwargs) -> torch.nn.Module:
    """``Module.to`` on fake tensors: torch swaps a fake parameter for its converted copy
    (``torch.utils.swap_tensors``), which fails while anything else refers to it ("Couldn't
    swap"); here each parameter and buffer is replaced by its converted copy instead (one copy
    per tensor, so tied weights stay tied), floating-point ones in ``dtype``, as ``to`` does."""
    device, dtype, _, _ = torch._C._nn._parse_to(*args, **kwargs)
    done: dict[int, torch.Tensor] = {}
    for m in module.modules():
        for table, param in ((m._parameters, True), (m._buffers, False)):
            for name, t in list(table.items()):
                if t is None:
                    continue
                if id(t) not in done:
                    new = t.to(device=device, dtype=dtype if t.is_floating_point() else None)
                    done[id(t)] = t if new is t else (torch.nn.Parameter(new, requires_grad=t.requires_grad)
                                                      if param else new)
                table[name] = done[id(t)]
    return module


@contextlib.contextmanager
def engine_tensors():
    """What the throughput engine does to tensors that fake ones cannot: ``Module.to`` by
    ``module_to``, and a pinned host copy (the passes' uploads on a GPU, which needs a real
    device) used unpinned."""
    with mock.patch.object(torch.Tensor, "pin_memory", lambda self, *a, **k: self), \
            mock.patch.object(torch.nn.Module, "to", module_to):
        yield


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
