"""The network (layer: model; imports config and the torch-free foundations only).

Vanilla, Recursive and MoR in one class (``transformer``), the routing decision every path
calls (``routing``), the router kinds and architectures (``routers``: one object each,
one registry), the routers, the KV cache, the relaxations and greedy decoding.
"""
