"""The node agent process: GPU discovery, health, publication to Kubernetes, fleet mode, metrics.

`node.NodeAgent` is a thin coordinator over one module per job (docs/gpu-health.md, "The agent's
modules"); docs/gpu-health.md describes what the agent does.
"""
