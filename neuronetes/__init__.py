"""NeuroNetes: GPU scheduling for Kubernetes.

The core library: quantities, the GPU/node model, the MIG catalog and the placement
engine. Pure Python, no I/O. The operator, the scheduler extender and the node agent
live in :mod:`neuronetes.operator`, :mod:`neuronetes.extender` and :mod:`neuronetes.agent`.
"""

__version__ = "0.1.0"
