"""The operator's spot handling (`neuronetes_operator.spot_plan` through `PoolController.reconcile`)
against an in-memory API server: the spot share per pod, replacements on interruption notices
(created before the old pods go, on on-demand, whole gangs), deletion once the replacements are
Ready or at the deadline, and the interruption threshold turning spot off and on again, its state
kept in the pool's status."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from operator_fakes import FakeCluster, controller

from neuronetes import contracts as c
from neuronetes.spot import NOTICE_KEY, SPOT_LABELS, is_spot_node
from neuronetes_operator.admission import check_annotations
from neuronetes_operator.controller import PoolController
from neuronetes_operator.pods import ANNOTATION_REPLACES, LABEL_CAPACITY

pytestmark = pytest.mark.unit

NTH = {"key": "aws-node-termination-handler/spot-itn", "value": "true", "effect": "NoSchedule"}


def pool(cost: dict[str, Any], replicas: int = 4, gang: int = 0) -> dict[str, Any]:
    scheduling: dict[str, Any] = {"costOptimization": cost}
    if gang:
        scheduling["gangScheduling"] = {"enabled": True, "minMembers": gang}
    return {
        "apiVersion": "neuronetes.io/v1alpha1",
        "kind": "AgentPool",
        "metadata": {"name": "sp", "namespace": "ns", "uid": "u-1", "generation": 1},
        "spec": {"minReplicas": replicas, "scheduling": scheduling},
    }


def node(name: str, spot: bool, taints: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    capacity = "spot" if spot else "on-demand"
    labels = {"karpenter.sh/capacity-type": capacity, "kubernetes.io/hostname": name}
    return {"metadata": {"name": name, "labels": labels}, "spec": {"taints": taints or []}}


def _matches(term: dict[str, Any], labels: dict[str, str]) -> bool:
    for e in term.get("matchExpressions") or []:
        value = labels.get(e["key"])
        if e["operator"] == "NotIn" and value in e["values"]:
            return False
        if e["operator"] == "In" and value not in e["values"]:
            return False
    return True


class World:
    """The fake API server, the nodes (the controller's node watch) and a scheduler + kubelet: each
    unbound pod goes to the least busy untainted node its required node affinity admits, a spot
    node first when the pod prefers spot, and turns Ready."""

    def __init__(self, spec: dict[str, Any], nodes: list[dict[str, Any]], **settings: Any) -> None:
        self.fake = FakeCluster(spec)
        self.ctl: PoolController = controller(self.fake, batch_size=64, **settings)
        self.nodes = {n["metadata"]["name"]: copy.deepcopy(n) for n in nodes}
        for n in self.nodes.values():
            self.ctl.node_seen(n["metadata"]["name"], n)

    def taint(self, name: str, taint: dict[str, Any]) -> bool:
        self.nodes[name]["spec"]["taints"].append(taint)
        return self.ctl.node_seen(name, self.nodes[name])

    def reconcile(self) -> dict[str, Any]:
        self.ctl.reconcile("ns", "sp")
        return dict(self.fake.pool["status"])

    def schedule(self, ready: bool = True, skip: tuple[str, ...] = ()) -> None:
        for pod in self.fake.pods.values():
            if pod["spec"].get("nodeName") or pod["metadata"]["name"] in skip:
                continue
            affinity = pod["spec"].get("affinity", {}).get("nodeAffinity", {})
            terms = affinity.get("requiredDuringSchedulingIgnoredDuringExecution", {}).get(
                "nodeSelectorTerms"
            )
            prefers_spot = bool(affinity.get("preferredDuringSchedulingIgnoredDuringExecution"))
            fit = [
                n
                for n in self.nodes.values()
                if (not terms or any(_matches(t, n["metadata"]["labels"]) for t in terms))
                and not n["spec"]["taints"]  # no pod here tolerates a notice taint
            ]
            best = min(
                fit,
                key=lambda n: (
                    not (prefers_spot and is_spot_node(n["metadata"]["labels"])),
                    len(self.on(n["metadata"]["name"])),
                ),
            )
            pod["spec"]["nodeName"] = best["metadata"]["name"]
            if ready:
                pod.setdefault("status", {})["conditions"] = [{"type": "Ready", "status": "True"}]

    def ready(self, name: str) -> None:
        self.fake.pods[name].setdefault("status", {})["conditions"] = [{"type": "Ready", "status": "True"}]

    def on(self, node_name: str) -> list[str]:
        return sorted(n for n, p in self.fake.pods.items() if p["spec"].get("nodeName") == node_name)

    def condition(self, kind: str) -> dict[str, Any]:
        return next(cd for cd in self.fake.pool["status"]["conditions"] if cd["type"] == kind)

    def reasons(self) -> list[str]:
        return [r for r, _ in self.fake.events]


NODES = [node("spot-0", True), node("spot-1", True), node("od-0", False), node("od-1", False)]


def test_max_spot_percent_makes_at_most_its_share_of_pods_spot_capable() -> None:
    w = World(pool({"spotEnabled": True, "spotStrategy": {"maxSpotPercent": 50}}), NODES)
    w.reconcile()
    capacity = {n: p["metadata"]["labels"][LABEL_CAPACITY] for n, p in w.fake.pods.items()}
    assert sorted(capacity.values()) == ["on-demand", "on-demand", "spot", "spot"]
    for name, pod in w.fake.pods.items():
        required = pod["spec"]["affinity"]["nodeAffinity"].get(
            "requiredDuringSchedulingIgnoredDuringExecution", {}
        )
        keys = {e["key"] for t in required.get("nodeSelectorTerms", []) for e in t["matchExpressions"]}
        assert (set(SPOT_LABELS) <= keys) is (capacity[name] == "on-demand")
    w.schedule()
    status = w.reconcile()
    assert status["spotReplicas"] == 2
    assert status["spot"]["allowedUnits"] == 2 and status["spot"]["spotUnits"] == 2
    # Every reconcile keeps the share: scaled to 6, one more may be spot (floor(0.5 × 6) = 3).
    w.fake.pool["spec"]["minReplicas"] = 6
    w.reconcile()
    new = [p for n, p in w.fake.pods.items() if n in ("sp-4", "sp-5")]
    assert sorted(p["metadata"]["labels"][LABEL_CAPACITY] for p in new) == ["on-demand", "spot"]


def test_lowering_the_share_moves_bound_spot_pods_to_on_demand_before_deleting_them() -> None:
    w = World(pool({"spotEnabled": True, "spotStrategy": {"maxSpotPercent": 50}}), NODES)
    w.reconcile()
    w.schedule()
    w.reconcile()
    on_spot = w.on("spot-0") + w.on("spot-1")
    assert len(on_spot) == 2
    w.fake.pool["spec"]["scheduling"]["costOptimization"]["spotStrategy"]["maxSpotPercent"] = 25
    w.reconcile()
    replacements = [n for n in w.fake.pods if n.endswith("-r")]
    assert len(replacements) == 1 and replacements[0][:-2] in on_spot  # the old one still runs
    assert w.fake.pods[replacements[0]]["metadata"]["labels"][LABEL_CAPACITY] == "on-demand"
    w.schedule()
    status = w.reconcile()
    assert replacements[0][:-2] not in w.fake.pods
    assert status["spotReplicas"] == 1 and "SpotRebalanced" in w.reasons()


def test_a_notice_replaces_the_pods_on_on_demand_and_deletes_the_old_once_ready() -> None:
    w = World(pool({"spotEnabled": True, "spotStrategy": {"maxSpotPercent": 50}}), NODES)
    w.reconcile()
    w.schedule()
    w.reconcile()
    (victim,) = w.on("spot-0")
    assert w.taint("spot-0", NTH) is True
    assert w.taint("spot-0", {"key": "other", "effect": "NoSchedule"}) is False  # the same notice
    status = w.reconcile()
    replacement = w.fake.pods[victim + "-r"]
    assert replacement["metadata"]["labels"][LABEL_CAPACITY] == "on-demand"
    name, _, deadline = replacement["metadata"]["annotations"][ANNOTATION_REPLACES].partition("@")
    assert name == victim
    first_seen = w.ctl.node_cache.first_seen("spot-0")
    assert first_seen is not None
    assert datetime.fromisoformat(deadline) == first_seen + timedelta(seconds=120)
    terms = replacement["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["spot-0"]} in terms[
        "nodeSelectorTerms"
    ][0]["matchExpressions"]
    assert victim in w.fake.pods  # not deleted before its replacement is Ready
    assert w.condition("SpotInterrupted")["status"] == "True"
    (entry,) = status["spot"]["interruptions"]
    assert (entry["node"], entry["source"]) == ("spot-0", "aws-nth-spot-itn")
    message = next(m for r, m in w.fake.events if r == "SpotInterrupted")
    assert "spot-0" in message and victim in message and "on-demand" in message

    w.schedule(ready=False)
    w.reconcile()
    assert victim in w.fake.pods  # bound, not yet Ready
    w.ready(victim + "-r")
    status = w.reconcile()
    assert victim not in w.fake.pods and w.fake.pods[victim + "-r"]["spec"]["nodeName"].startswith("od-")
    assert "SpotReplaced" in w.reasons()
    assert status["replicas"] == 4 and status["spotReplicas"] == 1
    assert w.reasons().count("SpotInterrupted") == 1  # said once, though reconciled again


def test_at_the_deadline_the_old_pods_go_even_if_the_replacement_is_not_ready() -> None:
    past = (datetime.now(UTC) - timedelta(seconds=1)).isoformat()
    w = World(pool({"spotEnabled": True}), NODES)
    w.reconcile()
    w.schedule()
    w.reconcile()
    victim = w.on("spot-0")[0]
    w.nodes["spot-0"]["metadata"]["annotations"] = {NOTICE_KEY: past}
    assert w.ctl.node_seen("spot-0", w.nodes["spot-0"])
    w.reconcile()
    assert victim + "-r" in w.fake.pods and victim in w.fake.pods
    w.reconcile()  # the replacement is still Pending: the deadline decides
    assert victim not in w.fake.pods and victim + "-r" in w.fake.pods


def test_a_gang_is_replaced_whole_as_another_gang() -> None:
    w = World(pool({"spotEnabled": True}, replicas=4, gang=2), NODES)
    w.reconcile()
    w.schedule()
    w.reconcile()
    victim = w.on("spot-0")[0]
    gang = w.fake.pods[victim]["metadata"]["labels"][c.LABEL_GANG]
    members = sorted(n for n, p in w.fake.pods.items() if p["metadata"]["labels"][c.LABEL_GANG] == gang)
    w.taint("spot-0", NTH)
    w.reconcile()
    new = sorted(n for n, p in w.fake.pods.items() if p["metadata"]["labels"][c.LABEL_GANG] == gang + "-r")
    assert new == [m + "-r" for m in members]
    w.schedule(ready=False)
    w.ready(new[0])
    w.reconcile()
    assert set(members) <= set(w.fake.pods)  # one member Ready is not the gang Ready
    w.ready(new[1])
    w.reconcile()
    assert not set(members) & set(w.fake.pods) and set(new) <= set(w.fake.pods)


def test_scale_down_deletes_at_once_and_the_replica_comes_back_elsewhere() -> None:
    w = World(pool({"spotEnabled": True, "spotStrategy": {"onInterruption": "scale-down"}}), NODES)
    w.reconcile()
    w.schedule()
    w.reconcile()
    victims = w.on("spot-0")
    w.taint("spot-0", NTH)
    w.reconcile()
    assert not set(victims) & set(w.fake.pods) and "SpotInterrupted" in w.reasons()
    w.reconcile()
    w.schedule()
    assert set(victims) <= set(w.fake.pods) and w.on("spot-0") == []


def test_the_threshold_turns_spot_off_and_back_on_after_a_quiet_window() -> None:
    cost = {
        "spotEnabled": True,
        "spotStrategy": {"maxSpotPercent": 50},
        "interruptionThreshold": {"count": 2, "window": "10m", "action": "disable-spot"},
    }
    nodes = [*NODES, node("spot-2", True), node("spot-3", True)]
    w = World(pool(cost), nodes)
    w.reconcile()
    w.schedule()
    w.reconcile()
    assert w.condition("SpotDisabled")["status"] == "False"
    w.taint("spot-0", NTH)
    w.reconcile()
    assert w.condition("InterruptionThresholdReached")["status"] == "False"
    w.schedule()
    w.reconcile()
    w.taint("spot-1", NTH)
    status = w.reconcile()
    assert w.condition("SpotDisabled")["status"] == "True"
    assert w.condition("InterruptionThresholdReached")["reason"] == "DisableSpot"
    assert status["spot"]["allowedUnits"] == 0 and status["spot"]["thresholdAction"] == "disable-spot"
    assert "InterruptionThresholdReached" in w.reasons()
    for _ in range(3):
        w.schedule()
        status = w.reconcile()
    assert status["spotReplicas"] == 0  # every spot pod moved to on-demand
    assert all(p["metadata"]["labels"][LABEL_CAPACITY] == "on-demand" for p in w.fake.pods.values())

    # A restarted operator keeps the state (it is in the status); an hour without notices clears it.
    w.ctl = controller(w.fake, batch_size=64)
    for n in w.nodes.values():
        n["spec"]["taints"] = []
        w.ctl.node_seen(n["metadata"]["name"], n)
    w.reconcile()
    assert w.condition("SpotDisabled")["status"] == "True"
    hour_ago = (datetime.now(UTC) - timedelta(hours=1)).isoformat()
    for entry in w.fake.pool["status"]["spot"]["interruptions"]:
        entry["noticed"] = hour_ago
    status = w.reconcile()
    assert w.condition("SpotDisabled")["status"] == "False" and "thresholdTrippedAt" not in status["spot"]
    assert "InterruptionThresholdCleared" in w.reasons() and status["spot"]["allowedUnits"] == 2


def test_fallback_model_action_only_reports_the_trigger() -> None:
    cost = {
        "spotEnabled": True,
        "fallbackModel": "small",
        "interruptionThreshold": {"count": 1, "window": "10m", "action": "fallback-model"},
    }
    w = World(pool(cost, replicas=2), NODES)
    w.reconcile()
    w.schedule()
    w.reconcile()
    w.taint("spot-0", NTH)
    status = w.reconcile()
    assert status["spot"]["fallbackRequested"] is True
    assert w.condition("InterruptionThresholdReached")["reason"] == "FallbackModel"
    assert w.condition("SpotDisabled")["status"] == "False" and status["spot"]["allowedUnits"] == 2


def test_a_garbage_notice_value_is_one_event_and_the_default_deadline() -> None:
    w = World(pool({"spotEnabled": True}, replicas=2), NODES)
    w.reconcile()
    w.schedule()
    w.reconcile()
    w.nodes["spot-0"]["metadata"]["labels"][NOTICE_KEY] = "whenever"
    w.ctl.node_seen("spot-0", w.nodes["spot-0"])
    w.reconcile()
    w.reconcile()
    assert w.reasons().count("InvalidInterruptionNotice") == 1
    assert any(n.endswith("-r") for n in w.fake.pods)


def test_a_replacement_pod_passes_the_pod_webhooks_annotation_rule() -> None:
    """The webhook keeps ``neuronetes.io/*`` pod annotations for GPU decisions and requests: the
    replacement's own annotation is outside it, so the operator's replacement is admitted."""
    w = World(pool({"spotEnabled": True}, replicas=1), NODES)
    w.reconcile()
    w.schedule()
    w.reconcile()
    w.taint(w.fake.pods["sp-0"]["spec"]["nodeName"], NTH)
    w.reconcile()
    replacement = w.fake.pods["sp-0-r"]
    assert ANNOTATION_REPLACES in replacement["metadata"]["annotations"]
    assert check_annotations(replacement) == []


def test_status_policies_say_what_spot_does_not_that_a_controller_will() -> None:
    cost = {
        "spotEnabled": True,
        "spotStrategy": {
            "maxSpotPercent": 30,
            "instanceTypes": ["g5.xlarge"],
            "onInterruption": "scale-down",
        },
        "interruptionThreshold": {"count": 3, "window": "10m", "action": "alert"},
    }
    w = World(pool(cost, replicas=2), NODES)
    w.reconcile()
    (effect,) = [p["effect"] for p in w.fake.pool["status"]["policies"] if p["name"] == "costOptimization"]
    assert "at most 30% of the replicas (whole gangs) on spot nodes" in effect
    assert (
        "preferring instance types g5.xlarge" in effect and "on an interruption notice: scale-down" in effect
    )
    assert "3 notices within 10m: alert" in effect
    assert "policy controller" not in effect  # the budget and the fallback model act too


def test_a_replica_under_its_other_name_is_kept_scaled_down_and_rolled_like_any() -> None:
    """`reconcile.plan` with the two names: ``sp-0-r`` is replica 0 (nothing recreated under
    ``sp-0``); scaled to 1, ``sp-1-r`` goes; an outdated ``sp-0-r`` is rolled and comes back as ``sp-0``."""
    w = World(pool({"spotEnabled": True}, replicas=2), NODES)
    w.reconcile()
    w.schedule()
    w.reconcile()
    for name in ("sp-0", "sp-1"):  # as if both had been replaced once
        pod = w.fake.pods.pop(name)
        pod["metadata"]["name"] = name + "-r"
        w.fake.pods[name + "-r"] = pod
    w.reconcile()
    assert sorted(w.fake.pods) == ["sp-0-r", "sp-1-r"]
    w.fake.pool["spec"]["minReplicas"] = 1
    w.reconcile()
    assert sorted(w.fake.pods) == ["sp-0-r"] and "ScaledDown" in w.reasons()
    w.fake.pool["spec"]["template"] = {"metadata": {"labels": {"app": "v2"}}}
    w.reconcile()
    assert sorted(w.fake.pods) == ["sp-0"] and "Outdated" in w.reasons()


def priced(name: str, spot: bool, price: str) -> dict[str, Any]:
    out = node(name, spot)
    out["metadata"]["labels"][c.LABEL_PRICE_PER_HOUR] = price
    return out


def test_with_a_budget_the_spot_split_comes_first_and_a_replacement_is_not_held_back() -> None:
    """``maxCostPerHour`` 8 with spot at 1/h and on-demand at 4/h (a pod takes a node's whole price):
    the spot-capable pod is projected at the dearest node it may land on (4), the on-demand one at 4,
    so both fit; on a notice the replica's on-demand replacement counts once (the dearer of its two
    pods, 4), never refused because the old pod still runs."""
    nodes = [priced("spot-0", True, "1"), priced("od-a", False, "4"), priced("od-b", False, "4")]
    w = World(
        pool({"spotEnabled": True, "spotStrategy": {"maxSpotPercent": 50}, "maxCostPerHour": 8}, 2), nodes
    )
    w.reconcile()
    capacities = sorted(p["metadata"]["labels"][LABEL_CAPACITY] for p in w.fake.pods.values())
    assert capacities == ["on-demand", "spot"]
    w.schedule()
    status = w.reconcile()
    assert status["cost"]["currentPerHour"] == pytest.approx(5.0)
    (victim,) = w.on("spot-0")
    w.taint("spot-0", NTH)
    status = w.reconcile()
    assert victim + "-r" in w.fake.pods and victim in w.fake.pods  # created while the old one runs
    assert w.fake.pods[victim + "-r"]["metadata"]["labels"][LABEL_CAPACITY] == "on-demand"
    budget = w.condition("CostBudgetExceeded")
    assert budget["status"] == "False", budget
    w.schedule()
    status = w.reconcile()
    assert victim not in w.fake.pods and "OverBudget" not in w.reasons()
    assert status["replicas"] == 2 and status["cost"]["currentPerHour"] == pytest.approx(8.0)


def test_spot_max_interruptions_is_a_threshold_of_one_hour() -> None:
    # spotMaxInterruptions: the interruptions an hour the pool tolerates on spot; the next turns spot
    # off, as interruptionThreshold {count: N + 1, window: 1h, action: disable-spot} would.
    cost = {"spotEnabled": True, "spotStrategy": {"maxSpotPercent": 50}, "spotMaxInterruptions": 1}
    nodes = [*NODES, node("spot-2", True), node("spot-3", True)]
    w = World(pool(cost), nodes)
    w.reconcile()
    w.schedule()
    w.reconcile()
    w.taint("spot-0", NTH)
    w.reconcile()
    assert w.condition("SpotDisabled")["status"] == "False"  # one interruption: tolerated
    w.schedule()
    w.reconcile()
    w.taint("spot-1", NTH)
    status = w.reconcile()
    assert w.condition("SpotDisabled")["status"] == "True"
    assert status["spot"]["allowedUnits"] == 0 and status["spot"]["thresholdAction"] == "disable-spot"
