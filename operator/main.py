"""Entry points of `neuronetes operator run` and `neuronetes webhook serve` (argparse namespace in)."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from pathlib import Path
from types import FrameType

import msgspec

from .settings import load_settings

__all__ = ["operator_run", "webhook_serve"]


def _logging(level: str) -> None:
    logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def operator_run(ns: argparse.Namespace) -> int:
    _logging(ns.log_level)
    try:
        settings = load_settings(ns.config)
    except (OSError, msgspec.ValidationError, msgspec.DecodeError) as exc:
        print(f"error: settings {ns.config}: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    from kubernetes.config import ConfigException

    from .handlers import run

    try:
        run(settings, kubeconfig=ns.kubeconfig)
    except (OSError, ConfigException) as exc:
        print(
            f"error: cannot reach the cluster with {ns.kubeconfig or 'the in-cluster config'}: {exc}",
            file=sys.stderr,
        )
        return 1
    except KeyboardInterrupt:
        return 0
    return 0


def webhook_serve(ns: argparse.Namespace) -> int:
    _logging(ns.log_level)
    from .admission import protect_host_paths
    from .agent_admission import api_pod_reader
    from .slice_admission import api_slice_reader
    from .webhook import WebhookServer

    protect_host_paths(getattr(ns, "protected_host_path", None) or ())
    slices = api_slice_reader()
    pods = api_pod_reader()
    try:
        server = WebhookServer(
            ns.host, ns.port, Path(ns.cert_dir), frozenset(ns.trusted_user or ()), slices, pods
        )
    except (OSError, ValueError) as exc:
        print(f"error: cannot serve on {ns.host}:{ns.port} with {ns.cert_dir}: {exc}", file=sys.stderr)
        return 1
    if slices is None:
        # Warned once the server is up, so a refused start stays one error line.
        logging.getLogger("neuronetes.webhook").warning(
            "no API credentials (in-cluster or $KUBECONFIG): pods naming a GPUSlice and the node "
            "agent's evictions are refused"
        )

    def stop(signum: int, frame: FrameType | None) -> None:
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    logging.getLogger("neuronetes.webhook").info("serving on https://%s:%d", ns.host, server.port)
    server.serve_forever()
    return 0
