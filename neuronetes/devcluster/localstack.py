"""The operator and webhook replicas as host processes (e2e tests, benchmarks).

Dev tooling, not the operator's: it lives with the dev cluster, whose process records
(`procs`) it uses, so the operator never imports the dev cluster.

`HostProcess` runs one command in its own session with its working directory outside the checkout
(whose ``operator/`` folder would shadow the standard library's module), logs to a file, and is
stopped with SIGTERM (then SIGKILL) or killed outright; nothing of its session is left.
`LocalStack` is what a local cluster runs: the operator and two webhook replicas sharing one port,
registered with the API server (`launch.webhook_configurations`), and the priority tiers'
PriorityClasses (`launch.priority_classes`), which in a cluster the chart creates.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import ssl
import subprocess
import time
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path

from neuronetes.devcluster import procs
from neuronetes_operator.launch import (
    dev_operator_settings,
    operator_argv,
    priority_classes,
    tiers_file,
    webhook_argv,
    webhook_configurations,
)
from neuronetes_operator.tiers import DEFAULT_TIERS, PriorityTier
from neuronetes_operator.webhook import CA_FILE, ensure_certificate

__all__ = ["HostProcess", "LocalStack", "free_port"]


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class HostProcess:
    """One long-running command (started with `neuronetes.devcluster.procs.spawn`, so a dev
    cluster can record it); `start` waits for `ready()`."""

    def __init__(self, name: str, argv: Sequence[str], workdir: Path) -> None:
        self.name, self.argv, self.workdir = name, list(argv), workdir
        self.proc: subprocess.Popen[bytes] | None = None
        self.record: procs.ProcessRecord | None = None
        self.starts = 0

    @property
    def log(self) -> Path:
        return self.workdir / f"{self.name}-{self.starts}.log"

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, ready: Callable[[], bool] | None = None, timeout: float = 60.0) -> None:
        self.starts += 1
        self.proc, self.record = procs.spawn(self.name, self.argv, log=self.log, cwd=self.workdir)
        deadline = time.monotonic() + timeout
        while ready is not None and not ready():
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} was not ready in {timeout:.0f} s:\n{self.tail()}")
            time.sleep(0.2)

    def kill(self) -> None:
        """SIGKILL to its whole session, no grace (a crash)."""
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.stop()

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after `grace_s`; nothing of its session is left."""
        proc, record, self.proc, self.record = self.proc, self.record, None, None
        if record is not None:
            procs.stop_all([record], grace_s=grace_s)
        if proc is not None:
            proc.wait()

    def tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


class LocalStack:
    """The operator and `replicas` webhook replicas for a cluster reachable with `kubeconfig`,
    enforcing the priority `tiers` (default: `tiers.DEFAULT_TIERS`)."""

    def __init__(
        self,
        kubeconfig: Path,
        workdir: Path,
        kubectl: Callable[..., subprocess.CompletedProcess[str]],
        *,
        replicas: int = 2,
        port: int | None = None,
        settings: dict[str, object] | None = None,
        tiers: Sequence[PriorityTier] = DEFAULT_TIERS,
    ) -> None:
        self.kubeconfig, self.workdir, self.kubectl = kubeconfig, workdir, kubectl
        self.port = port or free_port()
        self.cert_dir = workdir / "webhook-certs"
        self.settings_file = workdir / "operator.json"
        self.tiers, self.tiers_file = tuple(tiers), workdir / "priority-tiers.json"
        self.settings = dev_operator_settings() if settings is None else settings
        self.operator = HostProcess(
            "operator", operator_argv(kubeconfig, self.settings_file, self.tiers_file), workdir
        )
        argv = webhook_argv(self.port, self.cert_dir, kubeconfig=kubeconfig, tiers=self.tiers_file)
        self.webhooks = [HostProcess(f"webhook-{i}", argv, workdir) for i in range(replicas)]

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def webhook_healthy(self) -> bool:
        context = ssl.create_default_context(cafile=str(self.cert_dir / CA_FILE))
        try:
            with urllib.request.urlopen(f"{self.url}/healthz", timeout=2, context=context) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    def start_webhook(self, replica: int) -> None:
        self.webhooks[replica].start(ready=self.webhook_healthy)

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        ca = ensure_certificate(self.cert_dir)
        self.settings_file.write_text(json.dumps(self.settings))
        tiers_file(self.tiers_file, self.tiers)
        for obj in priority_classes(self.tiers):
            text = json.dumps(obj)
            if self.kubectl("apply", "-f", "-", input=text, check=False).returncode != 0:
                # A PriorityClass's value and policy are immutable: replace one that differs.
                self.kubectl("delete", "priorityclass", obj["metadata"]["name"], check=False)
                self.kubectl("create", "-f", "-", input=text)
        for i in range(len(self.webhooks)):
            self.start_webhook(i)
        for obj in webhook_configurations(ca, self.url):
            self.kubectl("apply", "-f", "-", input=json.dumps(obj))
        self.operator.start()

    def stop(self) -> None:
        for obj in webhook_configurations(b"", self.url):
            self.kubectl("delete", obj["kind"], obj["metadata"]["name"], "--ignore-not-found", check=False)
        self.operator.stop()
        for proc in self.webhooks:
            proc.stop()
