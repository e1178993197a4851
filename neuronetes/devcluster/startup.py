"""Bringing one run of a dev cluster up, in order.

etcd → kube-apiserver (then the admin and kube-scheduler kubeconfigs; TLS verified from here on)
→ kube-controller-manager, the cluster's default-scheduler and kwok → the CRDs (Established) and
the admission policies → the extender's identity and settings, the Lease role → each NeuroNetes
kube-scheduler + extender pair → every process healthy → the admission policies enforced (each
refuses its probe: `neuronetes.devcluster.policyprobe`).
`spawn_pairs` also restarts kube-scheduler with another extender on a running cluster.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from neuronetes.devcluster import components as cmd
from neuronetes.devcluster.access import (
    EXTENDER_SERVICE_ACCOUNT,
    FIELD_MANAGER,
    SCHEDULER_USER,
    generate_service_account_key,
    install_extender_identity,
    kubeconfig,
    scheduler_lease_access,
    static_tokens,
    write_private,
)
from neuronetes.devcluster.addons import start_addons
from neuronetes.devcluster.api import Api, http_ok
from neuronetes.devcluster.chartmode import egress_flags, start_runner
from neuronetes.devcluster.config import (
    BUILTIN_EXTENDER_WEIGHT,
    DEV_LEADER_ELECTION,
    ExtenderConfig,
    default_scheduler_config,
    extender_settings,
    scheduler_config,
)
from neuronetes.devcluster.policyprobe import policy_names, probes_for, wait_enforced
from neuronetes.devcluster.state import ClusterError, RunState
from neuronetes.devcluster.status import probes
from neuronetes.devcluster.supervisor import Supervisor

__all__ = ["Kubectl", "Startup", "apply_crds", "apply_manifests"]

Kubectl = Callable[..., subprocess.CompletedProcess[str]]


def apply_manifests(kubectl: Kubectl, folder: Path, log: Callable[[str], None]) -> list[Path]:
    """Server-side apply every YAML file in `folder` (not its subfolders)."""
    files = sorted(p for p in folder.glob("*") if p.suffix in (".yaml", ".yml") and p.is_file())
    if not files:
        return []
    log(f"applying {len(files)} file(s) from {folder}")
    args = ["apply", "--server-side", "--force-conflicts", f"--field-manager={FIELD_MANAGER}"]
    for f in files:
        args += ["-f", str(f)]
    kubectl(*args)
    return files


def apply_crds(kubectl: Kubectl, folder: Path, log: Callable[[str], None], *, timeout_s: float) -> list[Path]:
    """`apply_manifests`, then wait until every CRD is Established."""
    files = apply_manifests(kubectl, folder, log)
    if files:
        kubectl("wait", "--for=condition=Established", "crd", "--all", f"--timeout={int(timeout_s)}s")
    return files


class Startup:
    def __init__(
        self, sup: Supervisor, at: cmd.Layout, state: RunState, log: Callable[[str], None], kubectl: Kubectl
    ) -> None:
        self.sup = sup
        self.at = at
        self.state = state
        self.log = log
        self.kubectl = kubectl

    def run(
        self,
        extender: ExtenderConfig | None,
        overrides: dict[str, Any],
        crds_dir: Path | None,
        policies_dir: Path | None,
        apiserver_args: Sequence[str],
        deadline: float,
    ) -> None:
        at, state = self.at, self.state
        token = secrets.token_urlsafe(32)
        write_private(at.state_dir / "token", token + "\n")
        scheduler_token = secrets.token_urlsafe(32)
        write_private(at.pki / "tokens.csv", static_tokens(token, scheduler_token))
        generate_service_account_key(at.pki / "sa.key", at.pki / "sa.pub")
        self.sup.store.save(state)
        probe = probes(state, token)

        self.log(f"etcd {state.versions['etcd']} on 127.0.0.1:{state.ports['etcd']}")
        self.sup.spawn(state, "etcd", cmd.etcd_argv(at))
        self.sup.wait(state, "etcd", probe["etcd"], deadline)
        self.log(f"kube-apiserver {state.versions['kubernetes']} on {at.server}")
        if state.chart is not None:
            apiserver_args = [*apiserver_args, *egress_flags(at)]
        self.sup.spawn(
            state,
            "kube-apiserver",
            cmd.apiserver_argv(at, feature_gates=state.feature_gates, extra=apiserver_args),
        )

        def api_ready() -> tuple[bool, str]:
            return probe["kube-apiserver"]() if at.ca_file.exists() else (False, "no serving certificate yet")

        self.sup.wait(state, "kube-apiserver", api_ready, deadline)
        ca_pem = at.ca_file.read_bytes()
        write_private(
            at.kubeconfig,
            json.dumps(kubeconfig(name=at.name, server=at.server, ca_pem=ca_pem, token=token), indent=2)
            + "\n",
        )
        doc = kubeconfig(
            name=at.name, server=at.server, ca_pem=ca_pem, token=scheduler_token, user=SCHEDULER_USER
        )
        write_private(at.scheduler_kubeconfig, json.dumps(doc, indent=2) + "\n")
        # From here on, verify the API server against its certificate.
        api = Api(at.server, token, at.ca_file)
        ok, detail = http_ok(f"{at.server}/readyz", context=api.context, token=token)
        if not ok:
            raise ClusterError(f"the API server's certificate does not verify: {detail}")
        if state.controller_manager:
            self.log(f"kube-controller-manager on 127.0.0.1:{state.ports['controller_manager']}")
            self.sup.spawn(state, "kube-controller-manager", cmd.controller_manager_argv(at))
        self.log(f"default-scheduler on 127.0.0.1:{state.ports['default_scheduler']}")
        at.default_scheduler_config.write_text(
            json.dumps(default_scheduler_config(at.scheduler_kubeconfig), indent=2) + "\n"
        )
        self.sup.spawn(
            state, "default-scheduler", cmd.default_scheduler_argv(at, feature_gates=state.feature_gates)
        )
        self.log(f"kwok {state.versions['kwok']}")
        self.sup.spawn(state, "kwok", cmd.kwok_argv(at))
        if crds_dir is not None:
            apply_crds(self.kubectl, crds_dir, self.log, timeout_s=max(5.0, deadline - time.monotonic()))
        policies: list[str] = []
        if policies_dir is not None:
            apply_manifests(self.kubectl, policies_dir, self.log)
            policies = policy_names(policies_dir)
        if state.chart is None:
            # The identity exists even when the cluster runs no extender: an extender started by hand
            # or by a test uses extender.kubeconfig (the admission policies trust no one else).
            install_extender_identity(api, at.extender_kubeconfig, cluster=at.name, ca_pem=ca_pem)
            for obj in scheduler_lease_access(DEV_LEADER_ELECTION.name):
                api.apply(obj, field_manager=FIELD_MANAGER)
        if state.run_extender:
            at.extender_settings.write_text(json.dumps(extender_settings(**overrides), indent=2) + "\n")
        self.spawn_pairs(extender)
        for name in [n for n in state.processes if n in probe and n not in ("etcd", "kube-apiserver")]:
            self.sup.wait(state, name, probe[name], deadline)
        start_addons(self.sup, state, at, self.kubectl, self.log, deadline)
        # Up means the policies are enforced: the API server loads them a while after they are
        # created (neuronetes.devcluster.policyprobe). Checked last, so that wait overlaps the rest.
        wait_enforced(
            self.kubectl, probes_for(policies), timeout_s=max(5.0, deadline - time.monotonic()), log=self.log
        )
        if state.chart is not None:
            # Chart mode: the release installs NeuroNetes and its identities; this runs its pods.
            self.log("chart runner (the chart's pods as host processes)")
            start_runner(self.sup, state, at)

    def spawn_pairs(self, extender: ExtenderConfig | None) -> None:
        """Each pair's extender (when the cluster runs it), then its kube-scheduler."""
        at, state = self.at, self.state
        count = state.schedulers
        election = DEV_LEADER_ELECTION if count > 1 else None
        urls: list[str | None] = [*state.extender_urls()] or [None] * count
        for i, ((scheduler, ext_name, sfx), url) in enumerate(zip(state.pairs(), urls, strict=True)):
            entry = extender
            if state.run_extender and url is not None:
                self.log(f"{ext_name} on {url} (as ServiceAccount {EXTENDER_SERVICE_ACCOUNT})")
                self.sup.spawn(state, ext_name, cmd.extender_argv(at, i, count))
                entry = ExtenderConfig(url=url, weight=BUILTIN_EXTENDER_WEIGHT)
            doc = scheduler_config(at.scheduler_kubeconfig, entry, leader_election=election)
            at.scheduler_config(i, count).write_text(json.dumps(doc, indent=2) + "\n")
            self.log(f"{scheduler} on 127.0.0.1:{at.ports['scheduler' + sfx]} (extender: {url or 'none'})")
            argv = cmd.scheduler_argv(at, i, count, feature_gates=state.feature_gates)
            self.sup.spawn(state, scheduler, argv)
