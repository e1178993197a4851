"""The Python models match the CRDs field for field, and the seed 004 examples decode into them.

The drift test walks each CRD's openAPIV3Schema beside ``msgspec.inspect.type_info`` of its model and
fails on a field present on one side only, a type, enum or format mismatch, a default that differs,
a required field that is optional on the other side, or an OpenAPI bound (minimum, maximum, lengths,
pattern) that the model does not enforce identically.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

import msgspec
import msgspec.inspect as mi
import pytest
from apitools import Example, invalid_examples, load_crds, openapi_schema, seed_examples

from neuronetes import mig
from neuronetes.api import models
from neuronetes.contracts import API_VERSION, GROUP, VERSION
from neuronetes.quantity import QuantityError, parse_quantity

pytestmark = pytest.mark.unit

CRDS = load_crds()


def _strip_optional(t: mi.Type) -> tuple[mi.Type, bool]:
    if isinstance(t, mi.UnionType) and any(isinstance(u, mi.NoneType) for u in t.types):
        rest = tuple(u for u in t.types if not isinstance(u, mi.NoneType))
        return (rest[0] if len(rest) == 1 else mi.UnionType(rest)), True
    return t, False


def _bounds(schema: dict[str, Any], t: mi.Type, path: str, errors: list[str]) -> None:
    """The model's msgspec constraints equal the schema's OpenAPI bounds, keyword for keyword."""
    pairs: list[tuple[str, Any, Any]] = []
    if isinstance(t, mi.IntType | mi.FloatType):
        pairs += [("minimum", schema.get("minimum"), t.ge), ("maximum", schema.get("maximum"), t.le)]
        pairs += [("exclusive bounds", None, t.gt), ("exclusive bounds", None, t.lt)]
        pairs += [("multipleOf", schema.get("multipleOf"), t.multiple_of)]
    elif isinstance(t, mi.StrType):
        pairs += [("pattern", schema.get("pattern"), t.pattern)]
        pairs += [("minLength", schema.get("minLength"), t.min_length)]
        pairs += [("maxLength", schema.get("maxLength"), t.max_length)]
    elif isinstance(t, mi.ListType):
        pairs += [("minItems", schema.get("minItems"), t.min_length)]
        pairs += [("maxItems", schema.get("maxItems"), t.max_length)]
    elif isinstance(t, mi.DictType):
        pairs += [("minProperties", schema.get("minProperties"), t.min_length)]
        pairs += [("maxProperties", schema.get("maxProperties"), t.max_length)]
    for name, want, have in pairs:
        if want != have:
            errors.append(f"{path}: {name} is {want!r} in the CRD but {have!r} in the model")


def _compare(schema: dict[str, Any], t: mi.Type, path: str, errors: list[str]) -> None:
    """Compare one schema node with one (non-optional) model type."""
    if schema.get("x-kubernetes-int-or-string"):
        kinds = {type(u) for u in t.types} if isinstance(t, mi.UnionType) else {type(t)}
        if kinds != {mi.IntType, mi.StrType}:
            errors.append(f"{path}: int-or-string in the CRD but {t} in the model")
            return
        assert isinstance(t, mi.UnionType)
        (s,) = (u for u in t.types if isinstance(u, mi.StrType))
        _bounds(schema, s, path, errors)
        return
    kind = schema.get("type")
    if "enum" in schema:
        if not isinstance(t, mi.LiteralType) or Counter(t.values) != Counter(schema["enum"]):
            errors.append(f"{path}: enum {schema['enum']} in the CRD but {t} in the model")
        return
    if kind == "integer":
        if not isinstance(t, mi.IntType):
            errors.append(f"{path}: integer in the CRD but {t} in the model")
            return
    elif kind == "number":
        if not isinstance(t, mi.FloatType):
            errors.append(f"{path}: number in the CRD but {t} in the model")
            return
    elif kind == "boolean":
        if not isinstance(t, mi.BoolType):
            errors.append(f"{path}: boolean in the CRD but {t} in the model")
        return
    elif kind == "string":
        if schema.get("format") == "date-time":
            if not isinstance(t, mi.DateTimeType):
                errors.append(f"{path}: date-time in the CRD but {t} in the model")
            return
        if "format" in schema:
            errors.append(f"{path}: format {schema['format']!r} has no model mapping")
            return
        if not isinstance(t, mi.StrType):
            errors.append(f"{path}: string in the CRD but {t} in the model")
            return
    elif kind == "array":
        if not isinstance(t, mi.ListType):
            errors.append(f"{path}: array in the CRD but {t} in the model")
            return
        _compare(schema["items"], t.item_type, f"{path}[]", errors)
    elif kind == "object":
        if "properties" in schema:
            if not isinstance(t, mi.StructType):
                errors.append(f"{path}: object with properties in the CRD but {t} in the model")
                return
            _compare_struct(schema, t, path, errors)
            return
        if not isinstance(t, mi.DictType) or not isinstance(t.key_type, mi.StrType):
            errors.append(f"{path}: map in the CRD but {t} in the model")
            return
        if "additionalProperties" in schema:
            _compare(schema["additionalProperties"], t.value_type, f"{path}{{}}", errors)
        elif not isinstance(t.value_type, mi.AnyType):
            errors.append(f"{path}: free-form object in the CRD but {t} in the model")
    else:
        errors.append(f"{path}: schema type {kind!r} has no model mapping")
        return
    _bounds(schema, t, path, errors)


def _compare_struct(schema: dict[str, Any], t: mi.StructType, path: str, errors: list[str]) -> None:
    if not t.forbid_unknown_fields:
        errors.append(f"{path}: {t.cls.__name__} must forbid unknown fields (the API server prunes them)")
    props: dict[str, Any] = schema["properties"]
    fields = {f.encode_name: f for f in t.fields}
    for name in sorted(props.keys() - fields.keys()):
        errors.append(f"{path}.{name}: in the CRD, missing from {t.cls.__name__}")
    for name in sorted(fields.keys() - props.keys()):
        errors.append(f"{path}.{name}: in {t.cls.__name__}, missing from the CRD")
    required = set(schema.get("required", ()))
    for name in sorted(props.keys() & fields.keys()):
        prop, f, where = props[name], fields[name], f"{path}.{name}"
        inner, optional = _strip_optional(f.type)
        if name in required:
            if not f.required or optional:
                errors.append(f"{where}: required in the CRD but optional in the model")
        elif "default" in prop:
            if f.required or optional:
                errors.append(
                    f"{where}: defaulted by the API server, so the model must default it (not None)"
                )
            else:
                _compare_default(prop["default"], f, inner, where, errors)
        elif f.required or not optional or f.default is not None:
            errors.append(
                f"{where}: optional without default in the CRD; the model must be `T | None = None`"
            )
        _compare(prop, inner, where, errors)


def _compare_default(want: Any, f: mi.Field, t: mi.Type, where: str, errors: list[str]) -> None:
    if f.default_factory is not msgspec.NODEFAULT:
        have = f.default_factory()
        if not isinstance(want, dict) or have != msgspec.convert(want, f.default_factory):
            errors.append(f"{where}: default {want!r} in the CRD, {have!r} in the model")
        return
    have = f.default
    if type(want) is bool or type(have) is bool:
        same = type(want) is type(have) and want == have
    else:
        same = want == have and type(want) in (int, float, str) and type(have) in (int, float, str)
    if not same:
        errors.append(f"{where}: default {want!r} in the CRD, {have!r} in the model")


def drift(kind: str) -> list[str]:
    """Every difference between the CRD of ``kind`` and its model."""
    schema = openapi_schema(CRDS[kind])
    root = mi.type_info(models.RESOURCES[kind].model)
    assert isinstance(root, mi.StructType)
    errors: list[str] = []
    fields = {f.encode_name: f for f in root.fields}
    if set(fields) != set(schema["properties"]):
        errors.append(f"top-level fields differ: CRD {sorted(schema['properties'])}, model {sorted(fields)}")
    for part in ("spec", "status"):
        if part in fields and part in schema["properties"]:
            inner, _ = _strip_optional(fields[part].type)
            _compare(schema["properties"][part], inner, part, errors)
    return errors


# ---- the drift test ------------------------------------------------------------------------------


def test_every_crd_has_a_model_and_every_model_a_crd() -> None:
    assert set(CRDS) == set(models.RESOURCES)


@pytest.mark.parametrize("kind", sorted(models.RESOURCES))
def test_model_matches_crd(kind: str) -> None:
    assert drift(kind) == []


@pytest.mark.parametrize("kind", sorted(models.RESOURCES))
def test_resource_table_matches_crd(kind: str) -> None:
    crd, res = CRDS[kind], models.RESOURCES[kind]
    assert crd["metadata"]["name"] == res.crd_name
    assert crd["spec"]["group"] == GROUP
    assert crd["spec"]["names"]["plural"] == res.plural
    assert crd["spec"]["scope"] == ("Namespaced" if res.namespaced else "Cluster")
    assert [v["name"] for v in crd["spec"]["versions"]] == [VERSION]
    assert models.decode({"kind": kind, "spec": _minimal_spec(kind)}, res.model).api_version == API_VERSION


def _minimal_spec(kind: str) -> dict[str, Any]:
    if kind == "GPUSlice":
        return {"memory": "1Gi"}
    if kind == "GangReservation":
        return {"groupName": "g", "size": 1, "expiresAt": "2030-01-01T00:00:00Z"}
    return {}


class _Drifted(models._Object):
    count: int = 1
    extra: str | None = None


def test_drift_detects_each_kind_of_difference() -> None:
    """The walker itself: a field on one side only, a type, a default, a bound, an enum."""
    errors: list[str] = []
    schema = {
        "type": "object",
        "properties": {
            "count": {"type": "integer", "default": 2, "minimum": 1},
            "missing": {"type": "string"},
        },
    }
    t = mi.type_info(_Drifted)
    assert isinstance(t, mi.StructType)
    _compare_struct(schema, t, "spec", errors)
    text = "\n".join(errors)
    assert "spec.missing: in the CRD, missing from _Drifted" in text
    assert "spec.extra: in _Drifted, missing from the CRD" in text
    assert "spec.count: default 2 in the CRD, 1 in the model" in text
    assert "spec.count: minimum is 1 in the CRD but None in the model" in text
    errors = []
    _compare({"type": "string", "enum": ["a", "b"]}, mi.type_info(str), "x", errors)
    _compare({"type": "integer"}, mi.type_info(float), "y", errors)
    assert len(errors) == 2


# ---- seed 004 examples decode --------------------------------------------------------------------

SEED = seed_examples()


@pytest.mark.parametrize("example", SEED, ids=[e.name for e in SEED])
def test_seed_example_decodes(example: Example) -> None:
    obj = example.obj
    model = models.RESOURCES[obj["kind"]].model
    decoded = models.decode(obj, model)
    assert decoded.api_version == API_VERSION
    # Round trip: what the model encodes decodes to the same object.
    assert models.decode(models.encode(decoded), model) == decoded


def test_seed_examples_mean_what_their_authors_meant() -> None:
    by_name = {e.name: models.decode(e.obj, models.RESOURCES[e.obj["kind"]].model) for e in SEED}
    tp = by_name["agentpool-tensor-parallel-pool"]
    assert isinstance(tp, models.AgentPool)
    req = tp.spec.gpu_requirements
    assert (req.count, req.type, req.topology.locality, req.topology.min_bandwidth) == (
        8,
        "A100",
        "same-node",
        "600Gi",
    )
    small = by_name["agentpool-small-model-pool"]
    assert isinstance(small, models.AgentPool)
    assert small.spec.mig_profile == "1g.5gb" and small.spec.gpu_requirements.count == 1
    spot = by_name["agentpool-spot-pool"]
    assert isinstance(spot, models.AgentPool) and spot.spec.scheduling is not None
    cost = spot.spec.scheduling.cost_optimization
    assert cost is not None and cost.spot_strategy is not None and cost.interruption_threshold is not None
    assert cost.spot_strategy.max_spot_percent == 80
    assert cost.interruption_threshold.window == "1h"
    queue = by_name["toolbinding-queue-binding"]
    assert isinstance(queue, models.ToolBinding)
    assert queue.spec.queue_config.autoscale_on_lag and queue.spec.queue_config.max_lag_threshold == 100
    cached = by_name["agentpool-cached-pool"]
    assert isinstance(cached, models.AgentPool) and cached.spec.scheduling is not None
    assert cached.spec.scheduling.cache_aware is not None
    assert cached.spec.scheduling.cache_aware.cache_hit_weight == 0.3


def test_defaults_fill_like_the_api_server() -> None:
    pool = models.decode({"kind": "AgentPool", "metadata": {"name": "p"}}, models.AgentPool)
    assert pool.spec.min_replicas == 1 and pool.spec.prewarm_percent == 0
    assert pool.spec.gpu_requirements.count == 1 and pool.spec.gpu_requirements.topology.locality == "any"
    s = models.decode({"kind": "GPUSlice", "spec": {"memory": "10Gi"}}, models.GPUSlice)
    assert (s.spec.compute_percent, s.spec.qos_class, s.spec.priority) == (100, "Burstable", 0)


def test_encode_uses_wire_names_and_omits_defaults() -> None:
    node = models.GPUNode(
        metadata={"name": "n1"},
        status=models.GPUNodeStatus(
            healthy_gpus=1,
            gpus=[
                models.GpuInfo(
                    uuid="GPU-1", index=0, memory_mib=81920, nvlink_bandwidth_gbps=600.0, health="Available"
                )
            ],
        ),
    )
    out = models.encode(node)
    assert out["apiVersion"] == API_VERSION and out["kind"] == "GPUNode"
    assert out["status"] == {
        "healthyGPUs": 1,
        "gpus": [
            {
                "uuid": "GPU-1",
                "index": 0,
                "memoryMiB": 81920,
                "nvlinkBandwidthGBps": 600.0,
                "health": "Available",
            }
        ],
    }
    assert "status" not in models.encode(models.AgentPool())


@pytest.mark.parametrize(
    ("kind", "spec", "where"),
    [
        ("AgentPool", {"prewarmPercent": 101}, "$.spec.prewarmPercent"),
        ("AgentPool", {"gpuRequirements": {"memory": "lots"}}, "$.spec.gpuRequirements.memory"),
        ("AgentPool", {"migProfile": "1g5gb"}, "$.spec.migProfile"),
        ("AgentPool", {"gpuRequirements": {"topology": {"locality": "rack"}}}, "locality"),
        ("AgentPool", {"unknownField": 1}, "unknownField"),
        (
            "AgentPool",
            {"autoscaling": {"behavior": {"saturation": {"kvCacheUsage": 1.5}}}},
            "$.spec.autoscaling.behavior.saturation.kvCacheUsage",
        ),
        (
            "AgentPool",
            {"autoscaling": {"metrics": {"queries": {"waitingRequests": "rate(x[1m])"}}}},
            "waitingRequests",
        ),
        (
            "AgentPool",
            {"autoscaling": {"metrics": {"source": "datadog"}}},
            "$.spec.autoscaling.metrics.source",
        ),
        ("GPUSlice", {"memory": "1Gi", "qosClass": "Gold"}, "$.spec.qosClass"),
        ("GPUSlice", {"computePercent": 5}, "memory"),
    ],
)
def test_model_refuses_what_the_schema_refuses(kind: str, spec: dict[str, Any], where: str) -> None:
    with pytest.raises(msgspec.ValidationError, match=r".*") as err:
        models.decode({"kind": kind, "spec": spec}, models.RESOURCES[kind].model)
    assert where in str(err.value)


# ---- invalid fixtures agree with the CRDs --------------------------------------------------------

INVALID = invalid_examples()


def _rule_messages(node: Any) -> set[str]:
    found: set[str] = set()
    if isinstance(node, dict):
        for rule in node.get("x-kubernetes-validations", ()):
            found.add(rule["message"])
        for value in node.values():
            found |= _rule_messages(value)
    elif isinstance(node, list):
        for value in node:
            found |= _rule_messages(value)
    return found


def test_there_are_enough_invalid_fixtures() -> None:
    assert len(INVALID) >= 10
    assert {e.obj["kind"] for e in INVALID} == set(models.RESOURCES)


@pytest.mark.parametrize("example", INVALID, ids=[e.name for e in INVALID])
def test_invalid_fixture_is_consistent(example: Example) -> None:
    """Each expectation names a field; a CEL one quotes a rule's message, any other one the model refuses."""
    obj = example.obj
    assert obj["apiVersion"] == API_VERSION and obj["kind"] in models.RESOURCES
    assert "spec." in example.expect, "the expected error must name the field"
    messages = _rule_messages(openapi_schema(CRDS[obj["kind"]]))
    if any(example.expect in m for m in messages):
        # A CEL rule: the model alone cannot see it, the API server must refuse it (e2e).
        return
    with pytest.raises(msgspec.ValidationError):
        models.decode(obj, models.RESOURCES[obj["kind"]].model)


# ---- patterns agree with the core library --------------------------------------------------------


def test_mig_profile_pattern_accepts_every_catalog_profile() -> None:
    names = {p.name for catalog in mig.catalogs() for p in catalog}
    assert names, "the MIG catalog is empty"
    for name in names:
        assert re.search(models.MIG_PROFILE_PATTERN, name), name
        assert mig.is_valid_profile_name(name)
    for bad in ("1g5gb", "0g.5gb", "1g.5GB", "7g.40gb+xx", "", "1g.5gb "):
        assert not re.search(models.MIG_PROFILE_PATTERN, bad), bad


@pytest.mark.parametrize(
    "text", ["1", "0.5", "500m", "16Gi", "1.5Ti", "2e3", "1E-3", "+1k", "-5Gi", ".5", "5.", "1n", "600Gi"]
)
def test_quantity_pattern_accepts_what_the_quantity_parser_accepts(text: str) -> None:
    parse_quantity(text)
    assert re.search(models.QUANTITY_PATTERN, text)


@pytest.mark.parametrize("text", ["lots", "1GB", "1gi", "Gi", "1.2.3", "1 Gi", "", "1e", "0x10"])
def test_quantity_pattern_refuses_what_the_quantity_parser_refuses(text: str) -> None:
    with pytest.raises(QuantityError):
        parse_quantity(text)
    assert not re.search(models.QUANTITY_PATTERN, text)
