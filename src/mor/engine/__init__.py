"""Continuous depth-wise batching inference engine (App. E): scheduler.py (who runs),
blocks.py (the paged KV bookkeeping), cache.py (the KV pool on the device), step.py (the
model passes), engine.py (the loop)."""

from mor.engine.engine import Engine, EngineResult
from mor.engine.scheduler import Request

__all__ = ["Engine", "EngineResult", "Request"]
