"""A local Kubernetes control plane on loopback with simulated GPU nodes.

etcd, kube-apiserver, kube-controller-manager (optional), kube-scheduler (stock profile plus the
``neuronetes-scheduler`` profile, optionally calling our extender) and kwok (running the nodes
annotated ``kwok.x-k8s.io/node=fake``) run as host processes, each in its own process group.
Everything a cluster owns lives in its state folder,
``~/.cache/neuronetes/clusters/<name>/``: ``state.json`` (ports, process records),
``kubeconfig``, ``logs/<component>.log``, credentials and etcd's data.

A cluster is started fresh by `DevCluster.up` (no state is kept from an earlier run) and
`DevCluster.down` stops every process it started; both may be called from any process (the CLI,
a pytest session) and `down` is idempotent.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import secrets
import shutil
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from neuronetes.devcluster import procs
from neuronetes.devcluster.config import (
    ADMIN_GROUP,
    ADMIN_USER,
    ExtenderConfig,
    generate_service_account_key,
    kubeconfig,
    scheduler_config,
    write_private,
)
from neuronetes.devcluster.profiles import KWOK_ANNOTATION, REGION, ZONES, node_manifest, profile
from neuronetes.devcluster.tools import (
    REPO_ROOT,
    BuildError,
    Toolchain,
    build,
    cache_root,
    want_controller_manager,
)
from neuronetes.model import NodeSpec

__all__ = [
    "ApiError",
    "ClusterError",
    "ClusterStatus",
    "ComponentStatus",
    "DevCluster",
    "KubectlError",
    "parse_node_counts",
]

COMPONENTS: Final = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
SERVICE_CIDR: Final = "10.0.0.0/24"
POD_CIDR: Final = "10.64.0.0/12"
STATE_VERSION: Final = 1


class ClusterError(RuntimeError):
    """The cluster could not be started, or is not running."""


class ApiError(RuntimeError):
    """A request to the API server failed."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


class KubectlError(subprocess.CalledProcessError):
    """kubectl failed; the message carries its stderr."""

    def __str__(self) -> str:
        err = (self.stderr or "").strip() if isinstance(self.stderr, str) else ""
        return f"{super().__str__()}\n{err}" if err else super().__str__()


@dataclass(frozen=True, slots=True)
class ComponentStatus:
    name: str
    pid: int
    running: bool
    healthy: bool | None
    """None: the component has no health endpoint we probe."""
    detail: str = ""


@dataclass(frozen=True, slots=True)
class ClusterStatus:
    name: str
    state_dir: Path
    kubeconfig: Path | None
    server: str | None
    versions: dict[str, str]
    components: tuple[ComponentStatus, ...]
    api_healthy: bool
    api_version: str | None
    nodes: int | None
    extender_url: str | None

    @property
    def up(self) -> bool:
        return bool(self.components) and all(c.running for c in self.components) and self.api_healthy


def parse_node_counts(items: Sequence[str]) -> list[tuple[str, int]]:
    """``["dgx-h100=2", "t4x4-pcie"]`` → ``[("dgx-h100", 2), ("t4x4-pcie", 1)]`` (profiles checked)."""
    out: list[tuple[str, int]] = []
    for item in items:
        name, sep, count = item.partition("=")
        name = name.strip()
        profile(name)  # ValueError naming the profiles
        try:
            n = int(count) if sep else 1
        except ValueError:
            raise ValueError(f"--nodes {item!r}: COUNT must be an integer") from None
        if n < 0:
            raise ValueError(f"--nodes {item!r}: COUNT must be >= 0")
        out.append((name, n))
    return out


def _free_ports(n: int) -> list[int]:
    """`n` distinct free TCP ports on 127.0.0.1 (held open until all are picked)."""
    socks: list[socket.socket] = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _insecure_context() -> ssl.SSLContext:
    """For loopback health probes of components serving self-signed certificates only."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def _http_ok(
    url: str, *, context: ssl.SSLContext | None = None, token: str | None = None
) -> tuple[bool, str]:
    req = urllib.request.Request(url)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=2, context=context) as resp:
            body = resp.read(4096).decode(errors="replace")
            return resp.status == 200, body.strip()
    except urllib.error.HTTPError as exc:
        return False, f"HTTP {exc.code}"
    except (OSError, ValueError) as exc:
        return False, str(exc)


class _Api:
    """A minimal JSON client for the API server (bearer token, verified TLS)."""

    def __init__(self, server: str, token: str, ca_file: Path) -> None:
        self.server = server
        self.token = token
        self.context = ssl.create_default_context(cafile=str(ca_file))

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
        timeout: float = 30.0,
    ) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.server + path, data=data, method=method)
        req.add_header("Authorization", f"Bearer {self.token}")
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(req, timeout=timeout, context=self.context) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            text = exc.read().decode(errors="replace")
            try:
                message = str(json.loads(text).get("message", text))
            except ValueError:
                message = text
            raise ApiError(exc.code, message) from None
        return json.loads(raw) if raw else None


@dataclass
class _State:
    name: str
    ports: dict[str, int]
    versions: dict[str, str]
    processes: dict[str, procs.ProcessRecord] = field(default_factory=dict)
    extender: dict[str, Any] | None = None
    controller_manager: bool = True
    started_at: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "name": self.name,
            "ports": self.ports,
            "versions": self.versions,
            "processes": {k: v.to_json() for k, v in self.processes.items()},
            "extender": self.extender,
            "controller_manager": self.controller_manager,
            "started_at": self.started_at,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> _State:
        return cls(
            name=str(data["name"]),
            ports={str(k): int(v) for k, v in data["ports"].items()},
            versions={str(k): str(v) for k, v in data["versions"].items()},
            processes={str(k): procs.ProcessRecord.from_json(v) for k, v in data["processes"].items()},
            extender=data.get("extender"),
            controller_manager=bool(data.get("controller_manager", True)),
            started_at=float(data.get("started_at", 0.0)),
        )


Log = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


class DevCluster:
    """One named local cluster. Cheap to construct: it only points at the state folder."""

    def __init__(
        self,
        name: str = "dev",
        *,
        state_root: Path | None = None,
        tools: Toolchain | None = None,
        log: Log | None = None,
    ) -> None:
        if not name or not all(c.isalnum() or c in "-_." for c in name):
            raise ValueError(f"cluster name {name!r}: use letters, digits, '-', '_' and '.'")
        self.name = name
        self.state_dir = (state_root or cache_root() / "clusters") / name
        self.tools = tools or Toolchain.pinned()
        self.log: Log = log or _quiet
        self._children: dict[str, subprocess.Popen[bytes]] = {}
        self._prefix_next: dict[str, int] = {}

    # ---- paths ---------------------------------------------------------------------------------
    @property
    def kubeconfig(self) -> Path:
        return self.state_dir / "kubeconfig"

    @property
    def log_dir(self) -> Path:
        return self.state_dir / "logs"

    @property
    def _state_file(self) -> Path:
        return self.state_dir / "state.json"

    @property
    def _pki(self) -> Path:
        return self.state_dir / "pki"

    @property
    def ca_file(self) -> Path:
        """The CA bundle that verifies the API server (its self-signed serving certificate)."""
        return self._pki / "apiserver" / "apiserver.crt"

    # ---- state ---------------------------------------------------------------------------------
    @property
    def _lock_file(self) -> Path:
        return self.state_dir.parent / f".{self.name}.lock"

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.state_dir.parent.mkdir(parents=True, exist_ok=True)
        with self._lock_file.open("w") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def _load(self) -> _State | None:
        try:
            return _State.from_json(json.loads(self._state_file.read_text()))
        except FileNotFoundError:
            return None
        except (ValueError, KeyError, TypeError) as exc:
            raise ClusterError(f"{self._state_file} is unreadable ({exc}); remove {self.state_dir}") from None

    def _save(self, state: _State) -> None:
        tmp = self._state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(state.to_json(), indent=2) + "\n")
        tmp.replace(self._state_file)
        pids = self.state_dir / "pids"
        pids.mkdir(exist_ok=True)
        for name, rec in state.processes.items():
            (pids / f"{name}.pid").write_text(f"{rec.pid}\n")

    def _token(self) -> str:
        return (self.state_dir / "token").read_text().strip()

    def _server(self, state: _State) -> str:
        return f"https://127.0.0.1:{state.ports['apiserver']}"

    def api(self) -> _Api:
        """A small JSON client for the running cluster's API server (admin credentials)."""
        state = self._load()
        if state is None:
            raise ClusterError(f"cluster {self.name!r} is not running (no {self._state_file})")
        return _Api(self._server(state), self._token(), self.ca_file)

    # ---- lifecycle -----------------------------------------------------------------------------
    def is_up(self) -> bool:
        state = self._load()
        return state is not None and all(procs.is_running(r) for r in state.processes.values())

    def up(
        self,
        *,
        nodes: Sequence[tuple[str, int]] = (),
        extender: ExtenderConfig | None = None,
        controller_manager: bool | None = None,
        crds_dir: Path | None = REPO_ROOT / "crds",
        auto_build: bool = False,
        apiserver_args: Sequence[str] = (),
        timeout_s: float = 90.0,
    ) -> float:
        """Start the cluster (fresh state); return the seconds it took.

        Raises `ClusterError` when it is already running (`down` it first) or fails to start
        (everything started is stopped again), `BuildError` when binaries are missing and
        `auto_build` is off or the build fails.
        """
        t0 = time.monotonic()
        if controller_manager is None:
            controller_manager = want_controller_manager()
        with self._locked():
            old = self._load()
            if old is not None:
                if old.processes and all(procs.is_running(r) for r in old.processes.values()):
                    raise ClusterError(f"cluster {self.name!r} is already running; `down` it first")
                self._stop(old)
            missing = self.tools.missing(controller_manager=controller_manager)
            if missing:
                if not auto_build:
                    raise BuildError(
                        "control-plane binaries missing (run hack/build-control-plane.sh): "
                        + ", ".join(map(str, missing))
                    )
                self.log("building the control plane (hack/build-control-plane.sh)")
                self.tools = build()
            self._wipe()
            state = _State(
                name=self.name,
                ports=dict(
                    zip(
                        ("etcd", "etcd_peer", "apiserver", "scheduler", "controller_manager", "kwok"),
                        _free_ports(6),
                        strict=True,
                    )
                ),
                versions={
                    "kubernetes": self.tools.versions.kubernetes,
                    "etcd": self.tools.versions.etcd,
                    "kwok": self.tools.versions.kwok,
                },
                extender=extender.to_json() if extender else None,
                controller_manager=controller_manager,
                started_at=time.time(),
            )
            try:
                self._start(state, extender, controller_manager, crds_dir, apiserver_args, timeout_s)
            except BaseException:
                self._stop(state)
                self._retire(state)
                raise
        try:
            for prof, count in nodes:
                if count:
                    self.add_nodes(prof, count, prof)
        except BaseException:
            self.down()
            raise
        return time.monotonic() - t0

    def _wipe(self) -> None:
        if self.state_dir.exists():
            shutil.rmtree(self.state_dir)
        self.state_dir.mkdir(parents=True)
        self.state_dir.chmod(0o700)
        for sub in ("logs", "pki", "etcd", "pids"):
            (self.state_dir / sub).mkdir(mode=0o700)

    def _spawn(self, state: _State, name: str, argv: Sequence[str]) -> procs.ProcessRecord:
        proc, rec = procs.spawn(name, argv, log=self.log_dir / f"{name}.log", cwd=self.state_dir)
        self._children[name] = proc
        state.processes[name] = rec
        self._save(state)
        return rec

    def _wait(
        self,
        state: _State,
        name: str,
        probe: Callable[[], tuple[bool, str]],
        deadline: float,
    ) -> None:
        detail = ""
        while time.monotonic() < deadline:
            rec = state.processes[name]
            if not procs.is_running(rec):
                raise ClusterError(f"{name} exited during start-up:\n{self._tail(name)}")
            ok, detail = probe()
            if ok:
                return
            time.sleep(0.1)
        raise ClusterError(f"{name} not healthy in time ({detail}):\n{self._tail(name)}")

    def _tail(self, name: str, lines: int = 25) -> str:
        try:
            text = (self.log_dir / f"{name}.log").read_text(errors="replace")
        except FileNotFoundError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def _start(
        self,
        state: _State,
        extender: ExtenderConfig | None,
        controller_manager: bool,
        crds_dir: Path | None,
        apiserver_args: Sequence[str],
        timeout_s: float,
    ) -> None:
        deadline = time.monotonic() + timeout_s
        sd, ports, t = self.state_dir, state.ports, self.tools
        token = secrets.token_urlsafe(32)
        write_private(sd / "token", token + "\n")
        write_private(sd / "pki" / "tokens.csv", f'{token},{ADMIN_USER},{ADMIN_USER},"{ADMIN_GROUP}"\n')
        sa_key, sa_pub = sd / "pki" / "sa.key", sd / "pki" / "sa.pub"
        generate_service_account_key(sa_key, sa_pub)
        self._save(state)

        self.log(f"etcd {state.versions['etcd']} on 127.0.0.1:{ports['etcd']}")
        etcd_url = f"http://127.0.0.1:{ports['etcd']}"
        self._spawn(
            state,
            "etcd",
            [
                str(t.etcd),
                f"--name={self.name}",
                f"--data-dir={sd / 'etcd'}",
                f"--listen-client-urls={etcd_url}",
                f"--advertise-client-urls={etcd_url}",
                f"--listen-peer-urls=http://127.0.0.1:{ports['etcd_peer']}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{ports['etcd_peer']}",
                f"--initial-cluster={self.name}=http://127.0.0.1:{ports['etcd_peer']}",
                "--unsafe-no-fsync",
                "--quota-backend-bytes=4294967296",
                "--log-level=warn",
            ],
        )
        self._wait(state, "etcd", lambda: _http_ok(f"{etcd_url}/health"), deadline)

        server = self._server(state)
        self.log(f"kube-apiserver {state.versions['kubernetes']} on {server}")
        self._spawn(
            state,
            "kube-apiserver",
            [
                str(t.kube_apiserver),
                f"--etcd-servers={etcd_url}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={ports['apiserver']}",
                f"--cert-dir={sd / 'pki' / 'apiserver'}",
                f"--token-auth-file={sd / 'pki' / 'tokens.csv'}",
                "--authorization-mode=RBAC",
                "--anonymous-auth=false",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={sa_pub}",
                f"--service-account-signing-key-file={sa_key}",
                # Endpoints may not hold loopback addresses: no reconciler for the `kubernetes` service.
                "--endpoint-reconciler-type=none",
                "--allow-privileged=true",
                # kwok pods run nothing: no service-account token volumes, no wait for the default SA.
                "--disable-admission-plugins=ServiceAccount",
                "--profiling=false",
                "--v=1",
                *apiserver_args,
            ],
        )

        def api_ready() -> tuple[bool, str]:
            if not self.ca_file.exists():
                return False, "no serving certificate yet"
            return _http_ok(f"{server}/readyz", context=_insecure_context(), token=token)

        self._wait(state, "kube-apiserver", api_ready, deadline)
        ca_pem = self.ca_file.read_bytes()
        write_private(
            self.kubeconfig,
            json.dumps(kubeconfig(name=self.name, server=server, ca_pem=ca_pem, token=token), indent=2)
            + "\n",
        )
        # From here on, verify the API server against its certificate.
        api = _Api(server, token, self.ca_file)
        ok, detail = _http_ok(f"{server}/readyz", context=api.context, token=token)
        if not ok:
            raise ClusterError(f"the API server's certificate does not verify: {detail}")

        kc = str(self.kubeconfig)
        if controller_manager:
            self.log(f"kube-controller-manager on 127.0.0.1:{ports['controller_manager']}")
            self._spawn(
                state,
                "kube-controller-manager",
                [
                    str(t.kube_controller_manager),
                    f"--kubeconfig={kc}",
                    f"--authentication-kubeconfig={kc}",
                    f"--authorization-kubeconfig={kc}",
                    "--bind-address=127.0.0.1",
                    f"--secure-port={ports['controller_manager']}",
                    f"--cert-dir={sd / 'pki' / 'controller-manager'}",
                    "--leader-elect=false",
                    f"--service-account-private-key-file={sa_key}",
                    f"--root-ca-file={self.ca_file}",
                    "--use-service-account-credentials=false",
                    f"--cluster-cidr={POD_CIDR}",
                    f"--service-cluster-ip-range={SERVICE_CIDR}",
                    "--profiling=false",
                    "--v=1",
                ],
            )
        self._write_scheduler_config(extender)
        self._spawn_scheduler(state)
        self.log(f"kwok {state.versions['kwok']} (nodes annotated {KWOK_ANNOTATION[0]}={KWOK_ANNOTATION[1]})")
        self._spawn(
            state,
            "kwok",
            [
                str(t.kwok),
                f"--kubeconfig={kc}",
                f"--config={t.kwok_stages}",
                f"--manage-nodes-with-annotation-selector={KWOK_ANNOTATION[0]}={KWOK_ANNOTATION[1]}",
                f"--server-address=127.0.0.1:{ports['kwok']}",
                f"--cidr={POD_CIDR}",
                "--node-ip=10.255.0.1",
                "--node-lease-duration-seconds=40",
            ],
        )
        insecure = _insecure_context()
        self._wait(
            state,
            "kube-scheduler",
            lambda: _http_ok(f"https://127.0.0.1:{ports['scheduler']}/healthz", context=insecure),
            deadline,
        )
        if controller_manager:
            self._wait(
                state,
                "kube-controller-manager",
                lambda: _http_ok(
                    f"https://127.0.0.1:{ports['controller_manager']}/healthz", context=insecure
                ),
                deadline,
            )
        self._wait(state, "kwok", lambda: _http_ok(f"http://127.0.0.1:{ports['kwok']}/healthz"), deadline)
        if crds_dir is not None:
            self.apply_crds(crds_dir, timeout_s=max(5.0, deadline - time.monotonic()))

    def _write_scheduler_config(self, extender: ExtenderConfig | None) -> Path:
        path = self.state_dir / "scheduler-config.json"
        path.write_text(json.dumps(scheduler_config(self.kubeconfig, extender), indent=2) + "\n")
        return path

    def _spawn_scheduler(self, state: _State) -> None:
        kc = str(self.kubeconfig)
        ext = state.extender["urlPrefix"] if state.extender else "none"
        self.log(f"kube-scheduler on 127.0.0.1:{state.ports['scheduler']} (extender: {ext})")
        self._spawn(
            state,
            "kube-scheduler",
            [
                str(self.tools.kube_scheduler),
                f"--config={self.state_dir / 'scheduler-config.json'}",
                f"--authentication-kubeconfig={kc}",
                f"--authorization-kubeconfig={kc}",
                "--bind-address=127.0.0.1",
                f"--secure-port={state.ports['scheduler']}",
                f"--cert-dir={self.state_dir / 'pki' / 'scheduler'}",
                "--v=2",
            ],
        )

    def set_extender(self, extender: ExtenderConfig | None, *, timeout_s: float = 30.0) -> None:
        """Restart kube-scheduler with `extender` (None: no extender) on the running cluster."""
        with self._locked():
            state = self._load()
            if state is None or "kube-scheduler" not in state.processes:
                raise ClusterError(f"cluster {self.name!r} is not running")
            procs.stop_all([state.processes["kube-scheduler"]])
            self._reap_children()
            state.extender = extender.to_json() if extender else None
            self._write_scheduler_config(extender)
            self._spawn_scheduler(state)
            port = state.ports["scheduler"]
            insecure = _insecure_context()
            self._wait(
                state,
                "kube-scheduler",
                lambda: _http_ok(f"https://127.0.0.1:{port}/healthz", context=insecure),
                time.monotonic() + timeout_s,
            )

    def apply_crds(self, crds_dir: Path, *, timeout_s: float = 60.0) -> list[Path]:
        """Server-side apply every YAML file in `crds_dir` and wait until the CRDs are Established."""
        files = sorted(p for p in crds_dir.glob("*") if p.suffix in (".yaml", ".yml") and p.is_file())
        if not files:
            return []
        self.log(f"applying {len(files)} file(s) from {crds_dir}")
        args = ["apply", "--server-side", "--force-conflicts", "--field-manager=neuronetes-devcluster"]
        for f in files:
            args += ["-f", str(f)]
        self.kubectl(*args)
        self.kubectl("wait", "--for=condition=Established", "crd", "--all", f"--timeout={int(timeout_s)}s")
        return files

    def down(self, *, grace_s: float = 10.0) -> list[str]:
        """Stop every process this cluster started (idempotent); return the components stopped.

        The state folder (logs, kubeconfig) stays until the next `up`.
        """
        if not self._state_file.exists():
            return []  # never started, or already down (and no lock file is left behind)
        with self._locked():
            state = self._load()
            if state is None:
                return []
            running = [n for n, r in state.processes.items() if procs.is_running(r)]
            self._stop(state, grace_s=grace_s)
            self._retire(state)
            return running

    def purge(self) -> None:
        """`down`, then delete the state folder (logs included) and the lock file."""
        self.down()
        shutil.rmtree(self.state_dir, ignore_errors=True)
        self._lock_file.unlink(missing_ok=True)

    def _retire(self, state: _State) -> None:
        """Mark the run as over: its records move to stopped.json (for `leftover_processes`)."""
        (self.state_dir / "stopped.json").write_text(json.dumps(state.to_json(), indent=2) + "\n")
        self._state_file.unlink(missing_ok=True)
        shutil.rmtree(self.state_dir / "pids", ignore_errors=True)

    def _stop(self, state: _State, *, grace_s: float = 10.0) -> None:
        records = list(state.processes.values())
        # Clients first, then the API server, then etcd (clean logs, no reconnect storms).
        order = [
            [r for r in records if r.name not in ("kube-apiserver", "etcd")],
            [r for r in records if r.name == "kube-apiserver"],
            [r for r in records if r.name == "etcd"],
        ]
        for batch in order:
            procs.stop_all(batch, grace_s=grace_s)
        self._reap_children()
        left = procs.group_members(r.pid for r in records)
        if left:
            raise ClusterError(f"processes of cluster {self.name!r} survived SIGKILL: {left}")

    def _reap_children(self) -> None:
        for name, proc in list(self._children.items()):
            if proc.poll() is not None:
                del self._children[name]

    def processes(self) -> list[procs.ProcessRecord]:
        """Records of the processes of the current run and of the last stopped one."""
        records: list[procs.ProcessRecord] = []
        for f in (self._state_file, self.state_dir / "stopped.json"):
            with contextlib.suppress(FileNotFoundError, ValueError, KeyError, TypeError):
                records += _State.from_json(json.loads(f.read_text())).processes.values()
        return records

    def leftover_processes(self) -> list[int]:
        """Live processes in the process groups of this cluster's last run (empty after `down`)."""
        self._reap_children()
        return procs.survivors(self.processes())

    # ---- status --------------------------------------------------------------------------------
    def status(self) -> ClusterStatus:
        state = self._load()
        if state is None:
            return ClusterStatus(
                name=self.name,
                state_dir=self.state_dir,
                kubeconfig=None,
                server=None,
                versions={},
                components=(),
                api_healthy=False,
                api_version=None,
                nodes=None,
                extender_url=None,
            )
        insecure = _insecure_context()
        token = self._token()
        probes: dict[str, Callable[[], tuple[bool, str]]] = {
            "etcd": lambda: _http_ok(f"http://127.0.0.1:{state.ports['etcd']}/health"),
            "kube-apiserver": lambda: _http_ok(
                f"{self._server(state)}/readyz", context=insecure, token=token
            ),
            "kube-controller-manager": lambda: _http_ok(
                f"https://127.0.0.1:{state.ports['controller_manager']}/healthz", context=insecure
            ),
            "kube-scheduler": lambda: _http_ok(
                f"https://127.0.0.1:{state.ports['scheduler']}/healthz", context=insecure
            ),
            "kwok": lambda: _http_ok(f"http://127.0.0.1:{state.ports['kwok']}/healthz"),
        }
        comps: list[ComponentStatus] = []
        for name in COMPONENTS:
            rec = state.processes.get(name)
            if rec is None:
                continue
            running = procs.is_running(rec)
            healthy, detail = probes[name]() if running else (False, "not running")
            comps.append(ComponentStatus(name, rec.pid, running, healthy, detail[:200]))
        api_ok = any(c.name == "kube-apiserver" and c.healthy for c in comps)
        version: str | None = None
        n_nodes: int | None = None
        if api_ok:
            with contextlib.suppress(ApiError, OSError, ValueError):
                api = self.api()
                version = str(api.request("GET", "/version")["gitVersion"])
                n_nodes = len(api.request("GET", "/api/v1/nodes")["items"])
        return ClusterStatus(
            name=self.name,
            state_dir=self.state_dir,
            kubeconfig=self.kubeconfig if self.kubeconfig.exists() else None,
            server=self._server(state),
            versions=state.versions,
            components=tuple(comps),
            api_healthy=api_ok,
            api_version=version,
            nodes=n_nodes,
            extender_url=str(state.extender["urlPrefix"]) if state.extender else None,
        )

    # ---- clients -------------------------------------------------------------------------------
    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 120.0
    ) -> subprocess.CompletedProcess[str]:
        """Run the pinned kubectl against this cluster; with `check`, fail with its stderr."""
        cmd = [str(self.tools.kubectl), f"--kubeconfig={self.kubeconfig}", *args]
        proc = subprocess.run(cmd, input=input, capture_output=True, text=True, timeout=timeout, check=False)
        if check and proc.returncode != 0:
            raise KubectlError(proc.returncode, cmd, proc.stdout, proc.stderr)
        return proc

    # ---- nodes ---------------------------------------------------------------------------------
    def create_nodes(self, specs: Sequence[NodeSpec], *, wait_ready_s: float = 60.0) -> list[str]:
        """Create simulated (kwok) nodes for `specs` and wait until kwok reports them Ready."""
        api = self.api()
        names: list[str] = []
        for spec in specs:
            manifest = node_manifest(spec)
            created = api.request("POST", "/api/v1/nodes", manifest)
            if not created.get("status", {}).get("capacity"):
                # Defensive: an API server that drops status on create gets it through /status.
                api.request(
                    "PATCH",
                    f"/api/v1/nodes/{spec.name}/status",
                    {"status": manifest["status"]},
                    content_type="application/merge-patch+json",
                )
            names.append(spec.name)
        self._wait_nodes_ready(api, set(names), wait_ready_s)
        return names

    def _wait_nodes_ready(self, api: _Api, names: set[str], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        pending = set(names)
        while True:
            items = api.request("GET", "/api/v1/nodes")["items"]
            for node in items:
                conds = node.get("status", {}).get("conditions") or []
                if any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds):
                    pending.discard(node["metadata"]["name"])
            if not pending:
                return
            if time.monotonic() > deadline:
                raise ClusterError(
                    f"{len(pending)} node(s) not Ready after {timeout_s:.0f}s (is kwok running?): "
                    f"{', '.join(sorted(pending)[:5])}\n{self._tail('kwok')}"
                )
            time.sleep(0.2)

    def add_nodes(
        self,
        profile_name: str,
        count: int,
        prefix: str,
        *,
        spot: bool = False,
        zones: Sequence[str] = ZONES,
        region: str = REGION,
        labels: Mapping[str, str] | None = None,
    ) -> list[str]:
        """Create `count` simulated nodes of a named profile, ``<prefix>-<i>``, Ready on return.

        Zones are assigned round-robin from `zones`. Numbering continues across calls with the
        same prefix on this object.
        """
        prof = profile(profile_name)
        start = self._prefix_next.get(prefix, 0)
        specs = [
            prof.node_spec(
                f"{prefix}-{i}",
                zone=zones[i % len(zones)] if zones else "",
                region=region,
                spot=spot,
                labels=labels,
            )
            for i in range(start, start + count)
        ]
        self._prefix_next[prefix] = start + count
        self.log(f"adding {count} {profile_name} node(s) {prefix}-{start}..{prefix}-{start + count - 1}")
        return self.create_nodes(specs)
