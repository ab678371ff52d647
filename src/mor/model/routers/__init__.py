"""Router kinds and router architectures, each one object registered once (``registry``).

A *kind* (``base.RouterKind``: expert-choice, token-choice) answers everything the rest of
the suite asks about a way of routing: its config checks, its routers and training forward
(with its losses), its decision before recursion 1 at inference, the share of tokens each
recursion gets (FLOPs, memory, KV layout), whether the engine reads a decision back, and its
text in an exported model card. An *architecture* (``arch.RouterArch``: linear, mlp,
wide_mlp) answers its parameter count and builds its head. docs/routers.md says how to add
one. This ``__init__`` imports nothing, so ``mor.config`` reads the registry's names cheaply.
"""
