"""What a dev cluster records about itself in its state folder (``state.json``, readable by any process)."""

from __future__ import annotations

import contextlib
import fcntl
import json
import shutil
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from neuronetes.devcluster import procs
from neuronetes.devcluster.components import pair_names

__all__ = ["STATE_VERSION", "ClusterError", "RunState", "StateStore", "check_name"]

STATE_VERSION: Final = 2


def check_name(name: str) -> None:
    """Raise ValueError unless `name` can name a cluster (its state folder)."""
    if not name or not all(c.isalnum() or c in "-_." for c in name) or name in (".", ".."):
        raise ValueError(f"cluster name {name!r}: use letters, digits, '-', '_' and '.'")


class ClusterError(RuntimeError):
    """The cluster could not be started, is not running, or is not in the shape asked for."""


@dataclass
class RunState:
    """One run of a cluster: ports, versions, the processes started and how it was configured.

    `extender` is kube-scheduler's entry for an external extender (``--extender-url``);
    `run_extender` says the cluster runs its own extender beside each kube-scheduler instead;
    `run_agent` / `run_operator` that it runs the node agent (fleet mode) / the operator and its
    webhook (`neuronetes.devcluster.addons`).
    """

    name: str
    ports: dict[str, int]
    versions: dict[str, str]
    processes: dict[str, procs.ProcessRecord] = field(default_factory=dict)
    extender: dict[str, Any] | None = None
    run_extender: bool = False
    run_agent: bool = False
    run_operator: bool = False
    schedulers: int = 1
    feature_gates: dict[str, bool] = field(default_factory=dict)
    controller_manager: bool = True
    started_at: float = 0.0
    chart: dict[str, Any] | None = None
    """Chart mode (`neuronetes.devcluster.chartmode`): the release, its namespace and the
    runner's loopback network; NeuroNetes then runs only as the chart's pods."""

    def pairs(self) -> list[tuple[str, str, str]]:
        """(kube-scheduler's name, the extender's name, port-key suffix) of every pair."""
        return [pair_names(i, self.schedulers) for i in range(self.schedulers)]

    def extender_urls(self) -> list[str]:
        """The extender URL each kube-scheduler calls (in pair order; empty: none)."""
        if self.run_extender:
            return [f"http://127.0.0.1:{self.ports['extender' + sfx]}" for _, _, sfx in self.pairs()]
        return [str(self.extender["urlPrefix"])] * self.schedulers if self.extender else []

    def to_json(self) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "name": self.name,
            "ports": self.ports,
            "versions": self.versions,
            "processes": {k: v.to_json() for k, v in self.processes.items()},
            "extender": self.extender,
            "runExtender": self.run_extender,
            "runAgent": self.run_agent,
            "runOperator": self.run_operator,
            "schedulers": self.schedulers,
            "featureGates": self.feature_gates,
            "controller_manager": self.controller_manager,
            "started_at": self.started_at,
            "chart": self.chart,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RunState:
        return cls(
            name=str(data["name"]),
            ports={str(k): int(v) for k, v in data["ports"].items()},
            versions={str(k): str(v) for k, v in data["versions"].items()},
            processes={str(k): procs.ProcessRecord.from_json(v) for k, v in data["processes"].items()},
            extender=data.get("extender"),
            run_extender=bool(data.get("runExtender", False)),
            run_agent=bool(data.get("runAgent", False)),
            run_operator=bool(data.get("runOperator", False)),
            schedulers=int(data.get("schedulers", 1)),
            feature_gates={str(k): bool(v) for k, v in (data.get("featureGates") or {}).items()},
            controller_manager=bool(data.get("controller_manager", True)),
            started_at=float(data.get("started_at", 0.0)),
            chart=data.get("chart"),
        )


class StateStore:
    """The state folder of one cluster: ``state.json`` under a file lock, and the run's records.

    ``state.json`` exists while a run is up; `retire` moves it to ``stopped.json`` so the
    processes of the last run can still be checked (`records`).
    """

    def __init__(self, name: str, state_dir: Path) -> None:
        self.name = name
        self.state_dir = state_dir

    @property
    def file(self) -> Path:
        return self.state_dir / "state.json"

    @property
    def lock_file(self) -> Path:
        return self.state_dir.parent / f".{self.name}.lock"

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        self.state_dir.parent.mkdir(parents=True, exist_ok=True)
        with self.lock_file.open("w") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def load(self) -> RunState | None:
        try:
            return RunState.from_json(json.loads(self.file.read_text()))
        except FileNotFoundError:
            return None
        except (ValueError, KeyError, TypeError) as exc:
            raise ClusterError(f"{self.file} is unreadable ({exc}); remove {self.state_dir}") from None

    def running(self) -> RunState:
        state = self.load()
        if state is None:
            raise ClusterError(f"cluster {self.name!r} is not running (no {self.file})")
        return state

    def save(self, state: RunState) -> None:
        tmp = self.file.with_suffix(".tmp")
        tmp.write_text(json.dumps(state.to_json(), indent=2) + "\n")
        tmp.replace(self.file)
        pids = self.state_dir / "pids"
        pids.mkdir(exist_ok=True)
        for name, rec in state.processes.items():
            (pids / f"{name}.pid").write_text(f"{rec.pid}\n")

    def wipe(self) -> None:
        """A fresh, private state folder."""
        if self.state_dir.exists():
            shutil.rmtree(self.state_dir)
        self.state_dir.mkdir(parents=True)
        self.state_dir.chmod(0o700)
        for sub in ("logs", "pki", "etcd", "pids"):
            (self.state_dir / sub).mkdir(mode=0o700)

    def retire(self, state: RunState) -> None:
        """Mark the run as over: its records move to stopped.json."""
        (self.state_dir / "stopped.json").write_text(json.dumps(state.to_json(), indent=2) + "\n")
        self.file.unlink(missing_ok=True)
        shutil.rmtree(self.state_dir / "pids", ignore_errors=True)

    def records(self) -> list[procs.ProcessRecord]:
        """Records of the processes of the current run and of the last stopped one."""
        records: list[procs.ProcessRecord] = []
        for f in (self.file, self.state_dir / "stopped.json"):
            with contextlib.suppress(FileNotFoundError, ValueError, KeyError, TypeError):
                records += RunState.from_json(json.loads(f.read_text())).processes.values()
        return records
