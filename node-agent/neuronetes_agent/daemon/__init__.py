"""The node agent process: GPU discovery, health, publication to Kubernetes, fleet mode, metrics.

Its modules import each other relatively, so mypy checks them as the package ``daemon`` (the
folder ``node-agent/`` is installed as ``neuronetes_agent``, a mapping mypy cannot follow), the way
``extender/`` is checked as ``extender``. docs/gpu-health.md describes what the agent does.
"""
