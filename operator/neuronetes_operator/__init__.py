"""NeuroNetes operator (kopf): reconciles AgentPool, GPUSlice and ToolBinding; admission webhook."""

import threading

CONVERT_LOCK = threading.Lock()
"""Held around msgspec conversions in worker threads: msgspec 0.22 crashed the operator process
(a segfault in msgspec._core) when threads converted the same Struct types for the first time at
once. The conversions are CPU-bound, so the GIL serialises them anyway. Held only around a
conversion (decoding an object, encoding a status), never across work that grows with a pool's
replicas: building or checking its pods, planning, computing its status."""
