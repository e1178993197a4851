"""The agent's Prometheus exporter: per-GPU metrics a dcgm-exporter user recognises, health states,
XID and state-transition counters, discovery duration, per-slice figures from the shim regions,
NVML reconciliation's evictions (names, types and labels: `neuronetes.contracts.METRICS`,
docs/contracts.md "Metrics").

A collector reads the served nodes at scrape time, so nothing is kept twice; it listens on
loopback unless configured otherwise. Per-GPU gauges carry dcgm-exporter's ``namespace``, ``pod``
and ``container`` labels for the GPU's one user (empty when the GPU is idle or shared — the
per-slice metrics give shared GPUs' users).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Final

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from neuronetes import contracts as c
from neuronetes.model import GpuHealth

from .node import NodeAgent

__all__ = ["AgentCollector", "serve_metrics"]

_SPECS: Final = {m.name: m for m in c.METRICS}


def _gauge(name: str) -> GaugeMetricFamily:
    spec = _SPECS[name]
    return GaugeMetricFamily(name, spec.help, labels=list(spec.labels))


def _counter(name: str) -> CounterMetricFamily:
    spec = _SPECS[name]
    return CounterMetricFamily(name.removesuffix("_total"), spec.help, labels=list(spec.labels))


class AgentCollector(Collector):
    """Collects from the node agents `agents()` returns."""

    def __init__(self, agents: Callable[[], Iterable[NodeAgent]]) -> None:
        self.agents = agents

    def collect(self) -> Iterator[Metric]:
        util = _gauge(c.METRIC_GPU_UTILIZATION)
        used = _gauge(c.METRIC_GPU_MEMORY_USED)
        free = _gauge(c.METRIC_GPU_MEMORY_FREE)
        total = _gauge(c.METRIC_GPU_MEMORY_TOTAL)
        temp = _gauge(c.METRIC_GPU_TEMPERATURE)
        power = _gauge(c.METRIC_GPU_POWER)
        last_xid = _gauge(c.METRIC_GPU_LAST_XID)
        health = _gauge(c.METRIC_GPU_HEALTH)
        xids = _counter(c.METRIC_GPU_XID_ERRORS)
        ecc = _counter(c.METRIC_GPU_ECC_ERRORS)
        transitions = _counter(c.METRIC_GPU_STATE_TRANSITIONS)
        evictions = _counter(c.METRIC_AGENT_EVICTIONS)
        reclaimed = _counter(c.METRIC_AGENT_SLOTS_RECLAIMED)
        slice_evictions = _counter(c.METRIC_SLICE_EVICTIONS)
        discovery = _gauge(c.METRIC_AGENT_DISCOVERY)
        for agent in list(self.agents()):
            node_state = agent.state
            with node_state.lock:
                inventory = node_state.inventory
                if inventory is None:
                    continue
                discovery.add_metric([agent.node], agent.discovery_seconds)
                reclaimed.add_metric([agent.node], node_state.counters.slots_reclaimed)
                users = node_state.allocations()
                for g in inventory.gpus:
                    gpu_labels = [agent.node, str(g.index), g.uuid, g.model]
                    mine = users.get(g.uuid, [])
                    who = (
                        [mine[0]["namespace"], mine[0]["pod"], mine[0].get("container", "")]
                        if len({(a["namespace"], a["pod"], a.get("container")) for a in mine}) == 1
                        else ["", "", ""]
                    )
                    labels = [*gpu_labels, *who]
                    s = node_state.samples.get(g.uuid)
                    if s is not None:
                        if s.utilization_percent is not None:
                            util.add_metric(labels, s.utilization_percent)
                        used.add_metric(labels, s.memory_used_bytes)
                        free.add_metric(labels, s.memory_free_bytes)
                        total.add_metric(labels, s.memory_total_bytes)
                        if s.temperature_celsius is not None:
                            temp.add_metric(labels, s.temperature_celsius)
                        if s.power_watts is not None:
                            power.add_metric(labels, s.power_watts)
                        for kind, count in (
                            ("corrected", s.ecc_corrected_total),
                            ("uncorrected", s.ecc_uncorrected_total),
                        ):
                            if count is not None:
                                ecc.add_metric([*gpu_labels, kind], count)
                    h = node_state.health.get(g.uuid)
                    last_xid.add_metric(labels, h.last_xid if h else 0)
                    state = node_state.states.get(g.uuid, (GpuHealth.AVAILABLE, ""))[0]
                    for st in GpuHealth:
                        health.add_metric([*gpu_labels, st.value], 1.0 if st is state else 0.0)
                by_uuid = {g.uuid: g for g in inventory.gpus}
                for (uuid, xid), n in node_state.counters.xids.items():
                    g = by_uuid[uuid]
                    xids.add_metric([agent.node, str(g.index), uuid, g.model, str(xid)], n)
                for (uuid, before, after), n in node_state.counters.transitions.items():
                    g = by_uuid[uuid]
                    transitions.add_metric([agent.node, str(g.index), uuid, g.model, before, after], n)
                for code, n in node_state.counters.evictions.items():
                    evictions.add_metric([agent.node, code], n)
                for (namespace, pod, reason), n in node_state.counters.slice_evictions.items():
                    slice_evictions.add_metric([agent.node, namespace, pod, reason], n)
        yield from (
            util,
            used,
            free,
            total,
            temp,
            power,
            last_xid,
            health,
            xids,
            ecc,
            transitions,
            evictions,
            reclaimed,
            slice_evictions,
            discovery,
        )
        yield from _slices(list(self.agents()))


def _slices(agents: list[NodeAgent]) -> Iterator[Metric]:
    """Per-slice metrics from the containers' shim regions (nodes with real GPUs)."""
    limit = _gauge(c.METRIC_SLICE_MEMORY_LIMIT)
    used = _gauge(c.METRIC_SLICE_MEMORY_USED)
    share = _gauge(c.METRIC_SLICE_COMPUTE_SHARE)
    kernel = _counter(c.METRIC_SLICE_KERNEL_TIME)
    throttled = _counter(c.METRIC_SLICE_THROTTLED_TIME)
    ooms = _counter(c.METRIC_SLICE_OOM_REFUSALS)
    paused = _gauge(c.METRIC_SLICE_PAUSED)
    for agent in agents:
        if agent.regions is None:
            continue
        with agent.lock:
            pods = list(agent.state.pods.values())
        for pod in pods:
            for container in pod.assignment.containers:
                for s in agent.regions.read(pod.uid, container):
                    labels = [agent.node, pod.namespace, pod.name, container, s.uuid]
                    limit.add_metric(labels, s.memory_limit_bytes)
                    used.add_metric(labels, s.memory_used_bytes)
                    share.add_metric(labels, s.compute_share_percent / 100)
                    kernel.add_metric(labels, s.kernel_ns_total / 1e9)
                    throttled.add_metric(labels, s.throttled_ns_total / 1e9)
                    ooms.add_metric(labels, s.oom_refusals_total)
                    paused.add_metric(labels, 1.0 if s.paused else 0.0)
    yield from (limit, used, share, kernel, throttled, ooms, paused)


def serve_metrics(agents: Callable[[], Iterable[NodeAgent]], port: int, host: str = "127.0.0.1") -> int:
    """Serve /metrics on `host`:`port` (0: any free port) in a daemon thread; returns the port."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(AgentCollector(agents))
    server, _ = start_http_server(port, addr=host, registry=registry)
    return int(server.server_port)
