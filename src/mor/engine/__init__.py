"""Continuous depth-wise batching inference engine (App. E), in nano-vllm's shape:
sequence.py (a request and the sequence serving it), scheduler.py (schedule, preempt,
postprocess), blocks.py (the block manager: paged KV bookkeeping), cache.py (the KV pool on
the device, prefill writes included), step.py (the model passes), engine.py (the loop); check.py compares the state passes leave
behind between two paths (graphs on / off)."""

from mor.engine.engine import Engine, EngineResult
from mor.engine.sequence import Request

__all__ = ["Engine", "EngineResult", "Request"]
