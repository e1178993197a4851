"""When a pod held by the ``neuronetes.io/carbon`` scheduling gate starts, and what waiting saved.

`release_reason` is the whole decision, a pure function of the pool's time-shifting policy
(`GatePolicy`), the pod (`GatedPod`), the last intensity reading and the clock. A gated pod is
released, checked in this order, when:

1. ``window``: the clean-energy window (``timeShifting.cleanEnergyHours`` in ``timeZone``) is open;
2. ``stale``: the intensity source has no reading, or its reading is older than twice its refresh
   interval — fail open: a broken source never holds work;
3. ``intensity``: the intensity now is at or under ``maxCarbonIntensity``;
4. ``deadline``: now is at or past the pod's release-by time (`release_by`: its deadline minus its
   expected run time, and never later than its creation plus ``timeShifting.maxDelay``);
5. ``forecast``: the source's forecast has no period cleaner than now before the release-by time
   — waiting longer cannot help (the rule of the Carbon Aware SDK's ``optimalDataPoints``).

Nothing waits forever: rule 4 always fires, at the latest ``maxDelay`` (default 6 h) after creation.
`avoided_grams` is the location-based estimate of the gCO2 the delay avoided (docs/carbon.md).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, time, timedelta
from enum import StrEnum
from typing import Final
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from .intensity import IntensityReading

__all__ = [
    "ANNOTATION_DEADLINE",
    "ANNOTATION_EXPECTED_RUNTIME",
    "DEFAULT_GPU_WATTS",
    "DEFAULT_MAX_DELAY",
    "GATE",
    "GPU_TDP_WATTS",
    "GatePolicy",
    "GatedPod",
    "Reason",
    "avoided_grams",
    "gpu_watts",
    "mean_intensity",
    "parse_duration",
    "release_by",
    "release_reason",
    "window_open",
]

GATE: Final = "neuronetes.io/carbon"
"""The scheduling gate the webhook adds to time-shifted pods and the gate-release controller removes."""
ANNOTATION_DEADLINE: Final = "neuronetes.io/deadline"
"""Pod annotation: RFC 3339 time by which the pod's work must be done (e.g. ``2026-11-27T18:00:00Z``)."""
ANNOTATION_EXPECTED_RUNTIME: Final = "neuronetes.io/expected-runtime"
"""Pod annotation: how long the pod's work runs, a duration (``90m``, ``2h``)."""
DEFAULT_MAX_DELAY: Final = "6h"
"""``timeShifting.maxDelay`` when the pool does not set it (the CRD's default)."""
GPU_TDP_WATTS: Final[dict[str, float]] = {
    "GB300": 1400, "B300": 1100, "GB200": 1200, "B200": 1000, "B100": 700, "GH200": 900,
    "H200": 700, "H100": 700, "H800": 700, "H20": 400, "L40S": 350, "L40": 300, "L20": 275,
    "L4": 72, "A100": 400, "A800": 400, "A40": 300, "A30": 165, "A16": 250, "A10G": 150,
    "A10": 150, "A2": 60, "T4": 70, "V100": 300, "P100": 250, "P40": 250, "P4": 75,
}  # fmt: skip
"""Board power (TDP, watts) by GPU family (the vendors' data sheets; SXM parts where both exist):
the power estimate when no measured ``neuronetes_gpu_power_watts`` is available."""
DEFAULT_GPU_WATTS: Final = 400.0
"""The power estimate of a GPU whose family is unknown (an A100's TDP)."""
_DURATION: Final = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ns|us|ms|s|m|h)")
_UNIT_S: Final = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


class Reason(StrEnum):
    """Why a gated pod was released (the Event's reason says it: ``CarbonGateReleased``)."""

    WINDOW = "window"
    STALE = "stale"
    INTENSITY = "intensity"
    DEADLINE = "deadline"
    FORECAST = "forecast"


def parse_duration(text: str) -> float:
    """A Go-style duration (``90m``, ``1h30m``, ``45s``) in seconds; ValueError otherwise."""
    text = text.strip()
    parts = _DURATION.findall(text)
    if not text or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"{text[:40]!r} is not a duration (e.g. 90m, 1h30m, 45s)")
    return sum(float(n) * _UNIT_S[u] for n, u in parts)


def window_open(hours: str, time_zone: str, now: datetime) -> bool:
    """Whether `now` lies in the daily window ``HH:MM-HH:MM`` of `time_zone` (start included, end
    excluded; a window whose end is before its start wraps past midnight)."""
    start_text, end_text = hours.split("-")
    start, end = time.fromisoformat(start_text), time.fromisoformat(end_text)
    try:
        local = now.astimezone(ZoneInfo(time_zone)).time().replace(tzinfo=None)
    except ZoneInfoNotFoundError:  # the webhook refuses unknown zones; an old object falls back to UTC
        local = now.astimezone(ZoneInfo("UTC")).time().replace(tzinfo=None)
    if start <= end:
        return start <= local < end
    return local >= start or local < end


@dataclass(frozen=True, slots=True)
class GatePolicy:
    """A pool's ``carbonAware`` settings, as the release decision reads them."""

    clean_energy_hours: str | None
    time_zone: str = "UTC"
    max_carbon_intensity: float | None = None
    max_delay_s: float = 6 * 3600.0
    expected_runtime_s: float | None = None
    """``timeShifting.expectedRuntime``: the run time of pods without the annotation."""


@dataclass(frozen=True, slots=True)
class GatedPod:
    """What the decision reads of one gated pod: its creation time and its annotations."""

    created: datetime
    deadline: datetime | None = None
    expected_runtime_s: float | None = None


def release_by(pod: GatedPod, policy: GatePolicy) -> datetime:
    """The latest time the pod may still wait: its deadline minus its expected run time (the pod's
    annotation, else the pool's ``expectedRuntime``, else 0), and at most creation + ``maxDelay``."""
    latest = pod.created + timedelta(seconds=policy.max_delay_s)
    if pod.deadline is not None:
        runtime = pod.expected_runtime_s if pod.expected_runtime_s is not None else policy.expected_runtime_s
        latest = min(latest, pod.deadline - timedelta(seconds=runtime or 0.0))
    return latest


def _cleaner_ahead(reading: IntensityReading, now: datetime, until: datetime) -> bool | None:
    """Whether the forecast has a period starting after `now` and by `until` cleaner than now
    (None: the forecast says nothing about that span)."""
    ahead = [value for at, value in reading.forecast if now < at <= until]
    if not ahead:
        return None
    return min(ahead) < reading.intensity


def release_reason(
    pod: GatedPod,
    policy: GatePolicy,
    reading: IntensityReading | None,
    now: datetime,
    refresh_s: float | None,
) -> Reason | None:
    """Why the pod is released now, or None while it keeps waiting (the module's rules, in order).

    `refresh_s`: the intensity source's refresh interval; None when no source is configured, and
    then only the window and the release-by time decide (rules 2, 3 and 5 need a source)."""
    if policy.clean_energy_hours and window_open(policy.clean_energy_hours, policy.time_zone, now):
        return Reason.WINDOW
    if refresh_s is None or reading is None:
        if refresh_s is not None:
            return Reason.STALE
        return Reason.DEADLINE if now >= release_by(pod, policy) else None
    if reading.age_seconds(now) > 2 * refresh_s:
        return Reason.STALE
    if policy.max_carbon_intensity is not None and reading.intensity <= policy.max_carbon_intensity:
        return Reason.INTENSITY
    latest = release_by(pod, policy)
    if now >= latest:
        return Reason.DEADLINE
    if _cleaner_ahead(reading, now, latest) is False:
        return Reason.FORECAST
    return None


def mean_intensity(reading: IntensityReading, start: datetime, seconds: float) -> float:
    """The intensity averaged over ``[start, start + seconds)`` as `reading` expects it: each
    forecast period's value holds until the next period; before the first (or without a forecast)
    the reading's current value. Sampled each minute, at most a week."""
    if not reading.forecast or seconds <= 0:
        return reading.intensity
    steps = max(1, min(int(seconds // 60), 7 * 24 * 60))
    total, index, value = 0.0, 0, reading.intensity
    points = reading.forecast
    for i in range(steps):
        at = start + timedelta(seconds=seconds * i / steps)
        while index < len(points) and points[index][0] <= at:
            value = points[index][1]
            index += 1
        total += value
    return total / steps


def gpu_watts(gpu_type: str | None, measured: float | None) -> float:
    """The power of one GPU: the measured mean of ``neuronetes_gpu_power_watts`` when there is one,
    else the family's TDP (`GPU_TDP_WATTS`), else `DEFAULT_GPU_WATTS`."""
    if measured is not None and measured > 0:
        return measured
    if gpu_type:
        family = gpu_type.upper().split("-")[0]
        return GPU_TDP_WATTS.get(family, DEFAULT_GPU_WATTS)
    return DEFAULT_GPU_WATTS


def avoided_grams(
    gpus: int, watts_per_gpu: float, runtime_s: float, intensity_then: float, intensity_now: float
) -> float:
    """Location-based gCO2 avoided by starting a pod now rather than when it was gated: its energy
    (GPUs × watts × run time) times the difference of the mean intensities expected over its run at
    both starts. Negative when the delay made it dirtier (e.g. a release by deadline at a peak)."""
    kwh = gpus * watts_per_gpu / 1000.0 * runtime_s / 3600.0
    return kwh * (intensity_then - intensity_now)
