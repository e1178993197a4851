"""The admission policies' probes (`neuronetes.devcluster.policyprobe`): one per policy, the same as
the `kubectl` block docs/webhook.md gives platform teams, and the wait that sends them.

tests/e2e/test_admission_policies_e2e.py shows each probe is refused because of its policy (and
runs the docs' block as written); here, what needs no API server.
"""

from __future__ import annotations

import json
import re
import subprocess
from typing import Any

import pytest

from neuronetes.devcluster import POLICIES_DIR, ClusterError
from neuronetes.devcluster.policyprobe import (
    DEFAULT_AGENT_USER,
    PROBE_NAME,
    PROBES,
    PoliciesNotEnforced,
    policy_names,
    probes_for,
    wait_enforced,
)
from neuronetes.devcluster.tools import REPO_ROOT

pytestmark = pytest.mark.unit

GPU_PODS = "neuronetes.io-gpu-pods-are-scheduled"
ASSIGNED = "neuronetes.io-assigned-gpus-by-the-extender"
AGENT = "neuronetes.io-agent-writes-only-its-node"
REPLICAS = "neuronetes.io-agentpool-replicas"
SCALE = "neuronetes.io-agentpool-scale"


def docs_block() -> str:
    text = (REPO_ROOT / "docs" / "webhook.md").read_text()
    section = text.split("\n## Right after `helm install`", 1)[1].split("\n## ", 1)[0]
    return section.split("```bash\n", 1)[1].split("```", 1)[0]


def test_every_policy_of_the_manifests_and_the_chart_has_a_probe() -> None:
    names = policy_names(POLICIES_DIR)
    assert sorted(names) == sorted(PROBES) == sorted([GPU_PODS, ASSIGNED, AGENT, REPLICAS, SCALE])
    chart = policy_names(REPO_ROOT / "helm" / "neuronetes" / "files" / "policies")
    assert [p.policy for p in probes_for(chart)] == chart


def test_a_policy_without_a_probe_cannot_be_waited_for() -> None:
    with pytest.raises(ClusterError, match=r"no probe for the admission policies example\.com-new"):
        probes_for([GPU_PODS, "example.com-new"])


def test_the_agent_probe_is_sent_as_the_agent_the_policy_names() -> None:
    text = (POLICIES_DIR / "agent-node.yaml").read_text()
    assert f"request.userInfo.username == '{DEFAULT_AGENT_USER}'" in text
    assert PROBES[AGENT].impersonate == DEFAULT_AGENT_USER
    (chart,) = [p for p in probes_for([AGENT], agent_user="system:serviceaccount:gpu:agent")]
    assert "--as=system:serviceaccount:gpu:agent" in chart.kubectl_args()
    assert "--as-group=system:masters" in chart.kubectl_args()
    assert PROBES[GPU_PODS].impersonate is None and PROBES[ASSIGNED].impersonate is None


def test_the_probes_are_dry_runs_no_webhook_shadows_but_the_one_refusing_the_same() -> None:
    for probe in PROBES.values():
        assert "--dry-run=server" in probe.kubectl_args()
        assert probe.manifest["metadata"]["name"] == PROBE_NAME
    # Only the preset-nodeName probe asks for a GPU (so the pods webhook sees only that one).
    gpu = [p.policy for p in PROBES.values() if "neuronetes.io/" in json.dumps(p.manifest.get("spec", {}))]
    assert gpu == [GPU_PODS]
    assert PROBES[GPU_PODS].also_shown_by and not PROBES[ASSIGNED].also_shown_by


def test_the_agentpool_probes_go_one_replica_past_the_maximum_and_name_it() -> None:
    replicas, scale = probes_for([REPLICAS, SCALE], max_replicas=100)
    assert replicas.manifest["spec"] == {"replicas": 101} and replicas.expect == "is more than 100,"
    assert replicas.kubectl_args()[0] == "create"
    assert scale.manifest["spec"] == {"replicas": 0, "minReplicas": 0} and scale.scale_to == 101
    assert scale.kubectl_args()[:3] == ["scale", "agentpool.neuronetes.io", PROBE_NAME]
    assert "--replicas=101" in scale.kubectl_args() and "--dry-run=server" in scale.kubectl_args()
    message = (
        "Error from server (Invalid): ValidatingAdmissionPolicy 'neuronetes.io-agentpool-replicas' with "
        "binding 'neuronetes.io-agentpool-replicas' denied request: spec.replicas: 101 is more than {},\n"
        "the most replicas"
    )
    assert replicas.refused(_answer(1, message.format(100)))
    assert not replicas.refused(_answer(1, message.format(1024)))  # the policy's version before
    # At the CRD's own bound the policies refuse nothing the schema admits: nothing to wait for.
    assert probes_for([GPU_PODS, REPLICAS, SCALE], max_replicas=4096) == probes_for([GPU_PODS])


def test_the_docs_block_sends_exactly_these_probes() -> None:
    """docs/webhook.md gives platform teams the probes as kubectl commands: the same objects, the
    same identity, the same maximum."""
    block = docs_block().replace("'$((MAX + 1))'", "1025")
    assert "MAX=1024" in block
    sent = {m[0]: json.loads(m[1]) for m in re.findall(r"refused (\S+) .*<<<'(\{.*\})'", block)}
    assert sent == {name: probe.manifest for name, probe in PROBES.items() if probe.scale_to is None}
    (pool,) = re.findall(r"^POOL='(\{.*\})'$", block, flags=re.MULTILINE)
    assert json.loads(pool) == PROBES[SCALE].manifest
    scale = " ".join(PROBES[SCALE].kubectl_args()[:5])
    assert f'refused {SCALE} "is more than $MAX," {scale} --replicas=$((MAX + 1))' in block
    assert f'refused {REPLICAS} "is more than $MAX,"' in block
    assert PROBES[REPLICAS].expect == PROBES[SCALE].expect == "is more than 1024,"
    assert '--as="system:serviceaccount:$NS:neuronetes-agent" --as-group=system:masters' in block
    assert "NS=neuronetes-system" in block and DEFAULT_AGENT_USER.endswith(
        ":neuronetes-system:neuronetes-agent"
    )
    for marker in PROBES[GPU_PODS].also_shown_by:
        assert marker in block
    assert "ValidatingAdmissionPolicy '$policy'" in block


def _answer(rc: int, stderr: str = "", stdout: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.CompletedProcess(["kubectl"], rc, stdout, stderr)


REFUSED = "Error from server (Forbidden): ValidatingAdmissionPolicy '{}' with binding '{}' denied request: x"


def test_only_the_policys_own_refusal_counts() -> None:
    probe = PROBES[GPU_PODS]
    assert probe.refused(_answer(1, REFUSED.format(GPU_PODS, GPU_PODS)))
    assert probe.refused(
        _answer(
            1, 'admission webhook "pods.neuronetes.io" denied the request: spec.nodeName: must not be set'
        )
    )
    assert not probe.refused(_answer(0, stdout=f"pod/{PROBE_NAME}"))  # admitted: not enforced yet
    assert not probe.refused(_answer(1, REFUSED.format(ASSIGNED, ASSIGNED)))  # another policy
    assert not probe.refused(_answer(1, 'failed calling webhook "pods.neuronetes.io": connection refused'))
    assert not PROBES[ASSIGNED].refused(
        _answer(1, 'admission webhook "pods.neuronetes.io" denied the request: spec.nodeName')
    )


class FakeKubectl:
    """Admits each probe `admitted` times, then refuses it as its policy does; creates and
    deletes the scale probe's pool (`exists`: it is there already)."""

    def __init__(self, admitted: int, exists: bool = False) -> None:
        self.admitted = admitted
        self.exists = exists
        self.calls: list[tuple[str, ...]] = []
        self.sent: dict[str, int] = {}

    def __call__(self, *args: str, input: str | None = None, check: bool = True) -> Any:
        assert check is False
        self.calls.append(args)
        if args[0] in ("create", "delete") and "--dry-run=server" not in args:
            assert input is not None and json.loads(input) == PROBES[SCALE].manifest
            if args[0] == "create":
                return _answer(1, "AlreadyExists") if self.exists else _answer(0)
            return _answer(0)
        if args[0] == "scale":
            assert list(args) == PROBES[SCALE].kubectl_args() and input is None
            policy = SCALE
        else:
            (policy,) = [
                p.policy for p in PROBES.values() if p.scale_to is None and input == json.dumps(p.manifest)
            ]
        self.sent[policy] = self.sent.get(policy, 0) + 1
        if self.sent[policy] <= self.admitted:
            return _answer(0, stdout=f"pod/{PROBE_NAME}")
        return _answer(1, REFUSED.format(policy, policy) + " is more than 1024,")


def test_wait_sends_each_probe_until_its_policy_refuses_it() -> None:
    kubectl = FakeKubectl(admitted=2)
    logged: list[str] = []
    wait_enforced(kubectl, list(PROBES.values()), interval_s=0.0, log=logged.append)
    probes = [c for c in kubectl.calls if "--dry-run=server" in c]
    assert len(probes) == 5 * 3  # each probe: admitted twice, then refused once, then done
    assert logged and logged[0].startswith("5 admission policies enforced after")
    # The scale probe's pool: created first, deleted last.
    assert kubectl.calls[0][0] == "create" and kubectl.calls[-1][0] == "delete"


def test_a_pool_of_the_probes_name_that_exists_is_used_and_left_alone() -> None:
    kubectl = FakeKubectl(admitted=0, exists=True)
    wait_enforced(kubectl, [PROBES[SCALE]], interval_s=0.0)
    assert [c[0] for c in kubectl.calls] == ["create", "scale"]


def test_wait_names_the_policies_still_admitting_their_probe() -> None:
    with pytest.raises(PoliciesNotEnforced, match=f"{ASSIGNED}: pod/{PROBE_NAME}"):
        wait_enforced(FakeKubectl(admitted=10**6), [PROBES[ASSIGNED]], timeout_s=0.05, interval_s=0.01)


def test_a_pool_the_scale_probe_cannot_create_is_an_error_at_once() -> None:
    def kubectl(*args: str, input: str | None = None, check: bool = True) -> Any:
        return _answer(1, "The AgentPool is invalid: spec.replicas: Invalid value")

    with pytest.raises(
        ClusterError, match="cannot create what a policy probe scales: The AgentPool is invalid"
    ):
        wait_enforced(kubectl, [PROBES[SCALE]], interval_s=0.0)
