"""The shared assignment-annotation vectors (tests/fixtures/assignment-vectors.json) against the
Python decoder. The NRI plugin's Go decoder is checked against the same file
(node-agent/nri/assignment/vectors_test.go), so the two cannot drift: a document one side acts on
and the other refuses would let a node enforce something other than what the extender decided."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from neuronetes import contracts as c

pytestmark = pytest.mark.unit

VECTORS_FILE = Path(__file__).resolve().parents[1] / "fixtures" / "assignment-vectors.json"
DOCUMENT: dict[str, Any] = json.loads(VECTORS_FILE.read_text())
VECTORS: list[dict[str, Any]] = DOCUMENT["vectors"]


def annotation_value(vector: dict[str, Any]) -> str:
    value: str = vector["value"]
    pad_to = vector.get("padTo")
    if pad_to is not None:
        value += " " * (pad_to - len(value.encode()))
    return value


def test_contract_constants_match() -> None:
    """The names and bounds the Go side mirrors are the ones contracts.py defines."""
    assert DOCUMENT["contract"] == {
        "annotation": c.ANNOTATION_ASSIGNED_GPUS,
        "supportedVersions": list(c.SUPPORTED_ASSIGNMENT_VERSIONS),
        "maxBytes": c.MAX_ASSIGNMENT_BYTES,
        "forbiddenEnvPrefixes": list(c.TENANT_FORBIDDEN_ENV_PREFIXES),
        "forbiddenEnvNames": list(c.TENANT_FORBIDDEN_ENV_NAMES),
        "shimLibraryPath": c.SHIM_LIBRARY_PATH,
        "shimPreloadFile": c.SHIM_PRELOAD_FILE,
        "shimControlPath": c.SHIM_CONTROL_PATH,
        "shimStatePath": c.SHIM_STATE_PATH,
    }


def test_vectors_cover_both_outcomes() -> None:
    names = [v["name"] for v in VECTORS]
    assert len(names) == len(set(names))
    assert sum(v["error"] is None for v in VECTORS) >= 10
    assert sum(v["error"] is not None for v in VECTORS) >= 50


@pytest.mark.parametrize("vector", VECTORS, ids=[v["name"] for v in VECTORS])
def test_python_decoder_agrees(vector: dict[str, Any]) -> None:
    value = annotation_value(vector)
    if vector["error"] is None:
        assignment = c.decode_assignment(value)
        assert c.decode_assignment(c.encode_assignment(assignment)) == assignment
        return
    with pytest.raises(c.AssignmentError) as info:
        c.decode_assignment(value)
    message = str(info.value)
    for fragment in vector["error"]:
        assert fragment in message, message
