"""The operator's settings: a YAML/JSON file (`neuronetes operator run --config`), all optional."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import msgspec
import msgspec.yaml

__all__ = ["OperatorSettings", "load_settings"]


class OperatorSettings(msgspec.Struct, kw_only=True, rename="camel", forbid_unknown_fields=True, frozen=True):
    """What the operator does beyond the objects' specs.

    Attributes:
        namespaces: watch only these namespaces (empty: the whole cluster).
        workers: AgentPools reconciled at the same time (each pool is reconciled by one at a time).
        resync_seconds: every pool is reconciled at least this often, events or not.
        pod_tolerations: added to every pool pod, e.g. the taint of simulated (kwok) nodes on a dev
            cluster; empty in production, where pools say what they tolerate in their template.
        gang_retry_seconds, gang_retry_max_seconds: a gang whose reservation failed is recreated at
            once, then each time no sooner than this × 2^(retries-1) seconds after, at most the max.
        batch_size: pod creations and deletions one reconcile of a pool does at most (whole gangs:
            a gang larger than this goes alone); a pool with more to do is reconciled again at once,
            behind the pools already queued (docs/agentpool.md, "Batches").
    """

    namespaces: list[str] = msgspec.field(default_factory=list)
    workers: Annotated[int, msgspec.Meta(ge=1, le=64)] = 4
    resync_seconds: Annotated[float, msgspec.Meta(ge=1, le=3600)] = 30.0
    pod_tolerations: list[dict[str, Any]] = msgspec.field(default_factory=list)
    gang_retry_seconds: Annotated[float, msgspec.Meta(ge=0.1, le=3600)] = 10.0
    gang_retry_max_seconds: Annotated[float, msgspec.Meta(ge=1, le=86400)] = 300.0
    batch_size: Annotated[int, msgspec.Meta(ge=1, le=1024)] = 64


def load_settings(path: str | Path | None) -> OperatorSettings:
    """Settings from a YAML or JSON file (None: defaults).

    Raises:
        OSError: the file cannot be read. msgspec.ValidationError / msgspec.DecodeError: bad content.
    """
    if path is None:
        return OperatorSettings()
    return msgspec.yaml.decode(Path(path).read_bytes(), type=OperatorSettings)
