"""The NeuroNetes API (group neuronetes.io, version v1alpha1) as Python types.

`crds/` holds the CustomResourceDefinitions, the source of truth; `neuronetes.api.models` mirrors
them as msgspec Structs with the same wire names, and `tests/unit/test_crd_models.py` fails when the
two drift. `neuronetes.api.units` defines how API quantities map onto hardware.
"""
