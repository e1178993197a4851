"""The operator's settings: a YAML/JSON file (`neuronetes operator run --config`), all optional."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Final, Literal

import msgspec
import msgspec.yaml

from neuronetes import contracts as c

__all__ = [
    "MIG_PARTED_CONFIG_MAP",
    "AutoscalerSettings",
    "CarbonSettings",
    "IntensitySourceSettings",
    "MigLayoutSettings",
    "OperatorSettings",
    "load_settings",
]


class AutoscalerSettings(
    msgspec.Struct, kw_only=True, rename="camel", forbid_unknown_fields=True, frozen=True
):
    """The autoscaling controller (docs/autoscaling.md, "The controller").

    Attributes:
        enabled: run the controller (off: ``spec.autoscaling`` and ``autoscaleOnLag`` are not acted on).
        interval_seconds: one tick every this many seconds (each pool's decision interval).
        pools_per_tick: pools decided in one tick at most; a cluster with more is served in turns
            (each tick starts where the last stopped), so each pool is decided at least every
            ``ceil(pools / poolsPerTick)`` ticks.
        bindings_per_tick: ToolBindings read in one tick at most, in turns as the pools.
        http_timeout_seconds: one Prometheus query or one pod scrape, connect and read together.
        scrape_concurrency: pod scrapes (``source: pods``) or Prometheus queries in flight at once.
        max_scrape_bytes: a pod's /metrics body read at most; a larger one counts as a failed scrape.
        prometheus_url: the Prometheus of pools with ``source: prometheus`` and no ``prometheusURL``,
            and of ToolBindings without ``spec.queue.address``.
        rate_window_seconds: the window of the counters' rates in PromQL (``rate(...[Ns])``).
    """

    enabled: bool = True
    interval_seconds: Annotated[float, msgspec.Meta(ge=0.5, le=300)] = 5.0
    pools_per_tick: Annotated[int, msgspec.Meta(ge=1, le=10000)] = 100
    bindings_per_tick: Annotated[int, msgspec.Meta(ge=1, le=10000)] = 100
    http_timeout_seconds: Annotated[float, msgspec.Meta(ge=0.1, le=60)] = 2.0
    scrape_concurrency: Annotated[int, msgspec.Meta(ge=1, le=256)] = 16
    max_scrape_bytes: Annotated[int, msgspec.Meta(ge=1024, le=64 << 20)] = 4 << 20
    prometheus_url: Annotated[str, msgspec.Meta(max_length=2048, pattern=r"^https?://[^\s]+$")] | None = (
        msgspec.field(default=None, name="prometheusURL")
    )
    rate_window_seconds: Annotated[int, msgspec.Meta(ge=2, le=3600)] = 60


class IntensitySourceSettings(
    msgspec.Struct, kw_only=True, rename="camel", forbid_unknown_fields=True, frozen=True
):
    """Where the carbon gate controller reads the grid's intensity (docs/carbon.md, "Sources").

    Attributes:
        type: ``file`` (a YAML/JSON file, e.g. a mounted ConfigMap), ``carbon-aware-sdk`` (the Carbon
            Aware SDK Web API), ``electricity-maps`` (v3 API) or ``watttime`` (v3 API).
        path: the file (type ``file``).
        url: the API's base URL (the HTTP types), e.g. ``https://api.electricitymap.org``.
        location: the SDK's ``location``, the Electricity Maps ``zone`` or the WattTime ``region``.
        window_minutes: the SDK's ``windowSize``.
        username: the WattTime user name (not a secret).
        credential_file: a mounted Secret key holding the Electricity Maps token or the WattTime
            password; credential_env: else the environment variable holding it (``secretKeyRef``).
        refresh_seconds: read the source this often; a reading older than twice this is stale and
            releases every gated pod (fail open).
        timeout_seconds: one HTTP request, connect and read together (answers are read up to 1 MiB).
    """

    type: Literal["file", "carbon-aware-sdk", "electricity-maps", "watttime"]
    path: str | None = None
    url: Annotated[str, msgspec.Meta(max_length=2048, pattern=r"^https?://[^\s]+$")] | None = msgspec.field(
        default=None, name="url"
    )
    location: Annotated[str, msgspec.Meta(max_length=128)] | None = None
    window_minutes: Annotated[int, msgspec.Meta(ge=1, le=1440)] = 60
    username: Annotated[str, msgspec.Meta(max_length=256)] | None = None
    credential_file: str | None = None
    credential_env: Annotated[str, msgspec.Meta(max_length=256)] | None = None
    refresh_seconds: Annotated[float, msgspec.Meta(ge=0.5, le=86400)] = 300.0
    timeout_seconds: Annotated[float, msgspec.Meta(ge=0.1, le=60)] = 5.0


class CarbonSettings(msgspec.Struct, kw_only=True, rename="camel", forbid_unknown_fields=True, frozen=True):
    """The carbon gate-release controller (docs/carbon.md, "The controller").

    Attributes:
        enabled: run the controller (off: gated pods wait for nothing but deletion — keep it on
            wherever the webhook gates pods).
        interval_seconds: one tick (read gated pods, decide, release) every this many seconds.
        source: the intensity source (`IntensitySourceSettings`); none: only the clean-energy
            window and the pods' release-by times release them.
        prometheus_url: where ``neuronetes_gpu_power_watts`` is read for the gCO2 estimate; none:
            the GPU family's TDP.
    """

    enabled: bool = True
    interval_seconds: Annotated[float, msgspec.Meta(ge=0.2, le=3600)] = 30.0
    source: IntensitySourceSettings | None = None
    prometheus_url: Annotated[str, msgspec.Meta(max_length=2048, pattern=r"^https?://[^\s]+$")] | None = (
        msgspec.field(default=None, name="prometheusURL")
    )


MIG_PARTED_CONFIG_MAP: Final = "neuronetes-mig-parted-config"
"""The name of mig-manager's ConfigMap the MIG layout controller writes (its RBAC names it)."""


class MigLayoutSettings(
    msgspec.Struct, kw_only=True, rename="camel", forbid_unknown_fields=True, frozen=True
):
    """The MIG layout controller (docs/mig.md, "Applying a plan").

    Attributes:
        enabled: run the controller (off: MIG demand no current layout serves stays Pending).
        interval_seconds: one tick (read pending pods and GPUNodes, plan, write) every this many seconds.
        min_relayout_interval_seconds: a GPU is re-laid out at most once in this many seconds.
        max_demand_per_tick: MIG instances of pending pods planned for in one tick at most (oldest
            pods first; the rest wait for the next tick).
        max_gpus_per_tick: MIG GPUs the planner sees in one tick at most (nodes in name order).
        max_nodes_per_tick: nodes whose layout one tick writes at most.
        apply_timeout_seconds: a relayout not applied after this long is Failed (a node the operator
            cordoned for it is uncordoned).
        mig_manager_config_map: ``NAMESPACE/NAME`` of the ConfigMap whose ``config.yaml`` NVIDIA's
            mig-manager reads (the GPU operator's ``migManager.config.name``); the name is
            `MIG_PARTED_CONFIG_MAP`, the one the operator's RBAC lets it read and patch.
        allow_mode_change: on mig-manager nodes, also offer MIG-capable GPUs with MIG off and no
            work as empty MIG GPUs (switching a GPU's mode needs it idle: the node is cordoned while
            mig-manager applies such a config).
    """

    enabled: bool = True
    interval_seconds: Annotated[float, msgspec.Meta(ge=0.5, le=3600)] = 30.0
    min_relayout_interval_seconds: Annotated[float, msgspec.Meta(ge=0, le=86400)] = 600.0
    max_demand_per_tick: Annotated[int, msgspec.Meta(ge=1, le=10000)] = 512
    max_gpus_per_tick: Annotated[int, msgspec.Meta(ge=1, le=4096)] = 256
    max_nodes_per_tick: Annotated[int, msgspec.Meta(ge=1, le=1000)] = 16
    apply_timeout_seconds: Annotated[float, msgspec.Meta(ge=10, le=86400)] = 900.0
    mig_manager_config_map: Annotated[
        str,
        msgspec.Meta(max_length=92, pattern=rf"^[a-z0-9]([-a-z0-9]*[a-z0-9])?/{MIG_PARTED_CONFIG_MAP}$"),
    ] = f"gpu-operator/{MIG_PARTED_CONFIG_MAP}"
    allow_mode_change: bool = False


class OperatorSettings(msgspec.Struct, kw_only=True, rename="camel", forbid_unknown_fields=True, frozen=True):
    """What the operator does beyond the objects' specs.

    Attributes:
        namespaces: watch only these namespaces (empty: the whole cluster).
        workers: AgentPools reconciled at the same time (each pool is reconciled by one at a time).
        resync_seconds: every pool is reconciled at least this often, events or not.
        node_resync_seconds: the nodes are listed in full this often (besides the node watch; the
            first list comes before any pool reconcile): a node deleted while the watch was down is
            dropped (`neuronetes_operator.nodecache`).
        pod_tolerations: added to every pool pod, e.g. the taint of simulated (kwok) nodes on a dev
            cluster; empty in production, where pools say what they tolerate in their template.
        gang_retry_seconds, gang_retry_max_seconds: a gang whose reservation failed is recreated at
            once, then each time no sooner than this × 2^(retries-1) seconds after, at most the max.
        batch_size: pod creations and deletions one reconcile of a pool does at most (whole gangs:
            a gang larger than this goes alone); a pool with more to do is reconciled again at once,
            behind the pools already queued (docs/agentpool.md, "Batches").
        metrics_port: serve the operator's Prometheus metrics on this port (all addresses; 0: none).
        price_table: ``NAMESPACE/NAME`` of the price table's ConfigMap (docs/cost.md), watched:
            node prices for nodes without a ``neuronetes.io/price-per-hour`` label (the chart sets
            its ``neuronetes-price-table``); unset or empty: prices come from node labels alone.
        autoscaler: the autoscaling controller's settings (`AutoscalerSettings`).
        carbon: the carbon gate-release controller's settings (`CarbonSettings`).
        mig_layouts: the MIG layout controller's settings (`MigLayoutSettings`).
        spot_rebalance_notices: treat the AWS Node Termination Handler's rebalance-recommendation
            taint as an interruption notice (docs/spot.md; off: it is only a hint).
        model_cache_dir: the nodes' model cache directory, which preload Jobs write into
            (docs/model-cache.md; the chart sets the agent's ``agent.hostPaths.modelCacheDir``).
    """

    namespaces: list[str] = msgspec.field(default_factory=list)
    workers: Annotated[int, msgspec.Meta(ge=1, le=64)] = 4
    resync_seconds: Annotated[float, msgspec.Meta(ge=1, le=3600)] = 30.0
    node_resync_seconds: Annotated[float, msgspec.Meta(ge=10, le=86400)] = 300.0
    pod_tolerations: list[dict[str, Any]] = msgspec.field(default_factory=list)
    gang_retry_seconds: Annotated[float, msgspec.Meta(ge=0.1, le=3600)] = 10.0
    gang_retry_max_seconds: Annotated[float, msgspec.Meta(ge=1, le=86400)] = 300.0
    batch_size: Annotated[int, msgspec.Meta(ge=1, le=1024)] = 64
    metrics_port: Annotated[int, msgspec.Meta(ge=0, le=65535)] = 0
    price_table: (
        Annotated[
            str,
            msgspec.Meta(
                max_length=317,
                pattern=r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?/[a-z0-9]([-a-z0-9.]*[a-z0-9])?)?$",
            ),
        ]
        | None
    ) = None
    autoscaler: AutoscalerSettings = msgspec.field(default_factory=AutoscalerSettings)
    carbon: CarbonSettings = msgspec.field(default_factory=CarbonSettings)
    mig_layouts: MigLayoutSettings = msgspec.field(default_factory=MigLayoutSettings)
    spot_rebalance_notices: bool = False
    model_cache_dir: Annotated[str, msgspec.Meta(max_length=1024, pattern=r"^/[^\s]*$")] = (
        c.NODE_MODEL_CACHE_DIR
    )


def load_settings(path: str | Path | None) -> OperatorSettings:
    """Settings from a YAML or JSON file (None: defaults).

    Raises:
        OSError: the file cannot be read. msgspec.ValidationError / msgspec.DecodeError: bad content.
    """
    if path is None:
        return OperatorSettings()
    return msgspec.yaml.decode(Path(path).read_bytes(), type=OperatorSettings)
