"""Entry points of `neuronetes operator run` and `neuronetes webhook serve` (argparse namespace in)."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from pathlib import Path

import msgspec

from neuronetes.signals import relay_signals

from .settings import load_settings
from .tiers import PriorityTier, load_tiers

__all__ = ["operator_run", "webhook_serve"]


def _logging(level: str) -> None:
    logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def _tiers(path: str | None) -> tuple[PriorityTier, ...] | None:
    """The priority tiers of `path` (None: the defaults); None after printing why they are unusable."""
    try:
        return load_tiers(path)
    except (OSError, ValueError, msgspec.ValidationError, msgspec.DecodeError) as exc:
        print(f"error: priority tiers {path}: {' '.join(str(exc).split())}", file=sys.stderr)
        return None


def operator_run(ns: argparse.Namespace) -> int:
    _logging(ns.log_level)
    try:
        settings = load_settings(ns.config)
    except (OSError, msgspec.ValidationError, msgspec.DecodeError) as exc:
        print(f"error: settings {ns.config}: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    tiers = _tiers(ns.priority_tiers)
    if tiers is None:
        return 2
    from kubernetes.config import ConfigException

    from .handlers import run

    try:
        run(settings, kubeconfig=ns.kubeconfig, tiers=tiers)
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
    tiers = _tiers(ns.priority_tiers)
    if tiers is None:
        return 2
    from .admission import protect_host_paths
    from .agent_admission import api_pod_reader
    from .carbon_admission import api_pool_reader
    from .quota_admission import api_quota_lister
    from .slice_admission import api_slice_reader
    from .tier_admission import api_namespace_reader
    from .webhook import ClusterReads, WebhookServer

    protect_host_paths(getattr(ns, "protected_host_path", None) or ())
    slices = api_slice_reader()
    reads = ClusterReads(
        slices, api_pod_reader(), api_namespace_reader(), api_quota_lister(), tiers, api_pool_reader()
    )
    try:
        server = WebhookServer(ns.host, ns.port, Path(ns.cert_dir), frozenset(ns.trusted_user or ()), reads)
    except (OSError, ValueError) as exc:
        print(f"error: cannot serve on {ns.host}:{ns.port} with {ns.cert_dir}: {exc}", file=sys.stderr)
        return 1
    if slices is None:
        # Warned once the server is up, so a refused start stays one error line.
        logging.getLogger("neuronetes.webhook").warning(
            "no API credentials (in-cluster or $KUBECONFIG): pods naming a GPUSlice, the node "
            "agent's evictions, new GPUSlices, pods asking for gpu-memory or gpu-compute and priority "
            "tiers granted by namespace label are refused"
        )

    # shutdown() waits for serve_forever to return: called from the relay thread, never the loop's.
    relay_signals(lambda signum: server.shutdown(), (signal.SIGTERM, signal.SIGINT))
    logging.getLogger("neuronetes.webhook").info("serving on https://%s:%d", ns.host, server.port)
    server.serve_forever()
    return 0
