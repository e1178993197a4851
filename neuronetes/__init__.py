"""NeuroNetes: GPU scheduling for Kubernetes.

The core library (quantities, the GPU/node model, the MIG catalog, the placement engine, the
contracts, node profiles and the reading of Node objects, the simulator), and on top of the
components the CLI (`neuronetes.cli`), the dev cluster (`neuronetes.devcluster`) and the GPU
validation (`neuronetes.gpuvalidate`). The operator, the scheduler extender and the node agent live
in :mod:`neuronetes_operator`, :mod:`neuronetes_extender` and :mod:`neuronetes_agent`; the layers
are checked by ``lint-imports`` (README, "Architecture").
"""

__version__ = "0.1.0"
