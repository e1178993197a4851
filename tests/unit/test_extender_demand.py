"""The extender's fragmentation and pending-gang gauges (`neuronetes_extender.demand`), on a real cache."""

from __future__ import annotations

import msgspec
import pytest
from extender_support import (
    FakeClock,
    bound_with,
    gpu_pod,
    metric_value,
    node_objects,
    shared_pod,
    synced_cache,
)

from neuronetes import contracts as c
from neuronetes_extender.demand import PendingGangClock
from neuronetes_extender.events import EventRecorder
from neuronetes_extender.metrics import ExtenderMetrics
from neuronetes_extender.watch import WatchHealth
from neuronetes_extender.wire import Pod

pytestmark = pytest.mark.unit

T4 = "nt4x4-pcie-0"  # 4 × T4 (15360 MiB)


def _pod(obj: dict[str, object]) -> Pod:
    return msgspec.convert(obj, Pod)


def _gang(obj: dict[str, object], name: str, timeout: int | None = None) -> dict[str, object]:
    meta = obj["metadata"]
    assert isinstance(meta, dict)
    meta.setdefault("labels", {}).update({c.LABEL_GANG: name, c.LABEL_GANG_SIZE: "2"})
    if timeout is not None:
        meta.setdefault("annotations", {})[c.ANNOTATION_GANG_TIMEOUT] = str(timeout)
    return obj


def test_nothing_pending_means_nothing_fragmented() -> None:
    cache = synced_cache(node_objects({"t4x4-pcie": 2}))
    demand = cache.demand()
    assert (demand.gpus_allocated, demand.gpus_unallocated) == (0.0, 8.0)
    assert (demand.gpus_fragmented, demand.pending_gangs) == (0.0, {})


def test_half_used_gpus_no_pending_whole_gpu_shape_can_use_are_fragmented() -> None:
    cache = synced_cache(node_objects({"t4x4-pcie": 1}))
    # Every GPU of the node half used: 2 GPUs' worth free, but no GPU is whole.
    used = bound_with(shared_pod("half", 4096, 50), T4, {j: (4096, 50) for j in range(4)})
    waiting = gpu_pod("whole", 1)
    cache.replace_pods([_pod(used), _pod(waiting)])
    demand = cache.demand()
    assert (demand.gpus_allocated, demand.gpus_unallocated) == pytest.approx((2.0, 2.0))
    assert demand.gpus_fragmented == pytest.approx(2.0)
    # A pending shared shape that fits the halves uses them: nothing is fragmented any more.
    cache.upsert_pod(_pod(shared_pod("small", 1024, 25)))
    assert cache.demand().gpus_fragmented == pytest.approx(0.0)


def test_a_node_with_too_few_free_gpus_for_the_shape_is_all_fragment() -> None:
    cache = synced_cache(node_objects({"t4x4-pcie": 1}))
    used = bound_with(gpu_pod("three", 3), T4, {j: (15360, 100) for j in range(3)})
    cache.replace_pods([_pod(used), _pod(gpu_pod("pair", 2))])
    demand = cache.demand()
    assert (demand.gpus_unallocated, demand.gpus_fragmented) == (1.0, 1.0)


def test_pending_gangs_carry_their_timeout() -> None:
    cache = synced_cache(node_objects({"t4x4-pcie": 1}))
    pods = [
        _gang(gpu_pod("a-0", 8), "a"),
        _gang(gpu_pod("a-1", 8), "a"),
        _gang(gpu_pod("b-0", 8), "b", timeout=30),
        gpu_pod("solo", 8),
    ]
    cache.replace_pods([_pod(p) for p in pods])
    gangs = cache.demand().pending_gangs
    ttl = cache.settings.get().gang_ttl_seconds
    assert gangs == {"default/a": ttl, "default/b": 30.0}


def test_gang_clock_counts_gangs_pending_past_their_timeout() -> None:
    clock = FakeClock()
    gangs = PendingGangClock(clock)
    assert gangs.past_timeout({"ns/a": 10.0, "ns/b": 100.0}) == 0
    clock.now += 11
    assert gangs.past_timeout({"ns/a": 10.0, "ns/b": 100.0}) == 1
    # A gang no longer pending is forgotten; pending again, its clock starts over.
    assert gangs.past_timeout({"ns/b": 100.0}) == 0
    assert gangs.past_timeout({"ns/a": 10.0, "ns/b": 100.0}) == 0


def test_the_gauges_are_exported() -> None:
    cache = synced_cache(node_objects({"t4x4-pcie": 1}))
    cache.replace_pods([_pod(_gang(gpu_pod("g-0", 8), "g"))])
    metrics = ExtenderMetrics(cache.stats)
    metrics.attach(WatchHealth(), EventRecorder(None), cache.demand)
    text = metrics.render().decode()
    assert metric_value(text, c.METRIC_GPUS_ALLOCATED) == 0.0
    assert metric_value(text, c.METRIC_GPUS_UNALLOCATED) == 4.0
    assert metric_value(text, c.METRIC_GPUS_FRAGMENTED) == 4.0  # an 8-GPU shape fits nowhere
    assert metric_value(text, c.METRIC_GANGS_PENDING) == 1.0
    assert metric_value(text, c.METRIC_GANGS_PAST_TIMEOUT) == 0.0


def test_the_metrics_only_listener_serves_the_same_metrics_and_nothing_else() -> None:
    import urllib.error
    import urllib.request

    cache = synced_cache(node_objects({"t4x4-pcie": 1}))
    metrics = ExtenderMetrics(cache.stats)
    metrics.attach(WatchHealth(), EventRecorder(None), cache.demand)
    port = metrics.serve("127.0.0.1", 0)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    assert metric_value(text, c.METRIC_GPUS_UNALLOCATED) == 4.0
    assert metric_value(text, c.METRIC_CACHE_GPUS) == 4.0
    # Read-only: the verbs are not served there.
    request = urllib.request.Request(f"http://127.0.0.1:{port}/bind", data=b"{}", method="POST")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=5)
    assert refused.value.code in {404, 405}
