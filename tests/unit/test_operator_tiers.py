"""Priority tiers: how an AgentPool's priority maps onto the admin's tiers, and who may use which.

A tenant's pool never mints a PriorityClass (docs/agentpool.md "Priority tiers"): its priority maps
onto a tier the cluster admin defines, and a tier its namespace may not use is refused at admission
naming the field; so is a pod naming a tier's PriorityClass directly.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgspec
import pytest
import webhook_cases
import yaml
from webhook_cases import gpu_pod

from neuronetes.api.models import AgentPool, decode
from neuronetes_operator import pods as pods_module
from neuronetes_operator.launch import POD_MATCH_CONDITION, operator_rbac, tiers_file
from neuronetes_operator.pods import desired_pods
from neuronetes_operator.policy import resolve
from neuronetes_operator.tier_admission import NamespaceReadError, review_pod_priority, review_pool_priority
from neuronetes_operator.tiers import (
    DEFAULT_TIERS,
    NamespaceSelector,
    PriorityTier,
    TierError,
    load_tiers,
    pool_priority,
    priority_classes,
    selector_matches,
    with_tier,
)
from neuronetes_operator.webhook import ClusterReads, admission_response

pytestmark = pytest.mark.unit

UID = "11111111-2222-3333-4444-555555555555"


def pool(scheduling: str, namespace: str = "team-a") -> dict[str, Any]:
    """An AgentPool with `scheduling` (flow YAML) in `namespace`, as the API server holds it."""
    obj: dict[str, Any] = yaml.safe_load(webhook_cases.pool("p", f"scheduling: {scheduling}"))
    obj["metadata"].update(namespace=namespace, uid=UID)
    return obj


def scheduling(text: str) -> Any:
    return decode(pool(text), AgentPool).spec.scheduling


def granted(
    tier: str, namespaces: tuple[str, ...] = (), selector: NamespaceSelector | None = None
) -> tuple[PriorityTier, ...]:
    """The default tiers with `tier` granted to `namespaces` and/or by `selector`."""
    return tuple(
        msgspec.structs.replace(t, namespaces=namespaces, namespace_selector=selector)
        if t.name == tier
        else t
        for t in DEFAULT_TIERS
    )


# ---- the mapping --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "tier", "klass"),
    [
        ("{priority: 1000}", "high", "neuronetes-high-nopreempt"),
        ("{priority: 1000, preemption: {enabled: true}}", "high", "neuronetes-high"),
        ("{priority: 5000, preemption: {enabled: true}}", "high", "neuronetes-high"),
        ("{priority: 999}", "default", "neuronetes-default"),
        ("{priority: 100}", "default", "neuronetes-default"),
        ("{priority: 1000000000}", "critical", "neuronetes-critical-nopreempt"),
        ("{priorityTier: critical, preemption: {enabled: true}}", "critical", "neuronetes-critical"),
        ("{priorityTier: default}", "default", "neuronetes-default"),
    ],
)
def test_a_priority_maps_to_the_highest_tier_at_or_below_it(spec: str, tier: str, klass: str) -> None:
    chosen = pool_priority(scheduling(spec), DEFAULT_TIERS)
    assert chosen is not None and (chosen.tier.name, chosen.class_name) == (tier, klass)
    field = "spec.scheduling.priorityTier" if "priorityTier" in spec else "spec.scheduling.priority"
    assert chosen.field == field


def test_priority_zero_without_a_tier_or_preemption_gets_no_priority_class() -> None:
    assert pool_priority(scheduling("{priority: 0}"), DEFAULT_TIERS) is None
    assert pool_priority(None, DEFAULT_TIERS) is None
    _, pods = pool_pods("{gangScheduling: {enabled: false}}")
    assert "priorityClassName" not in pods[0].manifest["spec"]


def test_preemption_on_a_tier_that_never_preempts_is_flagged_not_granted() -> None:
    chosen = pool_priority(scheduling("{preemption: {enabled: true}}"), DEFAULT_TIERS)
    assert chosen is not None and chosen.tier.name == "default" and chosen.preemption_denied
    assert chosen.class_name == "neuronetes-default" and not chosen.preempts
    assert "not honoured" in chosen.describe()


@pytest.mark.parametrize(
    ("spec", "tiers", "expect"),
    [
        (
            "{priorityTier: gold}",
            DEFAULT_TIERS,
            "spec.scheduling.priorityTier: 'gold' is not a priority tier",
        ),
        (
            "{priority: 10}",
            (PriorityTier(name="x", value=100),),
            "spec.scheduling.priority: 10 is below every",
        ),
    ],
)
def test_an_unknown_tier_or_a_priority_below_every_tier_is_refused(
    spec: str, tiers: tuple[PriorityTier, ...], expect: str
) -> None:
    with pytest.raises(TierError, match="^" + expect.replace("(", r"\(")):
        pool_priority(scheduling(spec), tiers)


def pool_pods(spec: str, tiers: tuple[PriorityTier, ...] = DEFAULT_TIERS) -> tuple[Any, list[Any]]:
    obj = pool(spec)
    s = decode(obj, AgentPool).spec
    resolved = with_tier(resolve(s), s.scheduling, tiers)
    return resolved, desired_pods(obj, s, resolved)


def test_pool_pods_get_the_tiers_class_and_the_status_says_which() -> None:
    resolved, pods = pool_pods("{priority: 1000, preemption: {enabled: true}}")
    assert {p.manifest["spec"]["priorityClassName"] for p in pods} == {"neuronetes-high"}
    (state,) = [p for p in resolved.policies if p.name == "priority"]
    assert state.effect == (
        "scheduling.priority 1000: tier high, PriorityClass neuronetes-high (value 1000; may preempt lower "
        "priorities)"
    )
    # The operator mints no PriorityClass: no code for it, no permission for it.
    assert not hasattr(pods_module, "priority_class")
    (role,) = [o for o in operator_rbac("neuronetes-system") if o["kind"] == "ClusterRole"]
    assert not [r for r in role["rules"] if "scheduling.k8s.io" in r["apiGroups"]]


# ---- the tiers themselves -----------------------------------------------------------------------


def test_the_chart_default_tiers_grant_only_the_lowest_to_every_namespace() -> None:
    assert [(t.name, t.value, t.preemption_policy) for t in DEFAULT_TIERS] == [
        ("default", 0, "Never"),
        ("high", 1000, "PreemptLowerPriority"),
        ("critical", 1_000_000, "PreemptLowerPriority"),
    ]
    classes = {
        o["metadata"]["name"]: (o["value"], o["preemptionPolicy"]) for o in priority_classes(DEFAULT_TIERS)
    }
    assert classes == {
        "neuronetes-default": (0, "Never"),
        "neuronetes-high": (1000, "PreemptLowerPriority"),
        "neuronetes-high-nopreempt": (1000, "Never"),
        "neuronetes-critical": (1_000_000, "PreemptLowerPriority"),
        "neuronetes-critical-nopreempt": (1_000_000, "Never"),
    }
    assert review_pool_priority(pool("{priority: 999}"), "anyone", DEFAULT_TIERS, None) == []


def test_a_tiers_file_loads_and_duplicate_names_or_values_are_refused(tmp_path: Path) -> None:
    mine = granted("high", ("team-a",))
    assert load_tiers(tiers_file(tmp_path / "t.json", mine)) == mine
    assert load_tiers(None) == DEFAULT_TIERS
    for dupe in ("{name: high, value: 7}", "{name: other, value: 1000}"):
        (tmp_path / "bad.yaml").write_text(f"- {{name: high, value: 1000}}\n- {dupe}\n")
        with pytest.raises(ValueError, match="more than one tier"):
            load_tiers(tmp_path / "bad.yaml")
    (tmp_path / "big.yaml").write_text("- {name: top, value: 2000000000}\n")
    with pytest.raises(msgspec.ValidationError):
        load_tiers(tmp_path / "big.yaml")


def test_label_selectors_have_kubernetes_semantics() -> None:
    def sel(text: str) -> NamespaceSelector:
        return msgspec.convert(yaml.safe_load(text), NamespaceSelector)

    labels = {"team": "ml", "env": "prod"}
    assert selector_matches(sel("{}"), {})
    assert selector_matches(sel("{matchLabels: {team: ml}}"), labels)
    assert not selector_matches(sel("{matchLabels: {team: web}}"), labels)
    assert selector_matches(
        sel("{matchExpressions: [{key: env, operator: In, values: [prod, stage]}]}"), labels
    )
    assert not selector_matches(
        sel("{matchExpressions: [{key: env, operator: NotIn, values: [prod]}]}"), labels
    )
    assert selector_matches(sel("{matchExpressions: [{key: gpu, operator: DoesNotExist}]}"), labels)
    assert not selector_matches(sel("{matchExpressions: [{key: gpu, operator: Exists}]}"), labels)


# ---- admission ----------------------------------------------------------------------------------


def namespaces(labels: Mapping[str, Mapping[str, str]]) -> Any:
    def read(_: str, name: str) -> Mapping[str, Any] | None:
        return {"metadata": {"name": name, "labels": dict(labels[name])}} if name in labels else None

    return read


def test_a_pool_asking_for_a_tier_its_namespace_may_not_use_is_refused_naming_the_field() -> None:
    (refusal,) = review_pool_priority(pool("{priority: 5000}"), "team-a", DEFAULT_TIERS, None)
    assert refusal == (
        "spec.scheduling.priority: 5000 maps to priority tier high (value 1000), which namespace team-a may "
        "not use; it may use default (0). Choose one of those, or ask the cluster admin to grant the tier "
        "(chart value priorityTiers)"
    )
    (refusal,) = review_pool_priority(pool("{priorityTier: critical}"), "team-a", DEFAULT_TIERS, None)
    assert refusal.startswith("spec.scheduling.priorityTier: the pool asks for priority tier critical")
    # Granted by name, or by a label of the namespace (read from the API).
    assert review_pool_priority(pool("{priority: 5000}"), "team-a", granted("high", ("team-a",)), None) == []
    by_label = granted("high", selector=NamespaceSelector(match_labels={"tier": "gold"}))
    read = namespaces({"team-a": {"tier": "gold"}, "team-b": {"tier": "tin"}})
    assert review_pool_priority(pool("{priorityTier: high}"), "team-a", by_label, read) == []
    (refusal,) = review_pool_priority(pool("{priorityTier: high}"), "team-b", by_label, read)
    assert "namespace team-b may not use; it may use default (0)" in refusal


def test_preemption_on_a_tier_that_never_preempts_is_refused_at_admission() -> None:
    (refusal,) = review_pool_priority(
        pool("{priority: 10, preemption: {enabled: true}}"), "a", DEFAULT_TIERS, None
    )
    assert refusal.startswith("spec.scheduling.preemption.enabled: priority tier default never preempts")


def test_a_grant_by_label_that_cannot_be_read_is_refused() -> None:
    by_label = granted("high", selector=NamespaceSelector(match_labels={"tier": "gold"}))

    def broken(_: str, name: str) -> Mapping[str, Any] | None:
        raise NamespaceReadError("HTTP 403 Forbidden")

    for read, why in ((broken, "could not be read (HTTP 403 Forbidden)"), (None, "no API credentials")):
        (refusal,) = review_pool_priority(pool("{priorityTier: high}"), "team-a", by_label, read)
        assert refusal.startswith(
            "spec.scheduling.priorityTier: the pool asks for priority tier high, and whether"
        )
        assert why in refusal


def review(route: str, obj: dict[str, Any], namespace: str = "team-a") -> dict[str, Any]:
    return {"request": {"uid": "u", "operation": "CREATE", "namespace": namespace, "object": obj}}


def test_the_webhook_refuses_the_pool_and_allows_it_where_granted() -> None:
    refused = admission_response("/objects", review("/objects", pool("{priority: 1000}")))["response"]
    assert not refused["allowed"] and refused["status"]["message"].startswith(
        "spec.scheduling.priority: 1000"
    )
    reads = ClusterReads(tiers=granted("high", ("team-a",)))
    assert admission_response("/objects", review("/objects", pool("{priority: 1000}")), reads=reads)[
        "response"
    ]["allowed"]


def plain_pod(priority_class: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "x", "namespace": "team-a"},
        "spec": {"priorityClassName": priority_class, "containers": [{"name": "m", "image": "busybox"}]},
    }


@pytest.mark.parametrize(
    ("klass", "expect"),
    [
        (
            "neuronetes-high",
            "spec.priorityClassName: neuronetes-high is the PriorityClass of priority tier high",
        ),
        (
            "neuronetes-high-nopreempt",
            "spec.priorityClassName: neuronetes-high-nopreempt is the PriorityClass",
        ),
        ("neuronetes-p1000", "spec.priorityClassName: neuronetes-p1000 is no priority tier's PriorityClass"),
        ("neuronetes-default", ""),
        ("system-cluster-critical", ""),
    ],
)
def test_a_pod_naming_a_tier_class_its_namespace_may_not_use_is_refused(klass: str, expect: str) -> None:
    refusals = review_pod_priority(plain_pod(klass), "team-a", DEFAULT_TIERS, None)
    assert refusals[0].startswith(expect) if expect else refusals == [], refusals
    response = admission_response("/pods", review("/pods", plain_pod(klass)))["response"]
    assert response["allowed"] is not bool(expect)
    assert review_pod_priority(plain_pod(klass), "team-a", granted("high", ("team-a",)), None) == (
        [] if "high" in klass or not expect else refusals
    )


def test_pods_naming_a_neuronetes_class_reach_the_webhook_and_gpu_pods_keep_their_checks() -> None:
    assert "object.spec.priorityClassName.startsWith('neuronetes-')" in POD_MATCH_CONDITION
    allowed = admission_response("/pods", review("/pods", plain_pod("neuronetes-default")))["response"]
    assert allowed == {"uid": "u", "allowed": True}  # a pod asking for no GPU gets no scheduler name
    pod = gpu_pod()
    pod["spec"]["priorityClassName"] = "neuronetes-default"
    patched = admission_response("/pods", review("/pods", pod))["response"]
    assert json.loads(base64.b64decode(patched["patch"]))[0]["path"] == "/spec/schedulerName"
    pod["spec"]["priorityClassName"] = "neuronetes-critical"
    assert not admission_response("/pods", review("/pods", pod))["response"]["allowed"]
