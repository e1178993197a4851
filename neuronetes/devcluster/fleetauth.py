"""The identity of the chart runner's agent fleet: the agent's RBAC, without its node restriction.

In chart mode one agent process serves every simulated GPU node (`neuronetes.devcluster.chartrun`,
fleet mode). It cannot run as any agent pod's identity: that token names the pod's node, and the
policy ``neuronetes.io-agent-writes-only-its-node`` (with the webhook's ``evictions.neuronetes.io``)
holds it to that one node. So the fleet runs as a ServiceAccount of its own, dev-only and never
rendered by the chart: ``<agent ServiceAccount>-fleet`` beside the agent's, bound to exactly the
roles the agent's ServiceAccount is bound to (each of its ClusterRoleBindings and RoleBindings
copied, named ``<binding>:fleet``). Its permissions are the chart's agent's; only the node
restriction, which matches the agent's user name, does not apply. Each copy is owned by the object
it copies, so ``helm uninstall`` takes them with it (garbage collection).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from neuronetes.devcluster.api import Api
from neuronetes.devcluster.podfiles import Credentials

__all__ = ["FLEET_SUFFIX", "MANAGER", "fleet_credentials", "fleet_identity", "fleet_service_account"]

FLEET_SUFFIX: Final = "-fleet"
MANAGER: Final = "neuronetes-chart-runner"
"""Field manager and ``app.kubernetes.io/managed-by`` of the objects the runner writes."""
_RBAC: Final = "rbac.authorization.k8s.io"


def fleet_service_account(agent_service_account: str) -> str:
    return agent_service_account + FLEET_SUFFIX


def _owner(obj: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": obj["apiVersion"],
        "kind": obj["kind"],
        "name": obj["metadata"]["name"],
        "uid": obj["metadata"]["uid"],
    }


def _binds(binding: Mapping[str, Any], namespace: str, account: str) -> bool:
    return any(
        s.get("kind") == "ServiceAccount" and s.get("name") == account and s.get("namespace") == namespace
        for s in binding.get("subjects") or ()
    )


def fleet_identity(
    agent_account: Mapping[str, Any],
    cluster_role_bindings: Sequence[Mapping[str, Any]],
    role_bindings: Sequence[Mapping[str, Any]],
) -> list[dict[str, Any]]:
    """The fleet's ServiceAccount and a copy of each binding of `agent_account` (a ServiceAccount
    object), bound to the fleet's instead; listed bindings need ``apiVersion`` and ``kind``."""
    namespace, name = agent_account["metadata"]["namespace"], agent_account["metadata"]["name"]
    fleet = fleet_service_account(name)
    labels = {"app.kubernetes.io/managed-by": MANAGER}
    out: list[dict[str, Any]] = [
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {
                "name": fleet,
                "namespace": namespace,
                "labels": labels,
                "ownerReferences": [_owner(agent_account)],
            },
        }
    ]
    subject = {"kind": "ServiceAccount", "name": fleet, "namespace": namespace}
    for binding in [*cluster_role_bindings, *role_bindings]:
        if not _binds(binding, namespace, name):
            continue
        meta: dict[str, Any] = {
            "name": f"{binding['metadata']['name']}:fleet",
            "labels": labels,
            "ownerReferences": [_owner(binding)],
        }
        if binding["kind"] == "RoleBinding":
            meta["namespace"] = binding["metadata"]["namespace"]
        out.append(
            {
                "apiVersion": f"{_RBAC}/v1",
                "kind": binding["kind"],
                "metadata": meta,
                "roleRef": dict(binding["roleRef"]),
                "subjects": [subject],
            }
        )
    return out


def _items(api: Api, path: str, kind: str) -> list[dict[str, Any]]:
    """A list's items with their ``apiVersion`` and ``kind`` (a list leaves them out)."""
    return [
        {"apiVersion": f"{_RBAC}/v1", "kind": kind, **item}
        for item in api.request("GET", path).get("items") or ()
    ]


def fleet_credentials(
    api: Api, ca_pem: bytes, namespace: str, agent_account: str, seconds: int
) -> Credentials:
    """Write the fleet's identity for the agent ServiceAccount `namespace`/`agent_account` (server-side
    apply, idempotent) and return a token of it, valid for `seconds`."""
    account = api.request("GET", f"/api/v1/namespaces/{namespace}/serviceaccounts/{agent_account}")
    account = {"apiVersion": "v1", "kind": "ServiceAccount", **account}
    objects = fleet_identity(
        account,
        _items(api, f"/apis/{_RBAC}/v1/clusterrolebindings", "ClusterRoleBinding"),
        _items(api, f"/apis/{_RBAC}/v1/rolebindings", "RoleBinding"),
    )
    for obj in objects:
        api.apply(obj, field_manager=MANAGER)
    body = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {"expirationSeconds": seconds},
    }
    fleet = fleet_service_account(agent_account)
    got = api.request("POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/{fleet}/token", body)
    return Credentials(api.server, ca_pem, str(got["status"]["token"]))
