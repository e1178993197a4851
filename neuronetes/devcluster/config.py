"""What kube-scheduler and the extender read: the scheduler configuration and the extender's settings.

This is the one place that renders them for the dev cluster (and the shape a Helm chart renders):
`scheduler_config` gives NeuroNetes' kube-scheduler's ``KubeSchedulerConfiguration`` — the
``neuronetes-scheduler`` profile, the extender entries and leader election — and
`extender_settings` the settings file of ``neuronetes extender serve``. The cluster's own
scheduler (`default_scheduler_config`) runs apart, as in any cluster NeuroNetes is installed in.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from neuronetes import mig
from neuronetes.contracts import RESOURCE_GPU, RESOURCE_GPU_COMPUTE, RESOURCE_GPU_MEMORY, SCHEDULER_NAME
from neuronetes.profiles import mig_resource_name

__all__ = [
    "BUILTIN_EXTENDER_WEIGHT",
    "DEV_LEADER_ELECTION",
    "EXTENDER_URL_ENV",
    "ExtenderConfig",
    "LeaderElection",
    "default_managed_resources",
    "default_scheduler_config",
    "extender_settings",
    "scheduler_config",
]

EXTENDER_URL_ENV: Final = "NEURONETES_EXTENDER_URL"


def default_managed_resources() -> tuple[str, ...]:
    """Every NeuroNetes extended resource: kube-scheduler calls the extender only for pods asking
    for one of them, and still checks node totals itself (``ignoredByScheduler: false``)."""
    names = [RESOURCE_GPU, RESOURCE_GPU_MEMORY, RESOURCE_GPU_COMPUTE]
    for catalog in mig.catalogs():
        for name in catalog.names:
            resource = mig_resource_name(name)
            if resource not in names:
                names.append(resource)
    return tuple(names)


@dataclass(frozen=True, slots=True)
class ExtenderConfig:
    """kube-scheduler's extender entry for the NeuroNetes extender (fails closed: not ignorable)."""

    url: str
    filter_verb: str | None = "filter"
    prioritize_verb: str | None = "prioritize"
    bind_verb: str | None = "bind"
    preempt_verb: str | None = "preempt"
    weight: int = 1
    http_timeout_s: float = 5.0
    bind_http_timeout_s: float = 130.0
    """The bind entry's timeout: a gang member's bind waits at the barrier (up to the extender's
    ``bindWaitSeconds``, 110 s by default) until every member has reached bind."""
    node_cache_capable: bool = True
    ignorable: bool = False
    managed_resources: tuple[str, ...] = field(default_factory=default_managed_resources)

    @classmethod
    def from_url(cls, url: str | None) -> ExtenderConfig | None:
        """An extender at `url` with the default verbs; None for no (or an empty) URL."""
        return cls(url=url.rstrip("/")) if url else None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ExtenderConfig | None:
        """The extender named by ``$NEURONETES_EXTENDER_URL`` (None when unset or empty)."""
        return cls.from_url((os.environ if env is None else env).get(EXTENDER_URL_ENV))

    def _entry(self, http_timeout_s: float, *, ignorable: bool) -> dict[str, Any]:
        return {
            "urlPrefix": self.url,
            "enableHTTPS": self.url.startswith("https://"),
            "httpTimeout": f"{http_timeout_s:g}s",
            "nodeCacheCapable": self.node_cache_capable,
            "ignorable": ignorable,
        }

    def to_json(self) -> dict[str, Any]:
        doc = self._entry(self.http_timeout_s, ignorable=self.ignorable)
        doc["managedResources"] = [{"name": r, "ignoredByScheduler": False} for r in self.managed_resources]
        if self.filter_verb:
            doc["filterVerb"] = self.filter_verb
        if self.prioritize_verb:
            doc["prioritizeVerb"] = self.prioritize_verb
            doc["weight"] = self.weight
        if self.preempt_verb:
            doc["preemptVerb"] = self.preempt_verb
        return doc

    def entries(self) -> list[dict[str, Any]]:
        """kube-scheduler's ``extenders`` list: the decision verbs, and bind on its own entry.

        Bind gets a second entry (same URL) so its long timeout (the gang barrier) does not
        become the filter's: a hung filter must fail fast. That entry manages no resources, so
        it binds every pod this kube-scheduler schedules (pods without GPUs just get bound).
        """
        out = [self.to_json()]
        if self.bind_verb:
            out.append(self._entry(self.bind_http_timeout_s, ignorable=False) | {"bindVerb": self.bind_verb})
        return out


BUILTIN_EXTENDER_WEIGHT: Final = 20
"""One point of the extender's 0-10 score (x 10 x 20) outweighs kube-scheduler's own score
plugins, so the node the engine ranks first is the one kube-scheduler binds."""


@dataclass(frozen=True, slots=True)
class LeaderElection:
    """kube-scheduler's leader election: one Lease, the active instance holds it.

    A standby takes over at most ``lease_duration + retry_period`` after the leader last renewed
    (the leader gives up after ``renew_deadline`` without a renewal). Production defaults are
    15 s / 10 s / 2 s; `DEV_LEADER_ELECTION` is shorter so a failover in the dev cluster takes
    seconds.
    """

    lease_duration_s: float = 15.0
    renew_deadline_s: float = 10.0
    retry_period_s: float = 2.0
    namespace: str = "kube-system"
    name: str = "neuronetes-scheduler"
    """Not ``kube-scheduler``: that Lease is the cluster's own kube-scheduler's."""

    def __post_init__(self) -> None:
        # client-go's own check: the leader must renew before the lease can be taken from it.
        if not self.lease_duration_s > self.renew_deadline_s > 1.2 * self.retry_period_s > 0:
            raise ValueError("leader election: need leaseDuration > renewDeadline > 1.2 x retryPeriod > 0")

    def to_json(self) -> dict[str, Any]:
        return {
            "leaderElect": True,
            "leaseDuration": f"{self.lease_duration_s:g}s",
            "renewDeadline": f"{self.renew_deadline_s:g}s",
            "retryPeriod": f"{self.retry_period_s:g}s",
            "resourceLock": "leases",
            "resourceNamespace": self.namespace,
            "resourceName": self.name,
        }


DEV_LEADER_ELECTION: Final = LeaderElection(lease_duration_s=4.0, renew_deadline_s=3.0, retry_period_s=1.0)


def extender_settings(*, filter_top_k: int = 3, **overrides: Any) -> dict[str, Any]:
    """The settings file of an extender started beside kube-scheduler (keys as in the file).

    Three nodes per filter answer, so kube-scheduler also asks prioritize (it skips prioritize
    when one node is left) and the extender's ranking decides among them. `overrides` are
    file keys (``gangTTLSeconds=60``); the extender validates them when it loads the file.
    """
    return {"filterTopK": filter_top_k, **overrides}


def _base(kubeconfig_path: Path, leader_election: LeaderElection | None) -> dict[str, Any]:
    return {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig_path), "qps": 200, "burst": 400},
        "leaderElection": leader_election.to_json() if leader_election else {"leaderElect": False},
    }


def default_scheduler_config(kubeconfig_path: Path) -> dict[str, Any]:
    """The cluster's own kube-scheduler: the stock ``default-scheduler`` profile, no extenders.

    It runs apart from NeuroNetes' kube-scheduler because extenders apply to every profile of a
    kube-scheduler, and the extender binds only pods of the ``neuronetes-scheduler``.
    """
    return _base(kubeconfig_path, None) | {"profiles": [{"schedulerName": "default-scheduler"}]}


def scheduler_config(
    kubeconfig_path: Path,
    extender: ExtenderConfig | None,
    *,
    leader_election: LeaderElection | None = None,
) -> dict[str, Any]:
    """NeuroNetes' KubeSchedulerConfiguration: the ``neuronetes-scheduler`` profile and `extender`.

    `leader_election` None: this kube-scheduler is the only one and always active.

    The NeuroNetes profile scores every feasible node (``percentageOfNodesToScore: 100``: the
    engine wants the global view) and packs with NodeResourcesFit's MostAllocated strategy, so
    kube-scheduler's own scores do not undo the extender's packing (docs/contracts.md).
    """
    fit_args = {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "NodeResourcesFitArgs",
        "scoringStrategy": {
            "type": "MostAllocated",
            "resources": [
                {"name": "cpu", "weight": 1},
                {"name": "memory", "weight": 1},
                {"name": RESOURCE_GPU, "weight": 3},
                {"name": RESOURCE_GPU_MEMORY, "weight": 2},
            ],
        },
    }
    doc = _base(kubeconfig_path, leader_election) | {
        "percentageOfNodesToScore": 100,
        "profiles": [
            {
                "schedulerName": SCHEDULER_NAME,
                "percentageOfNodesToScore": 100,
                "pluginConfig": [{"name": "NodeResourcesFit", "args": fit_args}],
            },
        ],
    }
    if extender is not None:
        doc["extenders"] = extender.entries()
    return doc
