"""NeuroNetes: GPU scheduling for Kubernetes.

The core library: quantities, the GPU/node model, the MIG catalog and the placement
engine. Pure Python, no I/O. The operator, the scheduler extender and the node agent
live in :mod:`neuronetes_operator`, :mod:`neuronetes_extender` and :mod:`neuronetes_agent`.
"""

__version__ = "0.1.0"
