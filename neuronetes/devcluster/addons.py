"""The NeuroNetes components a dev cluster runs beyond the scheduler pairs: the node agent in
fleet mode and the operator with its admission webhook.

Each is a host process under the cluster's supervisor (so `dev cluster status` lists it and
`dev cluster down` stops it), started with the arguments its own package renders — the same ones
a chart gives it: ``neuronetes agent run --simulate-nodes`` for every kwok node (the profiles
describe the hardware; the agent publishes GPUNode, labels and capacity from it), and
``neuronetes operator run`` plus two ``neuronetes webhook serve`` replicas sharing one port, with
the webhook configurations registered against their self-signed CA (``failurePolicy: Fail``).
The dev cluster is a tool on top of the components: it imports their launch helpers directly.
"""

from __future__ import annotations

import json
import ssl
import subprocess
import time
import urllib.request
from collections.abc import Callable
from typing import Final

from neuronetes.devcluster import procs
from neuronetes.devcluster.components import Layout
from neuronetes.devcluster.state import ClusterError, RunState
from neuronetes.devcluster.supervisor import Supervisor
from neuronetes_agent.daemon.fleet import fleet_agent_argv
from neuronetes_operator import launch, webhook
from neuronetes_operator.tiers import DEFAULT_TIERS

__all__ = ["AGENT", "KWOK_SELECTOR", "OPERATOR", "WEBHOOK_REPLICAS", "agent_argv", "start_addons"]

AGENT: Final = "node-agent"
OPERATOR: Final = "operator"
WEBHOOK_REPLICAS: Final = 2
Kubectl = Callable[..., subprocess.CompletedProcess[str]]
KWOK_SELECTOR: Final = "type=kwok"
"""Every simulated node (`neuronetes.profiles` labels them so)."""


def agent_argv(at: Layout) -> list[str]:
    """The fleet agent serving every simulated node, metrics on the cluster's port for it."""
    return fleet_agent_argv(at.kubeconfig, KWOK_SELECTOR, metrics_port=at.ports["agent_metrics"])


def _webhook_ready(url: str, ca_file: str) -> Callable[[], tuple[bool, str]]:
    context = ssl.create_default_context(cafile=ca_file)

    def probe() -> tuple[bool, str]:
        try:
            with urllib.request.urlopen(f"{url}/healthz", timeout=2, context=context) as response:
                return bool(response.status == 200), f"HTTP {response.status}"
        except OSError as exc:
            return False, str(exc)

    return probe


def start_addons(
    sup: Supervisor,
    state: RunState,
    at: Layout,
    kubectl: Kubectl,
    log: Callable[[str], None],
    deadline: float,
) -> None:
    """Start the add-ons `state` asks for (`run_agent`, `run_operator`)."""
    if state.run_agent:
        log(f"{AGENT} (fleet mode) for the nodes labelled {KWOK_SELECTOR}")
        sup.spawn(state, AGENT, agent_argv(at))
    if not state.run_operator:
        return
    cert_dir = at.state_dir / "webhook-certs"
    ca_pem = webhook.ensure_certificate(cert_dir)
    port = at.ports["webhook"]
    url = f"https://127.0.0.1:{port}"
    for i in range(WEBHOOK_REPLICAS):
        # The replicas read the GPUSlice a pod names (docs/webhook.md) with the cluster's kubeconfig.
        sup.spawn(state, f"webhook-{i}", launch.webhook_argv(port, cert_dir, kubeconfig=at.kubeconfig))
    probe = _webhook_ready(url, str(cert_dir / webhook.CA_FILE))
    for i in range(WEBHOOK_REPLICAS):
        sup.wait(state, f"webhook-{i}", probe, deadline)
    for obj in launch.webhook_configurations(ca_pem, url):
        kubectl("apply", "-f", "-", input=json.dumps(obj))
    # The default priority tiers' PriorityClasses (the chart creates them in a cluster).
    for obj in launch.priority_classes(DEFAULT_TIERS):
        kubectl("apply", "-f", "-", input=json.dumps(obj))
    settings = at.state_dir / "operator.json"
    settings.write_text(json.dumps(launch.dev_operator_settings()) + "\n")
    log(f"{OPERATOR} and {WEBHOOK_REPLICAS} webhook replicas on {url}")
    sup.spawn(state, OPERATOR, launch.operator_argv(at.kubeconfig, settings))
    # The operator has no health endpoint: it must at least outlive its start-up.
    until = min(deadline, time.monotonic() + 2.0)
    while time.monotonic() < until:
        time.sleep(0.2)
    if not procs.is_running(state.processes[OPERATOR]):
        raise ClusterError(f"the operator exited at start:\n{sup.tail(OPERATOR)}")
