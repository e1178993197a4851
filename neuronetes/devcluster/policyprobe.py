"""Whether the API server enforces an admission policy yet: ask it, with a request the policy refuses.

A ValidatingAdmissionPolicy is not enforced the moment it is created. Each kube-apiserver reads
policies and their bindings through informers of its own and recompiles its set of policies at
most once a second, when something changed; until then, requests the policy refuses are admitted
(on the local control plane: 0.3-1.2 s after ``kubectl apply``, longer on a loaded machine).
The API server reports nothing about it: a policy's status (type checking) says nothing about
whether admission uses it yet.

So this module asks. Each policy of ``manifests/policies/`` has a probe (`PROBES`): a request the
policy must refuse, sent as a server-side dry run (``kubectl create --dry-run=server``: admission
runs in full, nothing is stored) until the answer is the policy's refusal. The one exception is a
policy on a ``scale`` subresource, which only an update of an existing object reaches: its probe
scales (dry run) an AgentPool with no replica that it creates for the time of the wait. A policy
without a probe is an error (`probes_for`), so a new policy cannot be waited for by mistake.
docs/webhook.md ("Right after helm install") gives the same probes as ``kubectl`` commands for a
real cluster.

`wait_enforced` is what the dev cluster runs after applying the policies (``--direct``) and after
``helm install`` of the chart (`neuronetes.devcluster.chartmode.ChartOps.install`), and what the
e2e helper ``wait_until_policies_enforced`` (tests/e2e/e2e_cluster.py) runs.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import msgspec

from neuronetes import contracts as c
from neuronetes.api.models import DEFAULT_MAX_REPLICAS, MAX_REPLICAS
from neuronetes.devcluster.state import ClusterError

__all__ = [
    "DEFAULT_AGENT_USER",
    "PROBES",
    "PROBE_NAME",
    "PROBE_NAMESPACE",
    "PoliciesNotEnforced",
    "PolicyProbe",
    "policy_names",
    "probes_for",
    "wait_enforced",
]

Kubectl = Callable[..., subprocess.CompletedProcess[str]]

PROBE_NAME: Final = "neuronetes-policy-probe"
PROBE_NAMESPACE: Final = "default"
"""Every cluster has it. The probes are dry runs: nothing is stored there, but for the AgentPool the
scale probe scales, which exists (with no replica) only while `wait_enforced` waits."""
DEFAULT_AGENT_USER: Final = "system:serviceaccount:neuronetes-system:neuronetes-agent"
"""The node agent's user as manifests/policies/agent-node.yaml names it (the chart: its release's)."""
POLICY_REFUSAL: Final = "ValidatingAdmissionPolicy '{policy}'"
"""How the API server's refusal by a policy starts (``... with binding '...' denied request: ...``)."""


@dataclass(frozen=True, slots=True)
class PolicyProbe:
    """A request `policy` refuses: `manifest` created (dry run) by the admin, or as `impersonate`;
    with `scale_to`, `manifest` scaled to that many replicas (dry run) instead."""

    policy: str
    manifest: Mapping[str, Any]
    impersonate: str | None = None
    also_shown_by: tuple[str, ...] = ()
    """Refusals of the same request by a webhook, which the API server asks before any policy: where
    the chart's webhook refuses it first, that refusal shows the rule holds (docs/webhook.md)."""
    expect: str = ""
    """Text the policy's refusal must also hold: where the policy has a setting (a maximum), the
    refusal that names its value shows the API server uses that version of the policy."""
    scale_to: int | None = None
    """A policy on a ``scale`` subresource sees only updates of an object that exists: `manifest`
    is then created for real while the probe is sent (`wait_enforced`: with no replica, so nothing
    runs for it) and deleted afterwards, and the probe is its scale to this many replicas."""

    def kubectl_args(self) -> list[str]:
        """``kubectl create --dry-run=server`` of `manifest` (on stdin), impersonating if asked;
        with `scale_to`, ``kubectl scale --dry-run=server`` of `manifest`'s object."""
        if self.scale_to is not None:
            meta = self.manifest["metadata"]
            kind = f"{str(self.manifest['kind']).lower()}.{str(self.manifest['apiVersion']).split('/')[0]}"
            return [
                "scale", kind, str(meta["name"]), "-n", str(meta["namespace"]),
                f"--replicas={self.scale_to}", "--dry-run=server", "-o", "name",
            ]  # fmt: skip
        args = ["create", "--dry-run=server", "-o", "name", "-f", "-"]
        if self.impersonate is not None:
            # RBAC is decided before admission: system:masters lets the request reach admission
            # whatever the user's roles are (a --direct cluster gives the agent none). The policy
            # matches the user name, which stays the one impersonated.
            args += [f"--as={self.impersonate}", "--as-group=system:masters"]
        return args

    def refused(self, answer: subprocess.CompletedProcess[str]) -> bool:
        """Whether `answer` (of `kubectl_args`) is the policy's refusal (or one in `also_shown_by`)."""
        if answer.returncode == 0:
            return False
        text = " ".join((answer.stderr or "").split())
        if POLICY_REFUSAL.format(policy=self.policy) in text:
            return self.expect in text
        return any(m in text for m in self.also_shown_by)


def _pod(annotations: Mapping[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": PROBE_NAME, "namespace": PROBE_NAMESPACE}
    if annotations:
        meta["annotations"] = dict(annotations)
    container: dict[str, Any] = {"name": "probe", "image": "probe"}
    if "limits" in spec:
        container["resources"] = {"limits": spec.pop("limits")}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": {**spec, "containers": [container]}}


def _pool(**spec: int) -> dict[str, Any]:
    return {
        "apiVersion": c.API_VERSION,
        "kind": "AgentPool",
        "metadata": {"name": PROBE_NAME, "namespace": PROBE_NAMESPACE},
        "spec": spec,
    }


def _probes(agent_user: str, max_replicas: int) -> dict[str, PolicyProbe]:
    gpu_pods = "neuronetes.io-gpu-pods-are-scheduled"
    assigned = "neuronetes.io-assigned-gpus-by-the-extender"
    agent = "neuronetes.io-agent-writes-only-its-node"
    replicas, scale = "neuronetes.io-agentpool-replicas", "neuronetes.io-agentpool-scale"
    # One replica past the policies' maximum: within the CRD's own bound (MAX_REPLICAS), so the
    # schema lets it through to the policy. At that bound the policies refuse nothing more.
    past = min(max_replicas + 1, MAX_REPLICAS)
    return {
        # A GPU pod with spec.nodeName preset. The chart's webhook (pods.neuronetes.io, a mutating
        # webhook: asked before every policy) refuses it too, and first; its refusal counts.
        gpu_pods: PolicyProbe(
            gpu_pods,
            _pod(nodeName=PROBE_NAME, limits={c.RESOURCE_GPU: "1"}),
            also_shown_by=('admission webhook "pods.neuronetes.io" denied the request: spec.nodeName',),
        ),
        # A pod asking for no GPU (so no webhook sees it) that carries an assignment, by the admin.
        assigned: PolicyProbe(assigned, _pod({c.ANNOTATION_ASSIGNED_GPUS: "{}"})),
        # An Event about a Node by the agent's user with credentials that name no node.
        agent: PolicyProbe(
            agent,
            {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {"name": PROBE_NAME, "namespace": PROBE_NAMESPACE},
                "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": PROBE_NAME},
                "reason": "PolicyProbe",
                "message": "a dry run: is the policy enforced yet",
                "type": "Normal",
            },
            impersonate=agent_user,
        ),
        # An AgentPool of one replica past the maximum; the refusal names the maximum.
        replicas: PolicyProbe(replicas, _pool(replicas=past), expect=f"is more than {max_replicas},"),
        # kubectl scale of an AgentPool (created for the probe with none) to one past the maximum.
        scale: PolicyProbe(
            scale, _pool(replicas=0, minReplicas=0), expect=f"is more than {max_replicas},", scale_to=past
        ),
    }


_AGENTPOOL_POLICIES: Final = ("neuronetes.io-agentpool-replicas", "neuronetes.io-agentpool-scale")
PROBES: Final = _probes(DEFAULT_AGENT_USER, DEFAULT_MAX_REPLICAS)
"""The probe of every policy of manifests/policies/, by policy name (the agent as that names it;
the AgentPool maximum at its default)."""


def probes_for(
    policies: Iterable[str],
    *,
    agent_user: str = DEFAULT_AGENT_USER,
    max_replicas: int = DEFAULT_MAX_REPLICAS,
) -> list[PolicyProbe]:
    """The probes of `policies`, as installed: `agent_user` the node agent's user the policy names,
    `max_replicas` the AgentPool maximum (the chart's ``agentPools.maxReplicas``). At the CRD's
    own bound (`MAX_REPLICAS`) the AgentPool policies refuse nothing the schema lets through, so
    there is nothing to wait for: they get no probe.

    Raises `ClusterError` for a policy without a probe (add one to `PROBES`).
    """
    known = _probes(agent_user, max_replicas)
    if max_replicas >= MAX_REPLICAS:
        policies = [p for p in policies if p not in _AGENTPOOL_POLICIES]
    names = list(dict.fromkeys(policies))
    missing = [p for p in names if p not in known]
    if missing:
        raise ClusterError(
            f"no probe for the admission policies {', '.join(missing)}: add a request each must refuse "
            "to neuronetes.devcluster.policyprobe.PROBES"
        )
    return [known[p] for p in names]


def policy_names(folder: Path) -> list[str]:
    """The names of the ValidatingAdmissionPolicies in the YAML files of `folder` (not subfolders)."""
    names: list[str] = []
    for path in sorted(p for p in folder.glob("*") if p.suffix in (".yaml", ".yml") and p.is_file()):
        for text in re.split(r"^---[ \t]*$", path.read_text(), flags=re.MULTILINE):
            doc = msgspec.yaml.decode(text) if text.strip() else None
            if isinstance(doc, dict) and doc.get("kind") == "ValidatingAdmissionPolicy":
                names.append(str(doc["metadata"]["name"]))
    return names


class PoliciesNotEnforced(ClusterError):
    """Some policies still admitted their probe when the time was up; the message has the answers."""


def wait_enforced(
    kubectl: Kubectl,
    probes: Sequence[PolicyProbe],
    *,
    timeout_s: float = 60.0,
    interval_s: float = 0.25,
    log: Callable[[str], None] | None = None,
) -> float:
    """Send each probe (a server-side dry run) until the API server refuses it as its policy must;
    return the seconds that took. A policy once enforced stays so (until it is deleted): each probe
    is done at its first refusal.

    A probe that scales an object creates it first and deletes it at the end (`PolicyProbe.scale_to`).

    Raises `PoliciesNotEnforced` after `timeout_s`, with each pending policy's last answer.
    """
    scratch: list[str] = []
    for obj in sorted({json.dumps(p.manifest) for p in probes if p.scale_to is not None}):
        made = kubectl("create", "-f", "-", input=obj, check=False)
        if made.returncode == 0:
            scratch.append(obj)
        elif "AlreadyExists" not in (made.stderr or ""):  # one that exists is used and left alone
            raise ClusterError(f"cannot create what a policy probe scales: {(made.stderr or '').strip()}")
    try:
        return _wait(kubectl, probes, timeout_s=timeout_s, interval_s=interval_s, log=log)
    finally:
        for obj in scratch:
            kubectl("delete", "-f", "-", "--ignore-not-found", "--timeout=60s", input=obj, check=False)


def _wait(
    kubectl: Kubectl,
    probes: Sequence[PolicyProbe],
    *,
    timeout_s: float,
    interval_s: float,
    log: Callable[[str], None] | None,
) -> float:
    start = time.monotonic()
    deadline = start + timeout_s
    pending = list(probes)
    last: dict[str, str] = {}
    while True:
        for probe in list(pending):
            stdin = None if probe.scale_to is not None else json.dumps(probe.manifest)
            answer = kubectl(*probe.kubectl_args(), input=stdin, check=False)
            if probe.refused(answer):
                pending.remove(probe)
            else:
                last[probe.policy] = (answer.stderr or answer.stdout or "").strip()
        waited = time.monotonic() - start
        if not pending:
            if log is not None and probes:
                log(f"{len(probes)} admission policies enforced after {waited:.1f}s")
            return waited
        if time.monotonic() > deadline:
            raise PoliciesNotEnforced(
                f"admission policies not enforced after {timeout_s:.0f}s (a dry run each must refuse was "
                "answered otherwise): "
                + "; ".join(f"{p.policy}: {last.get(p.policy) or 'no answer'}" for p in pending)
            )
        time.sleep(interval_s)
