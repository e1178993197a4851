"""Offline checks of crds/: the rules the API server applies to a CRD, as far as they can be checked here.

The API server refuses a CRD whose schema is not *structural* (every node typed, no
properties+additionalProperties, junctors only for int-or-string, metadata unrestricted), whose
defaults do not validate, whose list-map keys are not required, or whose printer-column and scale
paths are not fields. These tests check the same, plus our own conventions: every field described,
every list and map bounded (so CEL cost estimates stay finite), every CEL message naming its field,
every ``self.a.b`` in a rule resolving to a schema field. What cannot be checked here (CEL
compilation and cost, server-side defaulting) is covered by tests/e2e/test_crds.py.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml
from apitools import (
    CRD_DIR,
    FRAGMENT_DIR,
    SEED004_DIR,
    SEED004_FILE,
    fragment_index,
    load_crds,
    load_yaml,
    openapi_schema,
)

from neuronetes.contracts import GROUP, VERSION

pytestmark = pytest.mark.unit

CRDS = load_crds()
KINDS = sorted(CRDS)

_ALLOWED_KEYS = {
    "type",
    "format",
    "description",
    "properties",
    "additionalProperties",
    "items",
    "required",
    "enum",
    "default",
    "minimum",
    "maximum",
    "minLength",
    "maxLength",
    "pattern",
    "minItems",
    "maxItems",
    "minProperties",
    "maxProperties",
    "anyOf",
    "x-kubernetes-int-or-string",
    "x-kubernetes-preserve-unknown-fields",
    "x-kubernetes-validations",
    "x-kubernetes-list-type",
    "x-kubernetes-list-map-keys",
    "x-kubernetes-map-type",
}
_INT_OR_STRING_ANYOF = [{"type": "integer"}, {"type": "string"}]
_TYPES = {"object", "array", "string", "integer", "number", "boolean"}


def walk(schema: dict[str, Any], path: str = "") -> list[tuple[str, dict[str, Any]]]:
    """Every schema node with its path (``.spec.a``, ``.spec.list[]``, ``.spec.map{}``)."""
    nodes = [(path, schema)]
    for name, prop in schema.get("properties", {}).items():
        nodes += walk(prop, f"{path}.{name}")
    if isinstance(schema.get("additionalProperties"), dict):
        nodes += walk(schema["additionalProperties"], f"{path}{{}}")
    if "items" in schema:
        nodes += walk(schema["items"], f"{path}[]")
    return nodes


def resolve(schema: dict[str, Any], dotted: str) -> dict[str, Any] | None:
    """The node at a simple JSON path such as ``.status.readyReplicas`` (None if absent)."""
    node: dict[str, Any] | None = schema
    for part in dotted.strip(".").split("."):
        if node is None:
            return None
        node = node.get("properties", {}).get(part)
    return node


def _type_ok(value: Any, node: dict[str, Any]) -> bool:
    if node.get("x-kubernetes-int-or-string"):
        return isinstance(value, int | str) and not isinstance(value, bool)
    kind = node["type"]
    return {
        "object": isinstance(value, dict),
        "array": isinstance(value, list),
        "string": isinstance(value, str),
        "integer": isinstance(value, int) and not isinstance(value, bool),
        "number": isinstance(value, int | float) and not isinstance(value, bool),
        "boolean": isinstance(value, bool),
    }[kind]


def value_errors(value: Any, node: dict[str, Any], path: str) -> list[str]:
    """OpenAPI validation of a literal value (defaults) against a schema node, without CEL."""
    if not _type_ok(value, node):
        return [f"{path}: {value!r} is not of the node's type"]
    errors = []
    if "enum" in node and value not in node["enum"]:
        errors.append(f"{path}: {value!r} not in enum")
    if isinstance(value, int | float) and not isinstance(value, bool):
        if "minimum" in node and value < node["minimum"]:
            errors.append(f"{path}: {value!r} below minimum")
        if "maximum" in node and value > node["maximum"]:
            errors.append(f"{path}: {value!r} above maximum")
    if isinstance(value, str):
        if "pattern" in node and not re.search(node["pattern"], value):
            errors.append(f"{path}: {value!r} does not match pattern")
        if "maxLength" in node and len(value) > node["maxLength"]:
            errors.append(f"{path}: {value!r} too long")
    if isinstance(value, dict):
        props = node.get("properties", {})
        for key, sub in value.items():
            if key not in props:
                errors.append(f"{path}.{key}: unknown field (would be pruned)")
            else:
                errors += value_errors(sub, props[key], f"{path}.{key}")
        errors += [f"{path}.{r}: required" for r in node.get("required", ()) if r not in value]
    return errors


# ---- identity ------------------------------------------------------------------------------------


def test_one_file_per_crd() -> None:
    files = sorted(p.name for p in CRD_DIR.glob("*"))
    assert files == sorted(f"{GROUP}_{crd['spec']['names']['plural']}.yaml" for crd in CRDS.values())


@pytest.mark.parametrize("kind", KINDS)
def test_crd_identity(kind: str) -> None:
    crd = CRDS[kind]
    assert crd["apiVersion"] == "apiextensions.k8s.io/v1"
    assert crd["kind"] == "CustomResourceDefinition"
    names = crd["spec"]["names"]
    assert crd["metadata"]["name"] == f"{names['plural']}.{GROUP}"
    assert crd["spec"]["group"] == GROUP
    assert names["singular"] == kind.lower() and names["listKind"] == f"{kind}List"
    assert names["plural"] == names["singular"] + "s"
    assert "neuronetes" in names["categories"]
    (version,) = crd["spec"]["versions"]
    assert (version["name"], version["served"], version["storage"]) == (VERSION, True, True)
    assert version["subresources"]["status"] == {}


# ---- structural schema ---------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_schema_is_structural(kind: str) -> None:
    schema = openapi_schema(CRDS[kind])
    errors = []
    assert schema["type"] == "object"
    assert set(schema["properties"]) == {"apiVersion", "kind", "metadata", "spec", "status"}
    assert schema["properties"]["metadata"] == {"type": "object"}, "metadata may not be restricted"
    for path, node in walk(schema):
        unknown = set(node) - _ALLOWED_KEYS
        if unknown:
            errors.append(f"{path}: keywords the structural schema rules do not allow here: {unknown}")
        if node.get("x-kubernetes-int-or-string"):
            if node.get("anyOf") != _INT_OR_STRING_ANYOF or "type" in node:
                errors.append(f"{path}: int-or-string must be exactly anyOf [integer, string] with no type")
            continue
        if "anyOf" in node:
            errors.append(f"{path}: logical junctors are only allowed for int-or-string")
        if node.get("type") not in _TYPES:
            errors.append(f"{path}: every node needs a type, got {node.get('type')!r}")
        if "properties" in node and "additionalProperties" in node:
            errors.append(f"{path}: properties and additionalProperties are mutually exclusive")
        if ("properties" in node or "additionalProperties" in node) and node["type"] != "object":
            errors.append(f"{path}: properties on a non-object")
        if "items" in node and node["type"] != "array":
            errors.append(f"{path}: items on a non-array")
        if node.get("type") == "array" and "items" not in node:
            errors.append(f"{path}: an array needs items")
        for name in node.get("required", ()):
            if name not in node.get("properties", {}):
                errors.append(f"{path}: required field {name!r} is not a property")
        for value in node.get("enum", ()):
            if not _type_ok(value, node):
                errors.append(f"{path}: enum value {value!r} does not match the type")
        if node.get("x-kubernetes-preserve-unknown-fields") and node.get("type") != "object":
            errors.append(f"{path}: preserve-unknown-fields only on objects")
        if node.get("x-kubernetes-map-type") and node.get("type") != "object":
            errors.append(f"{path}: map-type only on objects")
    assert errors == []


@pytest.mark.parametrize("kind", KINDS)
def test_defaults_validate_against_their_schema(kind: str) -> None:
    errors = []
    for path, node in walk(openapi_schema(CRDS[kind])):
        if "default" in node:
            errors += value_errors(node["default"], node, path)
    assert errors == []


@pytest.mark.parametrize("kind", KINDS)
def test_list_types(kind: str) -> None:
    errors = []
    for path, node in walk(openapi_schema(CRDS[kind])):
        list_type = node.get("x-kubernetes-list-type")
        if list_type is None:
            if "x-kubernetes-list-map-keys" in node:
                errors.append(f"{path}: list-map-keys without list-type map")
            continue
        if node.get("type") != "array":
            errors.append(f"{path}: list-type on a non-array")
        elif list_type == "map":
            item = node["items"]
            keys = node.get("x-kubernetes-list-map-keys") or []
            if item.get("type") != "object" or not keys:
                errors.append(f"{path}: a list map needs object items and map keys")
            for key in keys:
                if key not in item.get("required", ()) and "default" not in item["properties"].get(key, {}):
                    errors.append(f"{path}: map key {key!r} must be required or defaulted")
        elif list_type == "set":
            if node["items"].get("type") not in ("string", "integer", "number", "boolean"):
                errors.append(f"{path}: a set holds scalars")
        elif list_type != "atomic":
            errors.append(f"{path}: unknown list-type {list_type!r}")
    assert errors == []


# ---- conventions ---------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_every_field_is_documented(kind: str) -> None:
    missing = [
        path
        for path, node in walk(openapi_schema(CRDS[kind]))
        if path.startswith((".spec", ".status"))
        and not path.endswith(("[]", "{}"))
        and not str(node.get("description", "")).strip()
    ]
    assert missing == []


@pytest.mark.parametrize("kind", KINDS)
def test_lists_and_maps_are_bounded(kind: str) -> None:
    """CEL cost estimation needs bounds; unbounded lists also let one object grow without limit."""
    unbounded = [
        path
        for path, node in walk(openapi_schema(CRDS[kind]))
        if (node.get("type") == "array" and "maxItems" not in node)
        or ("additionalProperties" in node and "maxProperties" not in node)
    ]
    assert unbounded == []


_SELF_REF = re.compile(
    r"(?P<has>has\()?\b(?P<root>self|oldSelf)(?P<chain>(?:\.[A-Za-z_][A-Za-z0-9_]*)+)(?P<call>\()?"
)


def _unguarded(node: dict[str, Any], expr: str) -> list[str]:
    """References to optional fields that the rule does not guard with has() (they error when unset)."""
    refs, guards = [], set()
    for m in _SELF_REF.finditer(expr):
        parts = m["chain"].strip(".").split(".")
        if m["call"]:
            parts = parts[:-1]  # the last name is a method (size, matches, ...)
        if m["has"] and not m["call"]:
            guards.add((m["root"], tuple(parts)))
        elif parts:
            refs.append((m["root"], parts))
    missing = []
    for root, parts in refs:
        parent: dict[str, Any] | None = node
        for i, name in enumerate(parts):
            assert parent is not None
            if name not in parent.get("required", ()) and (root, tuple(parts[: i + 1])) not in guards:
                missing.append(f"{root}.{'.'.join(parts[: i + 1])}")
            parent = parent.get("properties", {}).get(name)
    return missing


@pytest.mark.parametrize("kind", KINDS)
def test_cel_rules_name_their_field_and_reference_real_fields(kind: str) -> None:
    schema = openapi_schema(CRDS[kind])
    errors = []
    for path, node in walk(schema):
        for rule in node.get("x-kubernetes-validations", ()):
            expr, message = rule["rule"], rule.get("message", "")
            if not re.match(r"(spec|status)\.[A-Za-z]", message):
                errors.append(f"{path}: message {message!r} must start with the field it is about")
            if "fieldPath" in rule and resolve(node, rule["fieldPath"]) is None:
                errors.append(f"{path}: fieldPath {rule['fieldPath']!r} is not a field")
            for m in _SELF_REF.finditer(expr):
                parts = m["chain"].strip(".").split(".")[: -1 if m["call"] else None]
                if parts and resolve(node, ".".join(parts)) is None:
                    errors.append(f"{path}: rule {expr!r} refers to {m.group(0)!r}, not a field")
            # Defaults are validated by the same rules before nested defaults apply (the API server
            # refused `default: {}` under a rule reading an unguarded defaulted field), so every
            # optional field a rule reads must be guarded by has().
            for ref in _unguarded(node, expr):
                errors.append(f"{path}: rule {expr!r} reads {ref} without has({ref})")
    assert errors == []


FUTURE_TIME_COLUMNS = {("GangReservation", "Expires")}
"""Timestamps in the future: `date` would print them as an age (``<invalid>``), so ``string``."""


@pytest.mark.parametrize("kind", KINDS)
def test_printer_columns_and_scale_paths_are_fields(kind: str) -> None:
    (version,) = CRDS[kind]["spec"]["versions"]
    schema = openapi_schema(CRDS[kind])
    errors = []
    for column in version.get("additionalPrinterColumns", ()):
        if column["jsonPath"] == ".metadata.creationTimestamp":
            assert column["type"] == "date"
            continue
        node = resolve(schema, column["jsonPath"])
        if node is None:
            errors.append(f"column {column['name']}: {column['jsonPath']} is not a field")
            continue
        want = "date" if node.get("format") == "date-time" else node.get("type", "string")
        if (kind, column["name"]) in FUTURE_TIME_COLUMNS:
            want = "string"
        if column["type"] != want:
            errors.append(f"column {column['name']}: type {column['type']} but the field is {want}")
    scale = version["subresources"].get("scale")
    if scale:
        for key in ("specReplicasPath", "statusReplicasPath"):
            node = resolve(schema, scale[key])
            if node is None or node.get("type") != "integer":
                errors.append(f"scale {key} {scale[key]} is not an integer field")
        node = resolve(schema, scale["labelSelectorPath"])
        if node is None or node.get("type") != "string":
            errors.append(f"scale labelSelectorPath {scale['labelSelectorPath']} is not a string field")
    assert errors == []


def test_agentpool_shows_what_a_user_wants() -> None:
    (version,) = CRDS["AgentPool"]["spec"]["versions"]
    columns = [c["name"] for c in version["additionalPrinterColumns"]]
    assert columns == ["Ready", "Desired", "GPUs", "Cost/h", "Phase", "Age"]
    assert version["subresources"]["scale"] == {
        "specReplicasPath": ".spec.replicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    }


def test_agentpool_has_every_seed_004_field() -> None:
    """The fields the seed names (DESIGN.md §2), at the paths the seed puts them."""
    schema = openapi_schema(CRDS["AgentPool"])
    paths = [
        "spec.gpuRequirements.count",
        "spec.gpuRequirements.type",
        "spec.gpuRequirements.memory",
        "spec.gpuRequirements.topology.locality",
        "spec.gpuRequirements.topology.minBandwidth",
        "spec.migProfile",
        "spec.minReplicas",
        "spec.maxReplicas",
        "spec.prewarmPercent",
        "spec.template",
        "spec.scheduling.priority",
        "spec.scheduling.gangScheduling.enabled",
        "spec.scheduling.gangScheduling.minMembers",
        "spec.scheduling.preemption.enabled",
        "spec.scheduling.preemption.policy",
        "spec.scheduling.costOptimization.enabled",
        "spec.scheduling.costOptimization.sloHeadroomMs",
        "spec.scheduling.costOptimization.maxCostPerHour",
        "spec.scheduling.costOptimization.spotEnabled",
        "spec.scheduling.costOptimization.spotMaxInterruptions",
        "spec.scheduling.costOptimization.fallbackModel",
        "spec.scheduling.costOptimization.fallbackTrigger.costExceeded",
        "spec.scheduling.costOptimization.fallbackTrigger.sloAtRisk",
        "spec.scheduling.costOptimization.spotStrategy.instanceTypes",
        "spec.scheduling.costOptimization.spotStrategy.onInterruption",
        "spec.scheduling.costOptimization.spotStrategy.maxSpotPercent",
        "spec.scheduling.costOptimization.interruptionThreshold.count",
        "spec.scheduling.costOptimization.interruptionThreshold.window",
        "spec.scheduling.costOptimization.interruptionThreshold.action",
        "spec.scheduling.carbonAware.enabled",
        "spec.scheduling.carbonAware.preferredRegions",
        "spec.scheduling.carbonAware.timeShifting.enabled",
        "spec.scheduling.carbonAware.timeShifting.cleanEnergyHours",
        "spec.scheduling.carbonAware.maxCarbonIntensity",
        "spec.scheduling.dataLocality.vectorStoreAffinity",
        "spec.scheduling.dataLocality.localityWeight",
        "spec.scheduling.dataLocality.antiAffinity",
        "spec.scheduling.cacheAware.enabled",
        "spec.scheduling.cacheAware.cacheHitWeight",
        "spec.scheduling.cacheAware.preloadStrategy.nodes.labelSelector",
        "spec.scheduling.cacheAware.preloadStrategy.minCachedReplicas",
        "spec.scheduling.fastScheduling.enabled",
        "spec.scheduling.fastScheduling.maxNodesToScore",
        "spec.autoscaling.ttftMs",
        "spec.autoscaling.tokensPerSecond",
        "spec.autoscaling.cooldownSeconds",
    ]
    assert [p for p in paths if resolve(schema, p) is None] == []
    topology = resolve(schema, "spec.gpuRequirements.topology.locality")
    assert topology is not None and topology["enum"] == ["same-node", "same-socket", "nvlink", "any"]
    weight = resolve(schema, "spec.scheduling.dataLocality.localityWeight")
    assert weight is not None and weight["enum"] == ["low", "medium", "high"]


def test_gpunode_health_is_seed_002_state_machine() -> None:
    from neuronetes.model import GpuHealth

    health = resolve(openapi_schema(CRDS["GPUNode"]), "status.gpus")
    assert health is not None
    assert health["items"]["properties"]["health"]["enum"] == [h.value for h in GpuHealth]


def test_yaml_loader_refuses_duplicate_keys() -> None:
    """Why the seed's bad/good snippets are split into two fragments: one document, one key."""
    assert load_yaml("a: 1\nb: {c: 2}\n") == {"a": 1, "b": {"c": 2}}
    with pytest.raises(yaml.constructor.ConstructorError, match="duplicate key 'gpuRequirements'"):
        load_yaml("gpuRequirements:\n  count: 4\ngpuRequirements:\n  count: 2\n")


# ---- seed 004 fixtures are verbatim and complete -------------------------------------------------

seed_text = SEED004_FILE.read_text() if SEED004_FILE.exists() else None
needs_seed = pytest.mark.skipif(seed_text is None, reason=f"{SEED004_FILE} is not there")


@needs_seed
def test_every_seed_fixture_is_verbatim() -> None:
    assert seed_text is not None
    files = sorted(SEED004_DIR.glob("*.yaml")) + sorted(FRAGMENT_DIR.glob("*.yaml"))
    assert [p.name for p in files if p.read_text() not in seed_text] == []


@needs_seed
def test_every_seed_yaml_block_has_fixtures() -> None:
    assert seed_text is not None
    blocks = re.findall(r"```yaml\n(.*?)```", seed_text, re.S)
    complete = {p.read_text() for p in SEED004_DIR.glob("*.yaml")}
    fragments = [(FRAGMENT_DIR / f).read_text() for f, _ in fragment_index()]
    uncovered = []
    for block in blocks:
        if block in complete:
            continue
        # A snippet is covered when its fixture slices, in order, make up the whole block.
        rest = block
        for frag in fragments:
            if rest.startswith(frag):
                rest = rest[len(frag) :].lstrip("\n")
        if rest.strip():
            uncovered.append(block[:60])
    assert uncovered == []
    assert len(complete) == sum(1 for b in blocks if b.startswith("apiVersion:"))
