"""Two kube-scheduler + extender pairs with leader election: the leader pair is killed mid-stream.

The cluster runs both pairs as host processes (`neuronetes dev cluster up --schedulers 2`): each
kube-scheduler calls its own extender on its own loopback port, and the standby's extender keeps
its watches, so its cache is warm when its kube-scheduler takes the lease. The test SIGKILLs the
leader's kube-scheduler and extender while single pods and a 4 x 2 gang are being scheduled, keeps
submitting, and checks from the API that every pod ends bound and no GPU was given twice. It
prints the failover gap: the last bind before the kill to the first bind after it.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from e2e_cluster import own_cluster, wait_until
from gpu_ledger import gpu_memory_of, no_gpu_given_twice
from pod_builder import manifest

from neuronetes import contracts as c
from neuronetes.devcluster import POLICIES_DIR, DevCluster

pytestmark = pytest.mark.e2e

NAMESPACE = "ha-e2e"
GANG = {c.LABEL_GANG: "ha-train", c.LABEL_GANG_SIZE: "4"}
TAIL_S = 1.0


@pytest.fixture(scope="module")
def ha(request: pytest.FixtureRequest) -> Iterator[DevCluster]:
    with own_cluster(
        request,
        f"ha-e2e-{os.getpid()}",
        run_extender=True,
        schedulers=2,
        policies_dir=POLICIES_DIR,
        nodes=[("dgx-a100-80gb", 6)],
    ) as dev:
        yield dev


class BindWatcher:
    """Polls the namespace's pods every 0.1 s; records when each was first seen bound (monotonic)."""

    def __init__(self, dev: DevCluster) -> None:
        self.api = dev.api()
        self.bound_at: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            items = self.api.request("GET", f"/api/v1/namespaces/{NAMESPACE}/pods")["items"]
            now = time.monotonic()
            for pod in items:
                if pod["spec"].get("nodeName"):
                    self.bound_at.setdefault(pod["metadata"]["name"], now)

    def __enter__(self) -> BindWatcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)


def batch(tag: str) -> list[dict[str, Any]]:
    """Whole GPUs, pairs and shared slices: 16 pods, 20 whole GPUs and 4 slices."""
    pods = [manifest(f"{tag}-one-{k}", {c.RESOURCE_GPU: 1}, namespace=NAMESPACE) for k in range(8)]
    pods += [manifest(f"{tag}-two-{k}", {c.RESOURCE_GPU: 2}, namespace=NAMESPACE) for k in range(4)]
    shared = {c.RESOURCE_GPU_MEMORY: 10240, c.RESOURCE_GPU_COMPUTE: 30}
    return pods + [manifest(f"{tag}-shared-{k}", shared, namespace=NAMESPACE) for k in range(4)]


def member(k: int) -> dict[str, Any]:
    locality = {c.ANNOTATION_LOCALITY: "same-node"}
    return manifest(f"gang-{k}", {c.RESOURCE_GPU: 2}, namespace=NAMESPACE, labels=GANG, annotations=locality)


def test_killing_the_leader_pair_loses_no_pod_and_gives_no_gpu_twice(ha: DevCluster) -> None:
    api = ha.api()
    api.request("POST", "/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
    wait_until(lambda: ha.leader() is not None, timeout=30, what="a kube-scheduler holding the lease")
    leader = ha.leader()
    assert leader is not None
    scheduler, extender = ha.pair(leader)
    pods_path = f"/api/v1/namespaces/{NAMESPACE}/pods"
    reservations = f"/apis/{c.API_VERSION}/namespaces/{NAMESPACE}/gangreservations"
    singles = [*batch("a"), *batch("b")]
    # A steady stream: 8 single pods, 3 of the gang's 4 members (they wait at the barrier),
    # the other 24 single pods, the last member; the kill lands while the stream still flows.
    stream = [*singles[:8], *(member(k) for k in range(3)), *singles[8:], member(3)]
    gang_waiting = threading.Event()

    def submit() -> None:
        for pod in stream:
            api.request("POST", pods_path, pod)
            if pod["metadata"]["name"] == "gang-2":
                gang_waiting.set()
            time.sleep(0.1)

    creator = threading.Thread(target=submit, daemon=True)
    with BindWatcher(ha) as seen:
        creator.start()
        wait_until(gang_waiting.is_set, timeout=60, what="three gang members submitted")
        (reserved,) = wait_until(
            lambda: api.request("GET", reservations)["items"], timeout=30, what="the gang reserved"
        )
        killed_at = time.monotonic()
        ha.kill(scheduler, extender)
        bound_before = len(seen.bound_at)
        creator.join(60)

        def all_bound() -> bool:
            return len(seen.bound_at) == len(stream)

        wait_until(all_bound, timeout=120, interval=0.5, what="every pod bound")
    new_leader = ha.leader()
    # A bind of the dead leader may be seen just after the kill (a Binding stored as it died, or
    # the 0.1 s poll); the new leader cannot bind before the 4 s Lease has expired. So binds seen
    # within TAIL_S of the kill are the old leader's.
    before = max(t for t in seen.bound_at.values() if t <= killed_at + TAIL_S)
    after = min(t for t in seen.bound_at.values() if t > killed_at + TAIL_S)
    print(
        f"\nfailover: killed {scheduler} + {extender} with {bound_before} of {len(stream)} pods bound "
        f"(the gang's first 3 members waiting at the barrier); pair {new_leader} leads now; "
        f"gap between binds {after - before:.2f} s (kill -> first bind {after - killed_at:.2f} s); "
        f"all {len(stream)} pods bound {max(seen.bound_at.values()) - killed_at:.2f} s after the kill"
    )
    assert new_leader is not None and new_leader != leader
    pods = api.request("GET", pods_path)["items"]
    assert len(pods) == len(stream) and all(p["spec"].get("nodeName") for p in pods)
    assert all(c.ANNOTATION_ASSIGNED_GPUS in (p["metadata"].get("annotations") or {}) for p in pods)
    nodes = api.request("GET", "/api/v1/nodes")["items"]
    assert no_gpu_given_twice(pods, gpu_memory_of(nodes)) == []
    gang_nodes = {p["spec"]["nodeName"] for p in pods if p["metadata"]["name"].startswith("gang-")}
    # On the node the dead leader reserved: the standby extender followed its GangReservation.
    assert gang_nodes == {m["node"] for m in reserved["spec"]["members"]}, (gang_nodes, reserved["spec"])
    # Least privilege held: neither extender was refused a call it makes.
    for i in range(2):
        log = ha.tail(ha.pair(i)[1], lines=100_000).lower()
        assert "forbidden" not in log, log[-2000:]
    # The crashed pair comes back (same ports, same configuration) as the standby.
    ha.restart(extender)
    ha.restart(scheduler)
    assert ha.leader() == new_leader
    assert all(comp.healthy for comp in ha.status().components), ha.status().components
