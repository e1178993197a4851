"""Killing the extender in the middle of a gang: the reservation survives in the API.

The extender runs as its own process (`neuronetes extender serve`) behind the real kube-scheduler,
so it can be killed with SIGKILL while gang members wait at its bind barrier. A new process on
the same port restores the reservation from its ``GangReservation`` object before it reports
ready; then either the gang completes on the reserved node, or the reservation expires and its
GPUs are free again. No GPU is ever given twice.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e_cluster import E2ECluster, wait_until
from extender_harness import ExtenderProcess
from pod_builder import manifest

from neuronetes import contracts as c
from neuronetes.devcluster import ExtenderConfig

pytestmark = pytest.mark.e2e

NAMESPACE = "restart-e2e"
SUITE_LABEL = ("neuronetes.io/e2e-suite", "restart")


@pytest.fixture(scope="module")
def extender_process(
    cluster: E2ECluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ExtenderProcess]:
    workdir = Path(tmp_path_factory.mktemp("restart"))
    config = workdir / "extender.yaml"
    config.write_text("assumeTTLSeconds: 60\ngangTTLSeconds: 120\nbindWaitSeconds: 100\n")
    ext = ExtenderProcess(cluster.extender_kubeconfig, workdir, config)
    cluster.add_nodes("dgx-a100-80gb", 3, "rs-dgx", labels=dict([SUITE_LABEL]))
    cluster.kubectl("create", "namespace", NAMESPACE)
    ext.start()
    cluster.set_extender(ExtenderConfig(url=ext.url, weight=20))
    try:
        yield ext
    finally:
        ext.stop()
        cluster.kubectl("delete", "namespace", NAMESPACE, "--wait=false", check=False)
        cluster.set_extender(ExtenderConfig.from_env())


def member(
    name: str, group: str, *, node: str | None = None, gpus: int = 2, timeout_s: int | None = None
) -> dict[str, Any]:
    annotations = {c.ANNOTATION_LOCALITY: "same-node"}
    if timeout_s is not None:
        annotations[c.ANNOTATION_GANG_TIMEOUT] = str(timeout_s)
    selector = dict([SUITE_LABEL])
    if node:
        selector["kubernetes.io/hostname"] = node
    return manifest(
        name,
        {c.RESOURCE_GPU: gpus},
        namespace=NAMESPACE,
        labels={c.LABEL_GANG: group, c.LABEL_GANG_SIZE: "4"} if group else {},
        annotations=annotations,
        node_selector=selector,
    )


def create(cluster: E2ECluster, *pods: dict[str, Any]) -> None:
    cluster.kubectl(
        "create", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": list(pods)})
    )


def pods_json(cluster: E2ECluster) -> list[dict[str, Any]]:
    return list(json.loads(cluster.kubectl("get", "pods", "-n", NAMESPACE, "-o", "json").stdout)["items"])


def reservation(cluster: E2ECluster, group: str) -> dict[str, Any] | None:
    items = json.loads(cluster.kubectl("get", "gangreservations", "-n", NAMESPACE, "-o", "json").stdout)[
        "items"
    ]
    return next((r for r in items if r["spec"]["groupName"] == group), None)


def no_gpu_given_twice(cluster: E2ECluster) -> None:
    used: dict[tuple[str, int], str] = {}
    for p in pods_json(cluster):
        raw = (p["metadata"].get("annotations") or {}).get(c.ANNOTATION_ASSIGNED_GPUS)
        if not raw or not p["spec"].get("nodeName"):
            continue
        doc = c.decode_assignment(raw)
        for x in doc.containers.values():
            for g in x.gpus:
                key = (doc.node, g.index)
                assert used.setdefault(key, p["metadata"]["name"]) == p["metadata"]["name"], key


def test_gang_completes_on_its_reserved_node_after_the_extender_is_killed(
    cluster: E2ECluster, extender_process: ExtenderProcess
) -> None:
    ext = extender_process
    create(cluster, *(member(f"resume-{k}", "resume") for k in range(3)))  # 3 of 4: binds wait

    def claimed() -> dict[str, Any] | None:
        res = reservation(cluster, "resume")
        if res is None:
            return None
        names = {m["name"] for m in res["spec"]["members"]}
        return res if {"resume-0", "resume-1", "resume-2"} <= names else None

    res = wait_until(claimed, timeout=60, what="the gang reserved, 3 members claimed")
    (node,) = {m["node"] for m in res["spec"]["members"]}
    assert all(not p["spec"].get("nodeName") for p in pods_json(cluster)), "bound before the barrier"
    ext.kill()  # mid-gang: three binds are waiting at the barrier
    ext.start()  # restores the reservation before it reports ready
    create(cluster, member("resume-3", "resume"))

    def all_running() -> list[dict[str, Any]] | None:
        mine = [p for p in pods_json(cluster) if p["metadata"]["name"].startswith("resume-")]
        return mine if len(mine) == 4 and all(p["status"].get("phase") == "Running" for p in mine) else None

    pods = wait_until(all_running, timeout=120, what="the gang Running after the restart")
    assert {p["spec"]["nodeName"] for p in pods} == {node}
    no_gpu_given_twice(cluster)
    wait_until(
        lambda: reservation(cluster, "resume") is None, timeout=30, what="the spent reservation deleted"
    )
    assert "reservation restored" in ext.tail(lines=1000)


def test_reservation_expires_after_a_restart_and_its_gpus_are_free_again(
    cluster: E2ECluster, extender_process: ExtenderProcess
) -> None:
    ext = extender_process
    create(cluster, *(member(f"stuck-{k}", "stuck", timeout_s=25) for k in range(2)))  # 2 of 4 ever come
    res = wait_until(lambda: reservation(cluster, "stuck"), timeout=60, what="the gang reserved")
    (node,) = {m["node"] for m in res["spec"]["members"]}
    ext.kill()
    # The members go away while the extender is down; their reservation still holds 8 GPUs.
    cluster.kubectl("delete", "pod", "stuck-0", "stuck-1", "-n", NAMESPACE, "--wait=true")
    ext.start()
    assert (reservation(cluster, "stuck") or {}).get("status", {}).get("phase") == "Reserved"

    def expired() -> bool:
        res = reservation(cluster, "stuck")
        return res is not None and res.get("status", {}).get("phase") == "Expired"

    wait_until(expired, timeout=60, what="the reservation expired")
    create(cluster, member("whole-node", "", node=node, gpus=8))

    def running() -> bool:
        p = next(p for p in pods_json(cluster) if p["metadata"]["name"] == "whole-node")
        return bool(p["status"].get("phase") == "Running")

    wait_until(running, timeout=60, what="an 8-GPU pod on the freed node")
    no_gpu_given_twice(cluster)


def test_sigterm_with_a_gang_member_waiting_exits_within_10_s(
    cluster: E2ECluster, extender_process: ExtenderProcess
) -> None:
    """Kubernetes gives a pod 30 s between SIGTERM and SIGKILL: a bind waiting at the gang barrier
    (for up to bindWaitSeconds, 100 s here) must fail at once, not hold the shutdown."""
    create(cluster, member("term-0", "term"))

    def waiting() -> bool:
        text = cluster.kubectl("describe", "pod", "-n", NAMESPACE, "term-0").stdout
        return "GangWaiting" in text

    wait_until(waiting, timeout=60, what="term-0 waiting at the bind barrier")
    took = extender_process.stop(grace_s=30)
    assert took is not None and took <= 10, f"the extender took {took} s to exit after SIGTERM"
    assert "Traceback" not in extender_process.tail(200)
