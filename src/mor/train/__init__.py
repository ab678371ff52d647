"""Training (layer: domain; imports model, data and the foundations, never the launcher).

``trainer`` (the resumable loop), ``checkpoint``, ``schedule`` (WSD), ``parallel`` (DDP and
FSDP trainers once a process group exists) and ``job`` (the ``train`` job kind).
"""
