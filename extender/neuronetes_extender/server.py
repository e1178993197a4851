"""Running the extender: the `neuronetes extender serve` command and its assembly.

One uvicorn worker (uvloop + httptools when installed) serves the app; background threads keep
the GPU cache in step with the API server. One worker is deliberate: the cache is the single
picture of every GPU, and the decisions it makes under its lock are sub-millisecond.

Closed by default: it listens on loopback (the extender runs beside kube-scheduler in one pod).
A remote extender serves HTTPS and requires a client certificate signed by ``--client-ca-file``
(kube-scheduler's ``enableHTTPS`` with a ``tlsConfig`` that carries its client certificate);
listening on any other address without that is refused unless ``--insecure-allow-remote`` says
so explicitly. On SIGTERM it stops within `SHUTDOWN_SECONDS`: waiting gang binds fail at once,
reflectors and writers stop, what Events are queued get a short drain.
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import socket
import ssl
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, Final

import uvicorn
from fastapi import FastAPI

from neuronetes.kube.pricetable import PriceTableWatch, parse_price_table_ref

from .app import create_app
from .cache import GpuCache
from .config import ConfigError, SettingsSource
from .events import EventRecorder
from .feeds import Reflectors, start_reflectors
from .kube import AsyncKube, KubeApi, KubeError
from .metrics import ExtenderMetrics
from .preemption import PreemptionController
from .reservations import GroupDirectory, ReservationStore
from .service import ExtenderService
from .watch import Reflector, WatchHealth

__all__ = [
    "SHUTTING_DOWN",
    "Extender",
    "ListenError",
    "ListenPolicy",
    "build",
    "free_port",
    "listen_policy",
    "parse_bind_address",
    "serve",
]

log = logging.getLogger(__name__)

SHUTDOWN_SECONDS: Final = 10.0
STOP_SECONDS: Final = 4.0
"""Of `SHUTDOWN_SECONDS`: how long reflectors and writers get to stop."""
SHUTTING_DOWN: Final = "the extender is shutting down"
GRACEFUL_SECONDS: Final = 3
"""Of `SHUTDOWN_SECONDS`: how long open requests get to finish (waiting binds fail at once)."""


class ListenError(ValueError):
    """A listen address and TLS combination that would open the extender to anyone."""


@dataclass(frozen=True, slots=True)
class ListenPolicy:
    """Where and how the extender listens (what `listen_policy` allowed)."""

    host: str
    port: int
    tls_cert_file: str | None = None
    tls_private_key_file: str | None = None
    client_ca_file: str | None = None

    @property
    def https(self) -> bool:
        return self.tls_cert_file is not None

    def uvicorn_ssl(self) -> dict[str, Any]:
        """uvicorn's TLS options: server certificate, and client certificates required."""
        if not self.https:
            return {}
        options: dict[str, Any] = {
            "ssl_certfile": self.tls_cert_file,
            "ssl_keyfile": self.tls_private_key_file,
        }
        if self.client_ca_file is not None:
            options |= {"ssl_ca_certs": self.client_ca_file, "ssl_cert_reqs": ssl.CERT_REQUIRED}
        return options


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name: it may resolve to anything


def listen_policy(
    host: str,
    port: int,
    *,
    tls_cert_file: str | None = None,
    tls_private_key_file: str | None = None,
    client_ca_file: str | None = None,
    insecure_allow_remote: bool = False,
) -> ListenPolicy:
    """Check a listen configuration: loopback, or client-certificate HTTPS, or explicitly insecure.

    Raises:
        ListenError: a non-loopback address without client-certificate TLS (and without
            `insecure_allow_remote`), half a TLS configuration, or a file that cannot be read.
    """
    if (tls_cert_file is None) != (tls_private_key_file is None):
        raise ListenError("--tls-cert-file and --tls-private-key-file go together")
    if client_ca_file is not None and tls_cert_file is None:
        raise ListenError("--client-ca-file needs --tls-cert-file and --tls-private-key-file")
    for option, path in (
        ("--tls-cert-file", tls_cert_file),
        ("--tls-private-key-file", tls_private_key_file),
        ("--client-ca-file", client_ca_file),
    ):
        if path is not None and not Path(path).is_file():
            raise ListenError(f"{option} {path}: no such file")
    if tls_cert_file is not None:
        try:  # fail now, not at the first connection
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=client_ca_file)
            context.load_cert_chain(tls_cert_file, tls_private_key_file)
        except (ssl.SSLError, OSError) as exc:
            raise ListenError(f"TLS files unusable: {exc}") from None
    authenticated = tls_cert_file is not None and client_ca_file is not None
    if not _is_loopback(host) and not authenticated and not insecure_allow_remote:
        raise ListenError(
            f"refusing to listen on {host}: anyone who reaches the port could bind pods with the "
            "extender's rights. Listen on 127.0.0.1 (beside kube-scheduler), or serve HTTPS with "
            "client certificates (--tls-cert-file, --tls-private-key-file, --client-ca-file), or "
            "pass --insecure-allow-remote if a network policy already closes the port"
        )
    return ListenPolicy(host, port, tls_cert_file, tls_private_key_file, client_ca_file)


@dataclass
class Extender:
    """An assembled extender: cache, service, app, and (once started) the reflectors."""

    cache: GpuCache
    service: ExtenderService
    app: FastAPI
    metrics: ExtenderMetrics
    reflectors: Reflectors | None = None
    store: ReservationStore | None = None
    prices: PriceTableWatch | None = None


def build(
    *,
    kubeconfig: str | Path | None = None,
    config: str | Path | None = None,
    api: KubeApi | None = None,
    watch: bool = True,
    resync_period: float = 600.0,
    service_class: type[ExtenderService] = ExtenderService,
    price_table: str | None = None,
) -> Extender:
    """Cache + service + app; with `watch`, the app's startup starts the list+watch threads.

    `service_class` may be a subclass that instruments the verbs (tests). `price_table`: the
    ``NAMESPACE/NAME`` of the price table's ConfigMap, watched (`neuronetes.kube.pricetable`).

    Raises:
        ConfigError: a bad settings file or `price_table` reference.
    """
    try:
        table_ref = parse_price_table_ref(price_table) if price_table else None
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    settings = SettingsSource(config)
    cache = GpuCache(settings)
    api = api or KubeApi.from_kubeconfig(kubeconfig)
    client = AsyncKube.of(api)
    metrics = ExtenderMetrics(cache.stats)
    health = WatchHealth()
    groups = GroupDirectory()
    group_watches: list[Reflector[Any]] = []
    if watch:
        for key in GroupDirectory.SOURCES:
            group_watches.append(groups.reflector(api, key, resync_period=resync_period))
    events = EventRecorder(client)
    service = service_class(cache, client, metrics, groups, health=health, events=events)
    store = ReservationStore(cache, api, resync_period=resync_period, health=health) if watch else None
    preemption = (
        PreemptionController(cache, api, events, lambda: cache.settings.get().preemption) if watch else None
    )
    prices = (
        PriceTableWatch(api, *table_ref, on_change=cache.set_price_table, resync_period=resync_period)
        if watch and table_ref is not None
        else None
    )

    def startup() -> None:
        if prices is not None:  # before the nodes: a first list then prices every node once
            prices.start()
        if watch:
            extender.reflectors = start_reflectors(cache, api, resync_period=resync_period, health=health)
            for reflector in group_watches:
                health.add(reflector)
                reflector.start()
        if store is not None:
            store.start()
        if preemption is not None:
            preemption.start()

    def shutdown() -> None:
        service.barrier.fail_all(SHUTTING_DOWN)
        deadline = time.monotonic() + STOP_SECONDS
        for reflector in group_watches:
            reflector.signal_stop()
        if extender.reflectors is not None:
            extender.reflectors.stop(STOP_SECONDS / 2)
        if preemption is not None:
            preemption.stop(max(0.5, deadline - time.monotonic()))
        if store is not None:
            store.stop(max(0.5, deadline - time.monotonic()))
        for reflector in group_watches:
            reflector.join(deadline - time.monotonic())
        if prices is not None:
            prices.stop(max(0.5, deadline - time.monotonic()))

    app = create_app(
        service, metrics=metrics, on_startup=startup, on_shutdown=shutdown, on_shutdown_async=client.aclose
    )
    extender = Extender(cache, service, app, metrics, store=store, prices=prices)
    return extender


def parse_bind_address(text: str) -> tuple[str, int]:
    """`HOST:PORT` (`[::]:9464` for IPv6; an empty host means every address) → (host, port)."""
    host, sep, port = text.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ListenError(f"--metrics-bind-address {text!r}: expected HOST:PORT, e.g. 0.0.0.0:9464")
    return host or "0.0.0.0", int(port)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def uvicorn_config(app: Any, policy: ListenPolicy, log_level: str) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        host=policy.host,
        port=policy.port,
        log_level=log_level,
        access_log=False,
        lifespan="on",
        timeout_keep_alive=120,  # kube-scheduler keeps one connection per extender
        timeout_graceful_shutdown=GRACEFUL_SECONDS,
        # No proxy sits between kube-scheduler and the extender: trust no X-Forwarded-* header, and
        # spare every request uvicorn's proxy-header middleware (`bench/e2e_throughput.py
        # --profile-extender`: "HTTP: uvicorn").
        proxy_headers=False,
        **policy.uvicorn_ssl(),
    )


def serve(ns: argparse.Namespace) -> int:
    """`neuronetes extender serve` (arguments from `neuronetes.cli`): run until interrupted."""
    logging.basicConfig(
        level=getattr(logging, ns.log_level.upper()), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        policy = listen_policy(
            ns.host,
            ns.port,
            tls_cert_file=ns.tls_cert_file,
            tls_private_key_file=ns.tls_private_key_file,
            client_ca_file=ns.client_ca_file,
            insecure_allow_remote=ns.insecure_allow_remote,
        )
        metrics_address = parse_bind_address(ns.metrics_bind_address) if ns.metrics_bind_address else None
        extender = build(
            kubeconfig=ns.kubeconfig,
            config=ns.config,
            resync_period=ns.resync_period,
            price_table=ns.price_table,
        )
        if metrics_address is not None:
            port = extender.metrics.serve(*metrics_address)
            log.info("metrics on http://%s:%d/metrics", metrics_address[0], port)
    except (ConfigError, KubeError, ListenError, OSError) as exc:
        log.error("%s", exc)
        return 2
    if policy.https and policy.client_ca_file is None:
        log.warning("HTTPS without --client-ca-file: clients are not authenticated")
    _Server(uvicorn_config(extender.app, policy, ns.log_level), extender.service).run()
    return 0


class _Server(uvicorn.Server):
    """uvicorn, failing the binds that wait at a gang barrier as soon as SIGTERM arrives (before
    it waits for open requests to finish)."""

    def __init__(self, config: uvicorn.Config, service: ExtenderService) -> None:
        super().__init__(config)
        self._service = service

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # Not here: the signal may have interrupted this thread inside the cache's lock.
        threading.Thread(
            target=self._service.barrier.fail_all, args=(SHUTTING_DOWN,), name="fail-waiting-binds"
        ).start()
        super().handle_exit(sig, frame)
