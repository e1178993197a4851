"""Carbon-aware time shifting: the intensity sources (real local HTTP servers), the release decision,
the webhook's gate and the pods' region preference (docs/carbon.md)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest

from neuronetes.api.models import AgentPool, decode
from neuronetes.carbon.intensity import (
    CarbonAwareSDKSource,
    ElectricityMapsSource,
    FileSource,
    IntensityError,
    IntensityReading,
    WattTimeSource,
    fetch,
    parse_carbon_aware_sdk,
    parse_electricity_maps,
    parse_file,
    parse_watttime_forecast,
    read_credential,
)
from neuronetes.carbon.release import (
    GATE,
    GatedPod,
    GatePolicy,
    Reason,
    avoided_grams,
    gpu_watts,
    mean_intensity,
    parse_duration,
    release_by,
    release_reason,
    window_open,
)
from neuronetes_operator.carbon_admission import carbon_gate_patch, in_floor
from neuronetes_operator.pods import desired_pods
from neuronetes_operator.policy import resolve
from neuronetes_operator.settings import load_settings

NOW = datetime(2026, 11, 27, 8, 0, tzinfo=UTC)
T = "2026-11-27T08:00:00Z"


# ---- parsers -------------------------------------------------------------------------------------


def test_the_file_format_reads_value_time_and_a_sorted_forecast() -> None:
    r = parse_file(
        b"intensity: 312.5\nat: '2026-11-27T08:00:00Z'\nforecast:\n"
        b"- {at: '2026-11-27T10:00:00Z', intensity: 200}\n"
        b"- {at: '2026-11-27T09:00:00+00:00', intensity: 250}\n"
    )
    assert (r.intensity, r.at, r.source) == (312.5, NOW, "file")
    assert [v for _, v in r.forecast] == [250, 200]


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b"[1, 2]", "expected an object"),
        (b"intensity: high\nat: '2026-11-27T08:00:00Z'", "expected a number"),
        (b"intensity: -3\nat: '2026-11-27T08:00:00Z'", "outside 0..5000"),
        (b"intensity: 300\nat: '2026-11-27T08:00:00'", "has no time zone"),
        (b"intensity: 300", "expected an RFC 3339 time string"),
        (b"intensity: 300\nat: yesterday", "not an RFC 3339 time"),
        (b"{: :", "not YAML or JSON"),
        (b"intensity: 300\nat: '2026-11-27T08:00:00Z'\nforecast: {a: 1}", "expected a list"),
    ],
)
def test_a_malformed_file_is_one_clear_error(body: bytes, says: str) -> None:
    with pytest.raises(IntensityError, match=says):
        parse_file(body)


SDK = [
    {
        "generatedAt": "2026-11-27T07:55:00Z",
        "location": "westus",
        "windowSize": 60,
        "optimalDataPoints": [
            {"location": "westus", "timestamp": "2026-11-27T12:00:00Z", "duration": 60, "value": 120.0}
        ],
        "forecastData": [
            {"location": "westus", "timestamp": "2026-11-27T07:00:00Z", "duration": 60, "value": 400.0},
            {"location": "westus", "timestamp": "2026-11-27T08:00:00Z", "duration": 60, "value": 380.0},
            {"location": "westus", "timestamp": "2026-11-27T12:00:00Z", "duration": 60, "value": 120.0},
        ],
    }
]


def test_the_carbon_aware_sdk_shape_takes_the_point_covering_now() -> None:
    r = parse_carbon_aware_sdk(json.dumps(SDK).encode(), NOW)
    assert (r.intensity, r.at.minute, len(r.forecast), r.source) == (380.0, 55, 3, "carbon-aware-sdk")
    with pytest.raises(IntensityError, match="empty list"):
        parse_carbon_aware_sdk(b"[]", NOW)
    with pytest.raises(IntensityError, match=r"forecastData\[0\]\.value"):
        parse_carbon_aware_sdk(
            json.dumps([{**SDK[0], "forecastData": [{"timestamp": T, "value": "x"}]}]).encode(), NOW
        )
    with pytest.raises(IntensityError, match="not JSON"):
        parse_carbon_aware_sdk(b"<html>", NOW)


def test_electricity_maps_and_watttime_shapes() -> None:
    latest = {"zone": "DE", "carbonIntensity": 302, "datetime": T, "updatedAt": "2026-11-27T07:58:00Z"}
    ahead = {"zone": "DE", "forecast": [{"carbonIntensity": 150, "datetime": "2026-11-27T13:00:00Z"}]}
    r = parse_electricity_maps(json.dumps(latest).encode(), json.dumps(ahead).encode())
    assert (r.intensity, r.at.minute, r.forecast[0][1]) == (302, 58, 150)
    with pytest.raises(IntensityError, match="carbonIntensity"):
        parse_electricity_maps(json.dumps({**latest, "carbonIntensity": None}).encode(), None)
    wt = {
        "data": [
            {"point_time": "2026-11-27T07:55:00Z", "value": 1000},
            {"point_time": "2026-11-27T08:05:00Z", "value": 500},
        ],
        "meta": {"generated_at": "2026-11-27T07:50:00Z", "units": "lbs_co2_per_mwh"},
    }
    w = parse_watttime_forecast(json.dumps(wt).encode(), NOW)
    assert round(w.intensity, 1) == 453.6  # 1000 lb/MWh
    with pytest.raises(IntensityError, match="units"):
        parse_watttime_forecast(json.dumps({**wt, "meta": {"units": "percent"}}).encode(), NOW)


# ---- the HTTP sources against real servers ------------------------------------------------------------


class _Recorder(BaseHTTPRequestHandler):
    routes: ClassVar[dict[str, tuple[int, bytes]]] = {}
    seen: ClassVar[list[tuple[str, dict[str, str]]]] = []

    def log_message(self, *_: Any) -> None:
        pass

    def do_GET(self) -> None:
        self.seen.append((self.path, {k.lower(): v for k, v in self.headers.items()}))
        code, body = self.routes.get(self.path.split("?")[0], (404, b"{}"))
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def server() -> Iterator[tuple[str, type[_Recorder]]]:
    handler = type("Handler", (_Recorder,), {"routes": {}, "seen": []})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", handler
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_sdk_source_asks_with_location_and_window(server: tuple[str, type[_Recorder]]) -> None:
    url, h = server
    h.routes["/emissions/forecasts/current"] = (200, json.dumps(SDK).encode())
    r = CarbonAwareSDKSource(url, "westus", 30, 2.0).read(NOW)
    assert r.intensity == 380.0
    assert h.seen[0][0] == "/emissions/forecasts/current?location=westus&windowSize=30"


def test_electricity_maps_source_sends_the_token_header(server: tuple[str, type[_Recorder]]) -> None:
    url, h = server
    h.routes["/v3/carbon-intensity/latest"] = (
        200,
        json.dumps({"carbonIntensity": 99, "updatedAt": T}).encode(),
    )
    h.routes["/v3/carbon-intensity/forecast"] = (200, json.dumps({"forecast": []}).encode())
    assert ElectricityMapsSource(url, "FR", "s3cret", 2.0).read(NOW).intensity == 99
    assert all(headers.get("auth-token") == "s3cret" for _, headers in h.seen)


def test_watttime_logs_in_then_reads_with_the_bearer_token(server: tuple[str, type[_Recorder]]) -> None:
    url, h = server
    h.routes["/login"] = (200, b'{"token": "tok1"}')
    h.routes["/v3/forecast"] = (
        200,
        json.dumps({"data": [{"point_time": T, "value": 800}], "meta": {"generated_at": T}}).encode(),
    )
    source = WattTimeSource(url, "CAISO_NORTH", "me", "pw", 2.0)
    assert round(source.read(NOW).intensity) == 363
    source.read(NOW)  # the token is kept
    paths = [p.split("?")[0] for p, _ in h.seen]
    assert paths == ["/login", "/v3/forecast", "/v3/forecast"]
    assert (
        h.seen[0][1]["authorization"].startswith("Basic ") and h.seen[1][1]["authorization"] == "Bearer tok1"
    )


def test_http_failures_and_oversized_answers_are_errors(server: tuple[str, type[_Recorder]]) -> None:
    url, h = server
    h.routes["/big"] = (200, b"x" * 2048)
    with pytest.raises(IntensityError, match="answer over 1024 bytes"):
        fetch(f"{url}/big", {}, 2.0, max_bytes=1024)
    with pytest.raises(IntensityError, match="HTTP 404"):
        ElectricityMapsSource(url, "FR", "t", 2.0).read(NOW)
    with pytest.raises(IntensityError, match=r"127\.0\.0\.1:1"):
        fetch("http://127.0.0.1:1/x", {}, 0.5)


def test_file_source_and_credentials(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "intensity.yaml"
    with pytest.raises(IntensityError, match="No such file"):
        FileSource(path).read(NOW)
    path.write_text("intensity: 42\nat: '2026-11-27T08:00:00Z'\n")
    assert FileSource(path).read(NOW).intensity == 42
    (tmp_path / "token").write_text("abc\n")
    assert read_credential(str(tmp_path / "token"), None) == "abc"
    monkeypatch.setenv("EM_TOKEN", " xyz ")
    assert read_credential(None, "EM_TOKEN") == "xyz"
    with pytest.raises(IntensityError, match="missing or empty"):
        read_credential(None, "NOT_SET_ANYWHERE")


# ---- the release decision -------------------------------------------------------------------------------


def reading(
    intensity: float, age_s: float = 0, forecast: tuple[tuple[datetime, float], ...] = ()
) -> IntensityReading:
    return IntensityReading(intensity, NOW - timedelta(seconds=age_s), forecast, "file")


POLICY = GatePolicy("12:00-16:00", "UTC", max_carbon_intensity=200, max_delay_s=6 * 3600)
POD = GatedPod(created=NOW - timedelta(minutes=5))


def test_each_release_rule() -> None:
    assert release_reason(POD, POLICY, reading(400), NOW, 300) is None
    assert release_reason(POD, POLICY, reading(400), NOW.replace(hour=13), 300) is Reason.WINDOW
    assert release_reason(POD, POLICY, reading(180), NOW, 300) is Reason.INTENSITY
    assert release_reason(POD, POLICY, reading(400, age_s=601), NOW, 300) is Reason.STALE
    assert release_reason(POD, POLICY, None, NOW, 300) is Reason.STALE
    late = GatedPod(NOW - timedelta(hours=7))
    assert release_reason(late, POLICY, reading(400), NOW, 300) is Reason.DEADLINE
    due = GatedPod(NOW - timedelta(minutes=5), deadline=NOW + timedelta(hours=1), expected_runtime_s=3600)
    assert release_reason(due, POLICY, reading(400), NOW, 300) is Reason.DEADLINE
    dirtier = ((NOW + timedelta(hours=1), 450.0), (NOW + timedelta(hours=2), 500.0))
    assert release_reason(POD, POLICY, reading(400, forecast=dirtier), NOW, 300) is Reason.FORECAST
    cleaner = ((NOW + timedelta(hours=1), 450.0), (NOW + timedelta(hours=2), 300.0))
    assert release_reason(POD, POLICY, reading(400, forecast=cleaner), NOW, 300) is None


def test_without_a_source_only_the_window_and_release_by_decide() -> None:
    assert release_reason(POD, POLICY, None, NOW, None) is None
    assert release_reason(GatedPod(NOW - timedelta(hours=6)), POLICY, None, NOW, None) is Reason.DEADLINE


def test_release_by_is_the_sooner_of_deadline_minus_runtime_and_max_delay() -> None:
    pod = GatedPod(NOW, deadline=NOW + timedelta(hours=10), expected_runtime_s=None)
    assert release_by(pod, POLICY) == NOW + timedelta(hours=6)  # maxDelay bounds a far deadline
    assert release_by(pod, GatePolicy("12:00-16:00", expected_runtime_s=5 * 3600)) == NOW + timedelta(hours=5)
    assert release_by(GatedPod(NOW, NOW + timedelta(hours=3), 1800), POLICY) == NOW + timedelta(hours=2.5)


def test_windows_and_durations() -> None:
    assert window_open("22:00-06:00", "UTC", NOW.replace(hour=23)) and window_open(
        "22:00-06:00", "UTC", NOW.replace(hour=5)
    )
    assert not window_open("22:00-06:00", "UTC", NOW.replace(hour=6))
    assert window_open("09:00-10:00", "Europe/Paris", NOW)  # 08:00 UTC is 09:00 in Paris in November
    assert parse_duration("1h30m") == 5400 and parse_duration("45s") == 45
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration("1 hour")


def test_the_avoided_estimate_is_location_based_and_signed() -> None:
    r = reading(400, forecast=((NOW + timedelta(minutes=30), 200.0),))
    assert mean_intensity(r, NOW, 3600) == pytest.approx(300, abs=4)
    assert avoided_grams(2, 400, 3600, 500, 300) == pytest.approx(160)  # 0.8 kWh × 200 g
    assert avoided_grams(1, 400, 3600, 300, 500) < 0
    assert (
        gpu_watts("H100", None) == 700 and gpu_watts("H100", 512.0) == 512.0 and gpu_watts("Z9", None) == 400
    )


# ---- the webhook's gate and the pods --------------------------------------------------------------------


def pool(min_replicas: int = 1, shifting: bool = True) -> dict[str, Any]:
    return {
        "metadata": {"name": "green", "namespace": "ns"},
        "spec": {
            "minReplicas": min_replicas,
            "scheduling": {
                "carbonAware": {
                    "enabled": True,
                    "timeShifting": {"enabled": shifting, "cleanEnergyHours": "10:00-14:00"},
                }
            },
        },
    }


def pod(name: str, gates: list[dict[str, str]] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"neuronetes.io/pool": "green"}},
        "spec": {"schedulingGates": gates or []},
    }


def test_pods_above_the_floor_of_a_time_shifted_pool_are_gated() -> None:
    def read(_ns: str, _name: str) -> Mapping[str, Any]:
        return pool()

    assert carbon_gate_patch(pod("green-0"), "ns", read) == []  # the floor serves now
    assert carbon_gate_patch(pod("green-1"), "ns", read) == [
        {"op": "add", "path": "/spec/schedulingGates", "value": [{"name": GATE}]}
    ]
    assert (
        carbon_gate_patch(pod("mine", [{"name": "other"}]), "ns", read)[0]["path"]
        == "/spec/schedulingGates/-"
    )
    assert carbon_gate_patch(pod("green-1", [{"name": GATE}]), "ns", read) == []  # reinvoked
    assert carbon_gate_patch(pod("green-1"), "ns", lambda *_: pool(shifting=False)) == []
    assert in_floor(
        "green-0-1",
        {
            **pool(2),
            "spec": {**pool(2)["spec"], "scheduling": {"gangScheduling": {"enabled": True, "minMembers": 2}}},
        },
    )


def test_a_pool_that_cannot_be_read_admits_the_pod_ungated() -> None:
    from neuronetes_operator.carbon_admission import PoolReadError

    def broken(_ns: str, _name: str) -> Mapping[str, Any]:
        raise PoolReadError("HTTP 503")

    assert carbon_gate_patch(pod("green-3"), "ns", broken) == []


def test_preferred_regions_become_a_preferred_node_affinity() -> None:
    text = {
        "apiVersion": "neuronetes.io/v1alpha1",
        "kind": "AgentPool",
        "metadata": {"name": "green", "namespace": "ns", "uid": "u"},
        "spec": {
            "scheduling": {"carbonAware": {"enabled": True, "preferredRegions": ["eu-north-1", "us-west-2"]}}
        },
    }
    spec = decode(text, AgentPool).spec
    manifest = desired_pods(text, spec, resolve(spec))[0].manifest
    preferred = manifest["spec"]["affinity"]["nodeAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"
    ]
    assert [(p["weight"], p["preference"]["matchExpressions"][0]["values"]) for p in preferred] == [
        (100, ["eu-north-1"]),
        (90, ["us-west-2"]),
    ]
    assert preferred[0]["preference"]["matchExpressions"][0]["key"] == "topology.kubernetes.io/region"


def test_the_operator_settings_take_a_carbon_source(tmp_path: Path) -> None:
    path = tmp_path / "operator.yaml"
    path.write_text("carbon:\n  intervalSeconds: 1\n  source: {type: file, path: /x, refreshSeconds: 2}\n")
    cfg = load_settings(path).carbon
    assert cfg.source is not None and cfg.source.refresh_seconds == 2 and cfg.interval_seconds == 1
