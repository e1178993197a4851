"""The chart's rendering against the real API server: every object it renders by default, and with
cert-manager off and monitoring off (their kinds need CRDs this cluster lacks), passes a server-side
dry run — the API server's own schema and field validation, the webhook configurations' CEL match
condition, the admission policies' CEL, RBAC objects. Nothing is persisted: the session cluster's
own webhook registration and policies stay as they are. The sample AgentPool NOTES.txt shows a new
user passes too. Installing the chart for real is the dev cluster's (`helm install` on the local
control plane).
"""

from __future__ import annotations

import textwrap

import pytest
from chart_render import CHART, NAMESPACE, helm, template_args
from e2e_cluster import E2ECluster

pytestmark = pytest.mark.e2e


def test_every_rendered_object_passes_a_server_side_dry_run(cluster: E2ECluster) -> None:
    rendered = helm(*template_args(chart=CHART, namespace=NAMESPACE)).stdout
    if cluster.kubectl("get", "namespace", NAMESPACE, check=False).returncode != 0:
        cluster.kubectl("create", "namespace", NAMESPACE)
    done = cluster.kubectl(
        "apply",
        "--server-side",
        "--dry-run=server",
        "--force-conflicts",
        "--field-manager=neuronetes-chart-check",
        "--validate=strict",
        "-f",
        "-",
        input=rendered,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    applied = [line for line in done.stdout.splitlines() if "(server dry run)" in line]
    assert len(applied) == rendered.count("\nkind: ") > 30, done.stdout


def test_the_sample_agentpool_of_the_notes_is_accepted(cluster: E2ECluster) -> None:
    """NOTES.txt tells a new user to apply a sample AgentPool: the API server takes it as written."""
    notes = (CHART / "templates" / "NOTES.txt").read_text()
    body = notes.split("<<'POOL'\n", 1)[1].split("     POOL\n", 1)[0]
    sample = textwrap.dedent(body)
    assert "kind: AgentPool" in sample and "{{" not in sample
    done = cluster.kubectl(
        "apply", "--dry-run=server", "--validate=strict", "-f", "-", input=sample, check=False
    )
    assert done.returncode == 0, done.stderr
