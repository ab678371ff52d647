"""Continuous depth-wise batching inference engine (App. E): scheduler.py (who runs),
cache.py (the static per-slot KV cache), step.py (the model step), engine.py (the loop)."""

from mor.engine.engine import Engine, EngineResult
from mor.engine.scheduler import Request

__all__ = ["Engine", "EngineResult", "Request"]
