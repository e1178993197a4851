"""Grid carbon intensity: one reading type, four sources, strict parsers (docs/carbon.md, "Sources").

Every source answers `IntensitySource.read` with an `IntensityReading`: the intensity now in
gCO2eq/kWh (location-based: the grid's average, or WattTime's marginal rate converted to the same
unit), when the source produced it (``at``, which decides staleness) and an optional forecast.
What a source sends is parsed by a pure function per shape (`parse_file`, `parse_carbon_aware_sdk`,
`parse_electricity_maps`, `parse_watttime_forecast`); a malformed answer raises `IntensityError`
with one line saying what was wrong, never anything else. HTTP reads have a timeout and a size
bound (`fetch`); credentials come from a mounted Secret file or an environment variable, never
from an AgentPool.
"""

from __future__ import annotations

import base64
import json
import math
import os
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Final, Protocol

import msgspec.yaml

__all__ = [
    "LBS_PER_MWH_IN_G_PER_KWH",
    "MAX_ANSWER_BYTES",
    "MAX_FORECAST_POINTS",
    "CarbonAwareSDKSource",
    "ElectricityMapsSource",
    "FileSource",
    "IntensityError",
    "IntensityReading",
    "IntensitySource",
    "WattTimeSource",
    "fetch",
    "parse_carbon_aware_sdk",
    "parse_electricity_maps",
    "parse_file",
    "parse_time",
    "parse_watttime_forecast",
    "read_credential",
]

MAX_ANSWER_BYTES: Final = 1 << 20
"""The most bytes read from one answer (a file or an HTTP body); a larger one is an error."""
MAX_FORECAST_POINTS: Final = 24 * 14
"""Forecast points kept at most (two weeks of hourly points); the rest are dropped."""
MAX_INTENSITY: Final = 5000.0
"""No grid emits more than this many gCO2eq/kWh (lignite is about 1100): above it is garbage."""
LBS_PER_MWH_IN_G_PER_KWH: Final = 0.45359237
"""1 lb CO2/MWh in g CO2/kWh (WattTime's unit into ours)."""


class IntensityError(Exception):
    """A source could not be read, or what it sent is not what its shape says (one line)."""


@dataclass(frozen=True, slots=True)
class IntensityReading:
    """The grid's carbon intensity now, when the source produced it, and what it expects."""

    intensity: float
    """gCO2eq/kWh now."""
    at: datetime
    """When the source produced this reading (timezone-aware); staleness is measured from it."""
    forecast: tuple[tuple[datetime, float], ...] = ()
    """(start of period, gCO2eq/kWh), in time order; empty when the source gives none."""
    source: str = ""
    """Which source answered, for status and Events (e.g. ``file``, ``carbon-aware-sdk``)."""

    def age_seconds(self, now: datetime) -> float:
        return (now - self.at).total_seconds()


class IntensitySource(Protocol):
    """Anything that reads the grid's intensity; `read` raises only `IntensityError`."""

    name: str

    def read(self, now: datetime) -> IntensityReading: ...


# ---- parsing -----------------------------------------------------------------------------------


def parse_time(value: Any, what: str) -> datetime:
    """An RFC 3339 time (``Z`` or an offset) as an aware datetime; a naive one is refused."""
    if not isinstance(value, str):
        raise IntensityError(f"{what}: expected an RFC 3339 time string, got {type(value).__name__}")
    try:
        out = datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise IntensityError(f"{what}: {value[:64]!r} is not an RFC 3339 time") from None
    if out.tzinfo is None:
        raise IntensityError(f"{what}: {value[:64]!r} has no time zone (add Z or an offset)")
    return out


def _intensity(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise IntensityError(f"{what}: expected a number of gCO2eq/kWh, got {str(value)[:64]!r}")
    if not 0 <= value <= MAX_INTENSITY:
        raise IntensityError(f"{what}: {value} gCO2eq/kWh is outside 0..{MAX_INTENSITY:g}")
    return float(value)


def _mapping(value: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise IntensityError(f"{what}: expected an object, got {type(value).__name__}")
    return value


def _list(value: Any, what: str) -> Sequence[Any]:
    if not isinstance(value, list):
        raise IntensityError(f"{what}: expected a list, got {type(value).__name__}")
    return value


def _forecast(points: Sequence[Any], time_key: str, value_key: str, what: str, scale: float = 1.0) -> tuple[
    tuple[datetime, float], ...
]:  # fmt: skip
    out = []
    for i, raw in enumerate(points[:MAX_FORECAST_POINTS]):
        point = _mapping(raw, f"{what}[{i}]")
        at = parse_time(point.get(time_key), f"{what}[{i}].{time_key}")
        value = point.get(value_key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            value = value * scale
        out.append((at, _intensity(value, f"{what}[{i}].{value_key}")))
    out.sort(key=lambda p: p[0])
    return tuple(out)


def _json(body: bytes, what: str) -> Any:
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise IntensityError(f"{what}: not JSON ({str(exc)[:80]})") from None


def _from_forecast(
    points: tuple[tuple[datetime, float], ...], now: datetime, at: datetime, source: str, what: str
) -> IntensityReading:
    """A reading whose current value is the forecast point covering `now` (else the first)."""
    if not points:
        raise IntensityError(f"{what}: empty")
    current = [value for start, value in points if start <= now]
    return IntensityReading(current[-1] if current else points[0][1], at, points, source)


def parse_file(body: bytes) -> IntensityReading:
    """The file/ConfigMap source's format (YAML or JSON)::

    intensity: 312.5                 # gCO2eq/kWh now (required)
    at: "2026-11-27T08:00:00Z"       # when it was measured or published (required)
    forecast:                        # optional: the coming periods, any order
      - {at: "2026-11-27T09:00:00Z", intensity: 280}
    """
    try:
        doc = msgspec.yaml.decode(body)
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:
        raise IntensityError(f"intensity file: not YAML or JSON ({str(exc).splitlines()[0][:80]})") from None
    doc = _mapping(doc, "intensity file")
    forecast = _list(doc.get("forecast") or [], "intensity file: forecast")
    return IntensityReading(
        intensity=_intensity(doc.get("intensity"), "intensity file: intensity"),
        at=parse_time(doc.get("at"), "intensity file: at"),
        forecast=_forecast(forecast, "at", "intensity", "intensity file: forecast"),
        source="file",
    )


def parse_carbon_aware_sdk(body: bytes, now: datetime) -> IntensityReading:
    """The Carbon Aware SDK Web API's ``GET /emissions/forecasts/current`` answer: a list of
    ``EmissionsForecastDTO`` objects (one per location; the first is used), each with
    ``generatedAt``, ``location``, ``windowSize`` (minutes), ``optimalDataPoints`` and
    ``forecastData`` (lists of ``EmissionsDataDTO``: ``location``, ``timestamp``, ``duration``
    minutes, ``value`` gCO2eq/kWh). The intensity now is the forecast point covering `now`
    (else the first one); ``generatedAt`` is the reading's time."""
    doc = _list(_json(body, "carbon-aware-sdk"), "carbon-aware-sdk answer")
    if not doc:
        raise IntensityError("carbon-aware-sdk answer: an empty list (no forecast for the location)")
    first = _mapping(doc[0], "carbon-aware-sdk answer[0]")
    points = _forecast(
        _list(first.get("forecastData"), "carbon-aware-sdk forecastData"),
        "timestamp",
        "value",
        "carbon-aware-sdk forecastData",
    )
    _forecast(
        _list(first.get("optimalDataPoints") or [], "carbon-aware-sdk optimalDataPoints"),
        "timestamp",
        "value",
        "carbon-aware-sdk optimalDataPoints",
    )
    at = parse_time(first.get("generatedAt"), "carbon-aware-sdk generatedAt")
    return _from_forecast(points, now, at, "carbon-aware-sdk", "carbon-aware-sdk forecastData")


def parse_electricity_maps(latest: bytes, forecast: bytes | None) -> IntensityReading:
    """Electricity Maps v3: ``GET /v3/carbon-intensity/latest?zone=Z`` answers ``zone``,
    ``carbonIntensity`` (gCO2eq/kWh), ``datetime`` (the hour it describes), ``updatedAt``;
    ``GET /v3/carbon-intensity/forecast?zone=Z`` answers ``forecast`` (a list of
    ``{carbonIntensity, datetime}``) and ``updatedAt``. ``updatedAt`` of the latest value is the
    reading's time."""
    doc = _mapping(_json(latest, "electricity-maps latest"), "electricity-maps latest")
    points: tuple[tuple[datetime, float], ...] = ()
    if forecast is not None:
        fdoc = _mapping(_json(forecast, "electricity-maps forecast"), "electricity-maps forecast")
        points = _forecast(
            _list(fdoc.get("forecast"), "electricity-maps forecast.forecast"),
            "datetime",
            "carbonIntensity",
            "electricity-maps forecast.forecast",
        )
    return IntensityReading(
        intensity=_intensity(doc.get("carbonIntensity"), "electricity-maps latest.carbonIntensity"),
        at=parse_time(doc.get("updatedAt") or doc.get("datetime"), "electricity-maps latest.updatedAt"),
        forecast=points,
        source="electricity-maps",
    )


def parse_watttime_forecast(body: bytes, now: datetime) -> IntensityReading:
    """WattTime v3 ``GET /v3/forecast?region=R&signal_type=co2_moer``: ``data`` (a list of
    ``{point_time, value}``, 5-minute points) and ``meta`` (``generated_at``, ``units``, which
    must be ``lbs_co2_per_mwh``). Values are converted to gCO2/kWh; the point covering `now` is
    the intensity now. (WattTime's ``/v3/signal-index`` is a 0-100 percentile, not an intensity,
    so it cannot be compared with ``maxCarbonIntensity`` and is not read.)"""
    doc = _mapping(_json(body, "watttime forecast"), "watttime forecast")
    meta = _mapping(doc.get("meta"), "watttime forecast.meta")
    units = meta.get("units", "lbs_co2_per_mwh")
    if units != "lbs_co2_per_mwh":
        raise IntensityError(f"watttime forecast.meta.units: {str(units)[:40]!r}, expected lbs_co2_per_mwh")
    points = _forecast(
        _list(doc.get("data"), "watttime forecast.data"),
        "point_time",
        "value",
        "watttime forecast.data",
        scale=LBS_PER_MWH_IN_G_PER_KWH,
    )
    at = parse_time(meta.get("generated_at"), "watttime forecast.meta.generated_at")
    return _from_forecast(points, now, at, "watttime", "watttime forecast.data")


# ---- reading -----------------------------------------------------------------------------------


def fetch(url: str, headers: Mapping[str, str], timeout_s: float, max_bytes: int = MAX_ANSWER_BYTES) -> bytes:
    """GET `url`: the body, at most `max_bytes`; any failure (connection, status, size, timeout) is
    an `IntensityError` naming the host and what went wrong (never the credentials)."""
    host = urllib.parse.urlsplit(url).netloc
    request = urllib.request.Request(url, headers={"Accept": "application/json", **headers})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as answer:
            body: bytes = answer.read(max_bytes + 1)
    except urllib.error.HTTPError as exc:
        raise IntensityError(f"{host}: HTTP {exc.code} {exc.reason}") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise IntensityError(f"{host}: {str(reason)[:120]}") from None
    if len(body) > max_bytes:
        raise IntensityError(f"{host}: answer over {max_bytes} bytes")
    return body


def read_credential(file: str | None, env: str | None) -> str:
    """A secret from a mounted Secret file (`file`) or an environment variable (`env`, e.g. set
    from a ``secretKeyRef``); surrounding whitespace stripped; missing or empty is an error."""
    value = ""
    if file:
        try:
            value = Path(file).read_text(encoding="utf-8", errors="strict")[:4096].strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise IntensityError(f"credential file {file}: {exc.__class__.__name__}") from None
    elif env:
        value = os.environ.get(env, "").strip()
    if not value:
        where = f"file {file}" if file else f"environment variable {env}" if env else "no file or variable"
        raise IntensityError(f"credential missing or empty ({where})")
    return value


class FileSource:
    """A YAML/JSON file in `parse_file`'s format, e.g. a ConfigMap mounted into the operator
    (the kubelet updates the file when the ConfigMap changes)."""

    name = "file"

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def read(self, now: datetime) -> IntensityReading:
        try:
            with self.path.open("rb") as f:
                body = f.read(MAX_ANSWER_BYTES + 1)
        except OSError as exc:
            raise IntensityError(f"intensity file {self.path}: {exc.strerror or exc}") from None
        if len(body) > MAX_ANSWER_BYTES:
            raise IntensityError(f"intensity file {self.path}: over {MAX_ANSWER_BYTES} bytes")
        return parse_file(body)


class CarbonAwareSDKSource:
    """The Green Software Foundation's Carbon Aware SDK Web API (``/emissions/forecasts/current``)."""

    name = "carbon-aware-sdk"

    def __init__(self, url: str, location: str, window_minutes: int, timeout_s: float) -> None:
        self.url, self.location, self.window_minutes, self.timeout_s = (
            url.rstrip("/"),
            location,
            window_minutes,
            timeout_s,
        )

    def read(self, now: datetime) -> IntensityReading:
        query = urllib.parse.urlencode({"location": self.location, "windowSize": self.window_minutes})
        return parse_carbon_aware_sdk(
            fetch(f"{self.url}/emissions/forecasts/current?{query}", {}, self.timeout_s), now
        )


class ElectricityMapsSource:
    """Electricity Maps v3 (``auth-token`` header): the latest intensity and the forecast."""

    name = "electricity-maps"

    def __init__(self, url: str, zone: str, token: str, timeout_s: float, forecast: bool = True) -> None:
        self.url, self.zone, self.token, self.timeout_s, self.forecast = (
            url.rstrip("/"),
            zone,
            token,
            timeout_s,
            forecast,
        )

    def read(self, now: datetime) -> IntensityReading:
        query = urllib.parse.urlencode({"zone": self.zone})
        headers = {"auth-token": self.token}
        latest = fetch(f"{self.url}/v3/carbon-intensity/latest?{query}", headers, self.timeout_s)
        ahead = (
            fetch(f"{self.url}/v3/carbon-intensity/forecast?{query}", headers, self.timeout_s)
            if self.forecast
            else None
        )
        return parse_electricity_maps(latest, ahead)


class WattTimeSource:
    """WattTime v3: a bearer token from ``GET /login`` (HTTP basic auth), then ``/v3/forecast``.

    The token (valid 30 minutes) is kept and fetched again when it is older than 25 minutes or an
    answer says 401."""

    name = "watttime"
    TOKEN_TTL_S: Final = 25 * 60

    def __init__(self, url: str, region: str, username: str, password: str, timeout_s: float) -> None:
        self.url, self.region, self.timeout_s = url.rstrip("/"), region, timeout_s
        self._basic = base64.b64encode(f"{username}:{password}".encode()).decode()
        self._token: tuple[str, datetime] | None = None

    def _login(self, now: datetime) -> str:
        if self._token is not None and (now - self._token[1]).total_seconds() < self.TOKEN_TTL_S:
            return self._token[0]
        doc = _mapping(
            _json(
                fetch(f"{self.url}/login", {"Authorization": f"Basic {self._basic}"}, self.timeout_s),
                "watttime login",
            ),
            "watttime login",
        )
        token = doc.get("token")
        if not isinstance(token, str) or not token:
            raise IntensityError("watttime login: no token in the answer")
        self._token = (token, now)
        return token

    def read(self, now: datetime) -> IntensityReading:
        query = urllib.parse.urlencode({"region": self.region, "signal_type": "co2_moer"})
        url = f"{self.url}/v3/forecast?{query}"
        try:
            body = fetch(url, {"Authorization": f"Bearer {self._login(now)}"}, self.timeout_s)
        except IntensityError as exc:
            if "HTTP 401" not in str(exc):
                raise
            self._token = None
            body = fetch(url, {"Authorization": f"Bearer {self._login(now)}"}, self.timeout_s)
        return parse_watttime_forecast(body, now)
