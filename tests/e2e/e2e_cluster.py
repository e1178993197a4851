"""Helpers of the e2e tier: the object the `cluster` fixture yields, polling, prerequisite checks.

Imported by tests/e2e/conftest.py and by e2e tests (``from e2e_cluster import E2ECluster, wait_until``).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pytest

from neuronetes.contracts import SCHEDULER_NAME
from neuronetes.devcluster import POLICIES_DIR, BuildError, DevCluster, ExtenderConfig, Toolchain, build
from neuronetes.devcluster.policyprobe import (
    PoliciesNotEnforced,
    PolicyProbe,
    policy_names,
    probes_for,
    wait_enforced,
)
from neuronetes.devcluster.procs import ProcessRecord
from neuronetes.devcluster.tools import REPO_ROOT, cache_root
from neuronetes.profiles import KWOK_TAINT

T = TypeVar("T")

IN_CI = os.environ.get("CI", "").strip().lower() in ("1", "true", "yes", "on")

# Every DevCluster started in this session and the processes it ran, for the session-finish check.
STARTED: list[DevCluster] = []
RECORDS: list[ProcessRecord] = []


def track(dev: DevCluster) -> None:
    """Remember `dev` and the processes it runs now (call after `up`)."""
    if dev not in STARTED:
        STARTED.append(dev)
    RECORDS.extend(r for r in dev.processes() if r not in RECORDS)


@contextlib.contextmanager
def own_cluster(request: pytest.FixtureRequest, name: str, **up: Any) -> Iterator[DevCluster]:
    """A DevCluster of a suite's own (`up` passed to `DevCluster.up`), torn down afterwards: no
    process may be left, and its state is purged unless a test of the session failed."""
    ensure_toolchain()
    dev = DevCluster(name)
    STARTED.append(dev)
    try:
        dev.up(**up)
    except BaseException:
        dev.down()
        raise
    track(dev)
    try:
        yield dev
    finally:
        dev.down()
        assert dev.leftover_processes() == []
        if request.session.testsfailed == 0:
            dev.purge()


def prerequisites_missing(reason: str) -> None:
    """Skip on a workstation; fail under CI (an e2e tier that silently skips tests nothing)."""
    if IN_CI:
        pytest.fail(f"e2e prerequisites missing under CI=true: {reason}", pytrace=False)
    pytest.skip(f"e2e prerequisites missing: {reason}")


def ensure_toolchain() -> Toolchain:
    """The pinned binaries, built when missing (set NEURONETES_E2E_BUILD=0 not to build)."""
    tools = Toolchain.pinned()
    missing = tools.missing()
    if not missing:
        return tools
    if os.environ.get("NEURONETES_E2E_BUILD", "1") == "0":
        prerequisites_missing(
            "control-plane binaries not built (run hack/build-control-plane.sh): "
            + ", ".join(map(str, missing))
        )
    log = cache_root() / "build.log"
    try:
        return build(log=log)
    except BuildError as exc:
        prerequisites_missing(str(exc))
    raise AssertionError("unreachable")


def ensure_real_node_toolchain() -> Toolchain:
    """The pinned binaries with the kubelet and containerd (built when missing, unless
    NEURONETES_E2E_BUILD=0); skip when real nodes cannot run here (not root, packages missing)."""
    from neuronetes.devcluster.realnodes import missing_requirements

    tools = ensure_toolchain()
    if (
        any(not p.exists() for p in tools.node_binaries())
        and os.environ.get("NEURONETES_E2E_BUILD", "1") != "0"
    ):
        try:
            tools = build(quiet=True)
        except BuildError as exc:
            pytest.skip(f"kubelet/containerd not built: {exc}")
    why = missing_requirements(tools)
    if why:
        pytest.skip("real nodes cannot run here: " + "; ".join(why))
    return tools


def stop_process(proc: subprocess.Popen[bytes], grace_s: float = 15.0) -> int:
    """SIGTERM, then SIGKILL after `grace_s`; the exit status."""
    proc.terminate()
    try:
        return proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


def pinned_pod(name: str, namespace: str, node: str, limits: dict[str, str]) -> dict[str, Any]:
    """A pod for NeuroNetes' scheduler pinned to the simulated node `node` (it tolerates the kwok
    taint), one container ``main`` with `limits`, gone at once when deleted."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "schedulerName": SCHEDULER_NAME,
            "terminationGracePeriodSeconds": 0,
            "nodeSelector": {"kubernetes.io/hostname": node},
            "tolerations": [dict(KWOK_TAINT, operator="Equal")],
            "containers": [
                {"name": "main", "image": "registry.example/worker:1", "resources": {"limits": limits}}
            ],
        },
    }


def wait_until(
    fn: Callable[[], T | None], *, timeout: float = 30.0, interval: float = 0.2, what: str = "condition"
) -> T:
    """Poll `fn` until it returns something truthy; return that, or fail after `timeout`."""
    deadline = time.monotonic() + timeout
    last = fn()
    while not last:
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")
        time.sleep(interval)
        last = fn()
    return last


def wait_until_policies_enforced(
    cluster: E2ECluster | DevCluster, probes: Sequence[PolicyProbe] | None = None, *, timeout: float = 60.0
) -> float:
    """Until the API server enforces the admission policies a test relies on; the seconds it took.

    A policy is enforced a while after it is created (`neuronetes.devcluster.policyprobe`): each
    policy's probe, a server-side dry run the policy must refuse, is sent until it is refused.
    `probes`: those of the policies of manifests/policies/ by default; for a chart-mode cluster,
    ``ChartOps(dev).policy_probes()`` (the release's agent). Fails the test after `timeout`.
    """
    dev = cluster.dev if isinstance(cluster, E2ECluster) else cluster
    if probes is None:
        probes = probes_for(policy_names(POLICIES_DIR))
    try:
        return wait_enforced(dev.kubectl, probes, timeout_s=timeout)
    except PoliciesNotEnforced as exc:
        pytest.fail(str(exc), pytrace=False)


def run_documented_policy_wait(cluster: E2ECluster | DevCluster) -> subprocess.CompletedProcess[str]:
    """docs/webhook.md's ``kubectl`` probe block for platform teams ("Right after `helm install`"),
    run as written (``bash -euo pipefail``) against `cluster` with the pinned kubectl."""
    dev = cluster.dev if isinstance(cluster, E2ECluster) else cluster
    text = (REPO_ROOT / "docs" / "webhook.md").read_text()
    section = text.split("\n## Right after `helm install`", 1)[1].split("\n## ", 1)[0]
    block = section.split("```bash\n", 1)[1].split("```", 1)[0]
    env = {
        **os.environ,
        "KUBECONFIG": str(dev.kubeconfig),
        "PATH": f"{dev.tools.kubectl.parent}:{os.environ.get('PATH', '')}",
    }
    return subprocess.run(
        ["bash", "-euo", "pipefail", "-c", block], env=env, capture_output=True, text=True, timeout=120
    )


class E2ECluster:
    """What e2e tests get: a running dev cluster and convenient clients for it."""

    def __init__(self, dev: DevCluster) -> None:
        self.dev = dev

    @property
    def name(self) -> str:
        return self.dev.name

    @property
    def kubeconfig(self) -> Path:
        return self.dev.kubeconfig

    @property
    def extender_kubeconfig(self) -> Path:
        """The extender's credentials (its ServiceAccount): what an extender a test runs uses."""
        return self.dev.extender_kubeconfig

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        return self.dev.kubectl(*args, input=input, check=check)

    def add_nodes(self, profile: str, count: int, prefix: str, **kwargs: Any) -> list[str]:
        return self.dev.add_nodes(profile, count, prefix, **kwargs)

    def api_client(self, kubeconfig: Path | None = None) -> Any:
        """A `kubernetes.client.ApiClient` for this cluster (admin credentials by default)."""
        from kubernetes import config

        return config.new_client_from_config(config_file=str(kubeconfig or self.kubeconfig))

    def extender_api_client(self) -> Any:
        """A `kubernetes.client.ApiClient` with the extender's credentials."""
        return self.api_client(self.extender_kubeconfig)

    def set_extender(self, extender: str | ExtenderConfig | None) -> None:
        """Restart kube-scheduler calling `extender` (a URL prefix or a full config; None: none)."""
        cfg = ExtenderConfig.from_url(extender) if isinstance(extender, str) else extender
        self.dev.set_extender(cfg)
        track(self.dev)

    wait_until = staticmethod(wait_until)
