"""The extender's configuration file (JSON or YAML), hot-reloaded when it changes.

Example (every key optional; camelCase as in Kubernetes manifests)::

    policy: default            # a neuronetes.engine policy
    weights:                   # scorer weights over the policy's (0 removes a term)
      availability: 0.30
      topology: 0.25
      model_cache: 0.20
      cost: 0.15
      data_locality: 0.10
    assumeTTLSeconds: 30       # how long a filter decision holds its GPUs before the bind
    filterTopK: 1              # nodes a filter answer lists, best first
    gangTTLSeconds: 120        # how long a gang reservation waits for every member's bind
                               # (a PodGroup's scheduleTimeoutSeconds or the pod annotation
                               # neuronetes.io/gang-timeout-seconds override it per group)
    bindWaitSeconds: 110       # longest a gang member's bind waits at the barrier; keep it
                               # below kube-scheduler's httpTimeout of the bind extender entry
    maxBodyBytes: 33554432     # larger request bodies get 413 (5,000 full Node objects fit)
    visibleDevicesAnnotations: false  # also write the no-NRI fallback annotations at bind
    maxWatchStalenessSeconds: 30  # a watch broken longer than this: /readyz fails and the
                               # filter answers an Error (kube-scheduler retries) instead of
                               # deciding from a stale cache
    # Bounds on what tenants may ask through pod labels/annotations (docs/threat-model.md):
    maxGangSize: 1024          # a gang-size label (or PodGroup minMember) above it is refused
    maxGangTimeoutSeconds: 3600  # a neuronetes.io/gang-timeout-seconds above it is refused
    bindSchedulerNames: [neuronetes-scheduler]  # pods of other schedulers are never bound

The file is checked at most once per `SettingsSource.check_interval` seconds (by modification
time and size). A file that does not parse or validate is logged and ignored: the last good
settings stay in force, so a typo never takes placement down.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Final

import msgspec

from neuronetes.contracts import SCHEDULER_NAME
from neuronetes.engine.policy import get_policy

__all__ = ["DEFAULT_MAX_BODY_BYTES", "ConfigError", "ExtenderSettings", "SettingsSource", "load_settings"]

log = logging.getLogger(__name__)

DEFAULT_MAX_BODY_BYTES: Final = 32 * 1024 * 1024
"""5,000 full Node objects (``nodeCacheCapable: false``) are ~25 MB; names only are far smaller."""


class ConfigError(ValueError):
    """A configuration file that cannot be used."""


class PreemptionSettings(
    msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True, rename="camel"
):
    """The preemption controller (`neuronetes_extender.preemption`, docs/preemption.md).

    Attributes:
        enabled: preempt for GPU pods the filter keeps rejecting (off: only kube-scheduler's own
            preemption, which sees node totals, and the ``preempt`` verb).
        min_pending_seconds: a pod rejected for less than this is not preempted for.
        reservation_seconds: how long the chosen node is held for the preemptor (refused to pods
            of lower priority) unless it binds first.
        refused_backoff_seconds: a victim whose eviction was refused (a PodDisruptionBudget) is
            left out of decisions this long.
        max_per_tick: preemptors decided per tick (one tick a second): bounds the work.
    """

    enabled: bool = True
    min_pending_seconds: Annotated[float, msgspec.Meta(ge=0, le=3600)] = 10.0
    reservation_seconds: Annotated[float, msgspec.Meta(ge=1, le=3600)] = 60.0
    refused_backoff_seconds: Annotated[float, msgspec.Meta(ge=1, le=3600)] = 60.0
    max_per_tick: Annotated[int, msgspec.Meta(ge=1, le=100)] = 4


class ExtenderSettings(
    msgspec.Struct,
    kw_only=True,
    frozen=True,
    forbid_unknown_fields=True,
    rename={
        "assume_ttl_seconds": "assumeTTLSeconds",
        "filter_top_k": "filterTopK",
        "gang_ttl_seconds": "gangTTLSeconds",
        "bind_wait_seconds": "bindWaitSeconds",
        "max_body_bytes": "maxBodyBytes",
        "visible_devices_annotations": "visibleDevicesAnnotations",
        "max_watch_staleness_seconds": "maxWatchStalenessSeconds",
        # ---- tenant bounds and bind gate (decision core) ----
        "max_gang_size": "maxGangSize",
        "max_gang_timeout_seconds": "maxGangTimeoutSeconds",
        "bind_scheduler_names": "bindSchedulerNames",
    },
):
    policy: str = "default"
    weights: dict[str, Annotated[float, msgspec.Meta(ge=0)]] = {}
    assume_ttl_seconds: Annotated[float, msgspec.Meta(gt=0, le=3600)] = 30.0
    filter_top_k: Annotated[int, msgspec.Meta(ge=1, le=100)] = 1
    gang_ttl_seconds: Annotated[float, msgspec.Meta(ge=1, le=86400)] = 120.0
    bind_wait_seconds: Annotated[float, msgspec.Meta(ge=1, le=86400)] = 110.0
    max_body_bytes: Annotated[int, msgspec.Meta(ge=1024, le=1 << 31)] = DEFAULT_MAX_BODY_BYTES
    visible_devices_annotations: bool = False
    # ---- serving: readiness -------------------------------------------------------------------
    max_watch_staleness_seconds: Annotated[float, msgspec.Meta(gt=0, le=3600)] = 30.0

    # ---- tenant bounds and bind gate (decision core) -------------------------------------------
    max_gang_size: Annotated[int, msgspec.Meta(ge=1, le=1_000_000)] = 1024
    """Largest gang a pod may ask for (the GangReservation CRD holds at most 1,024 members)."""
    max_gang_timeout_seconds: Annotated[float, msgspec.Meta(ge=1, le=86400)] = 3600.0
    """Longest reservation a pod's ``neuronetes.io/gang-timeout-seconds`` may ask for."""
    bind_scheduler_names: tuple[str, ...] = (SCHEDULER_NAME,)
    """``spec.schedulerName`` values whose pods the bind verb binds; any other is refused."""
    preemption: PreemptionSettings = PreemptionSettings()

    def __post_init__(self) -> None:
        # Unknown policy or scorer names fail here, not at the first decision.
        get_policy(self.policy).with_weights(self.weights)


def load_settings(path: Path) -> ExtenderSettings:
    """Read and validate one configuration file (``.yaml``/``.yml`` as YAML, else JSON).

    Raises:
        ConfigError: unreadable, not JSON/YAML, unknown key, wrong type, value out of range,
            unknown policy or scorer.
    """
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{path}: {exc.strerror or exc}") from None
    try:
        if path.suffix.lower() in (".yaml", ".yml"):
            settings = (
                msgspec.yaml.decode(data, type=ExtenderSettings) if data.strip() else ExtenderSettings()
            )
        else:
            settings = msgspec.json.decode(data, type=ExtenderSettings)
    except (msgspec.DecodeError, ValueError) as exc:
        raise ConfigError(f"{path}: {exc}") from None
    return settings


class SettingsSource:
    """The settings in force: defaults, or a file re-read when its mtime or size changes."""

    def __init__(
        self,
        path: Path | str | None = None,
        *,
        check_interval: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        initial: ExtenderSettings | None = None,
    ) -> None:
        self.path = Path(path) if path is not None else None
        self.check_interval = check_interval
        self._clock = clock
        self._lock = threading.Lock()
        self._settings = initial or ExtenderSettings()
        self._stamp: tuple[int, int] | None = None
        self._next_check = float("-inf")
        self.version = 0
        """Bumped whenever the settings in force change."""
        self.errors = 0
        """Files that failed to load (the previous settings stayed in force)."""
        if self.path is not None:
            self._settings = load_settings(self.path)  # a bad file at start is fatal
            self._stamp = self._stat()
            self.version = 1

    def _stat(self) -> tuple[int, int] | None:
        assert self.path is not None
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return st.st_mtime_ns, st.st_size

    def get(self) -> ExtenderSettings:
        """The current settings (re-reads the file when it changed since the last check)."""
        if self.path is None:
            return self._settings
        now = self._clock()
        with self._lock:
            if now < self._next_check:
                return self._settings
            self._next_check = now + self.check_interval
            stamp = self._stat()
            if stamp == self._stamp or stamp is None:
                return self._settings
            self._stamp = stamp
            try:
                settings = load_settings(self.path)
            except ConfigError as exc:
                self.errors += 1
                log.error("configuration not reloaded, keeping the previous settings: %s", exc)
                return self._settings
            if settings != self._settings:
                log.info("configuration reloaded from %s: %s", self.path, settings)
                self._settings = settings
                self.version += 1
            return self._settings

    def set(self, settings: ExtenderSettings) -> None:
        """Replace the settings in force (tests; a file, if any, still wins when it changes)."""
        with self._lock:
            if settings != self._settings:
                self._settings = settings
                self.version += 1
