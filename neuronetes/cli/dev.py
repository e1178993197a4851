"""``neuronetes dev``: the local control plane (``dev cluster``), the simulated-GPU fault injectors
(``dev inject-*``, served by a fleet agent or a workstation daemon) and ``neuronetes demo``."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import click

from . import workstation
from .options import GPU_ID, KUBECONFIG
from .output import CliError, emit, output_option, spinner
from .root import group

if TYPE_CHECKING:
    from neuronetes.devcluster import ClusterStatus, DevCluster

__all__ = ["demo", "dev", "feature_gates"]


def feature_gates(items: Sequence[str]) -> dict[str, bool]:
    """``["GenericWorkload=true,GangScheduling=true"]`` → ``{"GenericWorkload": True, ...}``."""
    gates: dict[str, bool] = {}
    for item in ",".join(items).split(","):
        if not item.strip():
            continue
        name, sep, value = item.partition("=")
        if not sep or value.strip().lower() not in ("true", "false") or not name.strip():
            raise ValueError(f"--feature-gates {item!r}: use NAME=true or NAME=false")
        gates[name.strip()] = value.strip().lower() == "true"
    return gates


@group("dev", help="Development tools: a local control plane, faults on simulated GPUs.")
def dev() -> None:
    pass


def _cluster_errors() -> tuple[type[BaseException], ...]:
    from neuronetes.devcluster import BuildError, ClusterError, KubectlError

    return (BuildError, ClusterError, KubectlError, OSError, RuntimeError)


def _up(opts: dict[str, Any], cluster: DevCluster, log: Callable[[str], None]) -> None:
    from neuronetes.devcluster import POLICIES_DIR, ExtenderConfig, parse_node_counts
    from neuronetes.devcluster.tools import REPO_ROOT

    try:
        nodes = parse_node_counts(opts["nodes"])
        gates = feature_gates(opts["feature_gates"])
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    url = (
        opts["extender_url"]
        if opts["extender_url"] is not None
        else os.environ.get("NEURONETES_EXTENDER_URL")
    )
    external = ExtenderConfig.from_url(url)
    crds = opts["crds"]
    apiserver_args = [f"--runtime-config={opts['runtime_config']}"] if opts["runtime_config"] else []
    shaping = ("no_extender", "no_agent", "no_operator", "no_policies", "no_controller_manager", "crds")
    direct = opts["direct"] or url is not None or opts["schedulers"] != 1 or opts["no_crds"]
    if not direct and not any(opts[k] for k in shaping):
        from neuronetes.devcluster.chartmode import LOCAL_VALUES, ChartRelease
        from neuronetes.devcluster.realchart import REAL_NODE_VALUES

        # Real nodes: GPU nodes where the agent DaemonSet runs as real containers (realchart).
        values = (LOCAL_VALUES, REAL_NODE_VALUES) if opts["real_nodes"] else (LOCAL_VALUES,)
        seconds = cluster.up(
            nodes=nodes,
            feature_gates=gates,
            apiserver_args=apiserver_args,
            auto_build=opts["build"],
            chart=ChartRelease(values=values),
            install_chart=not opts["no_install"],
            real_nodes=opts["real_nodes"],
        )
        what = "helm install it yourself" if opts["no_install"] else "chart installed"
        log(f"cluster {cluster.name!r} up in {seconds:.1f} s ({what}); logs in {cluster.log_dir}")
        return
    seconds = cluster.up(
        nodes=nodes,
        extender=external,
        run_extender=external is None and not opts["no_extender"],
        run_agent=not opts["no_agent"],
        run_operator=not opts["no_operator"],
        schedulers=opts["schedulers"],
        feature_gates=gates,
        controller_manager=False if opts["no_controller_manager"] else None,
        crds_dir=None if opts["no_crds"] else Path(crds) if crds else REPO_ROOT / "crds",
        policies_dir=None if opts["no_policies"] else POLICIES_DIR,
        apiserver_args=apiserver_args,
        auto_build=opts["build"],
        real_nodes=opts["real_nodes"],
    )
    log(f"cluster {cluster.name!r} up in {seconds:.1f} s; logs in {cluster.log_dir}")


def status_document(st: ClusterStatus) -> dict[str, Any]:
    return {
        "name": st.name,
        "up": st.up,
        "stateDir": str(st.state_dir),
        "kubeconfig": str(st.kubeconfig) if st.kubeconfig else None,
        "server": st.server,
        "versions": st.versions,
        "apiHealthy": st.api_healthy,
        "apiVersion": st.api_version,
        "nodes": st.nodes,
        "extenderURLs": list(st.extender_urls),
        "chartRelease": st.chart_release,
        "components": [
            {
                "name": c.name,
                "pid": c.pid,
                "running": c.running,
                "healthy": c.healthy,
                "detail": c.detail,
                **({"leader": c.leader} if c.leader is not None else {}),
            }
            for c in st.components
        ],
    }


def _status(cluster: DevCluster, output: str) -> int:
    st = cluster.status()
    if output != "table":
        emit(output, status_document(st))
    elif not st.components:
        click.echo(f"cluster {st.name!r}: not running (state {st.state_dir})")
    else:
        click.echo(
            f"cluster {st.name!r}: {'up' if st.up else 'DEGRADED'}  server {st.server}  api {st.api_version}"
        )
        extenders = ", ".join(dict.fromkeys(st.extender_urls)) or "none"
        if st.chart_release is not None:  # the chart's gpu-scheduler pods run it, not the cluster
            extenders = f"{extenders} (release {st.chart_release}'s gpu-scheduler)"
        click.echo(f"  kubeconfig {st.kubeconfig}  nodes {st.nodes}  extender {extenders}")
        rows = []
        for c in st.components:
            health = "healthy" if c.healthy else ("-" if c.healthy is None else f"unhealthy ({c.detail})")
            role = "-" if c.leader is None else ("leader" if c.leader else "standby")
            rows.append([c.name, c.pid, "running" if c.running else "STOPPED", health, role])
        emit(output, None, columns=["COMPONENT", "PID", "STATE", "HEALTH", "ROLE"], rows=rows)
    return 0 if st.up or not st.components else 1


@dev.command(
    "cluster",
    help="A local control plane with simulated GPU nodes: etcd, kube-apiserver, kube-controller-manager, "
    "kube-scheduler and kwok on loopback (binaries built by hack/build-control-plane.sh), NeuroNetes "
    "installed by its Helm chart (--direct: as the cluster's own processes); state in "
    "~/.cache/neuronetes/clusters/NAME.",
)
@click.argument("action", type=click.Choice(["up", "down", "status", "kubeconfig"]))
@click.option("--name", default="dev", show_default=True, help="cluster name")
@click.option(
    "--nodes",
    multiple=True,
    metavar="PROFILE=COUNT",
    help="up: simulated GPU nodes of a profile (repeatable), e.g. dgx-a100-80gb=4",
)
@click.option(
    "--extender-url",
    help="up: an external extender's URL prefix instead of the one the cluster runs "
    "(default: $NEURONETES_EXTENDER_URL)",
)
@click.option(
    "--direct",
    is_flag=True,
    help="up: run NeuroNetes as the cluster's own processes instead of installing helm/neuronetes "
    "(implied by the flags that shape them: --extender-url, --no-*, --schedulers, --crds)",
)
@click.option(
    "--no-install",
    is_flag=True,
    help="up: run the chart's pods but leave `helm install` to you (README: Install with Helm)",
)
@click.option("--no-extender", is_flag=True, help="up: kube-scheduler without an extender")
@click.option("--no-agent", is_flag=True, help="up: no node agent (fleet mode) for the simulated nodes")
@click.option("--no-operator", is_flag=True, help="up: no operator and admission webhook")
@click.option(
    "--schedulers",
    type=click.IntRange(min=1),
    default=1,
    metavar="N",
    help="up: N kube-scheduler + extender pairs with leader election (default: 1, no election)",
)
@click.option(
    "--feature-gates",
    multiple=True,
    metavar="NAME=BOOL,...",
    help="up: feature gates of kube-apiserver and kube-scheduler (repeatable)",
)
@click.option(
    "--runtime-config",
    metavar="GROUP/VERSION=true,...",
    help="up: kube-apiserver's --runtime-config (alpha APIs, e.g. scheduling.k8s.io/v1alpha2=true)",
)
@click.option("--no-policies", is_flag=True, help="up: do not apply manifests/policies/")
@click.option("--no-controller-manager", is_flag=True, help="up: run without it")
@click.option("--crds", help="up: folder of CRD YAML to apply (default: the checkout's crds/)")
@click.option("--no-crds", is_flag=True, help="up: do not apply crds/")
@click.option(
    "--real-nodes",
    type=click.IntRange(min=0),
    default=0,
    metavar="N",
    help="up: N real nodes real-0… (kubelet + containerd + runc on this machine; root; in chart mode "
    "GPU nodes running the chart's agent from hack/build-image.sh's image; "
    "docs/dev-cluster.md)",
)
@click.option("--build", is_flag=True, help="up: build missing binaries first (shows progress)")
@click.option("--json", "as_json", is_flag=True, help="status: print JSON (same as -o json)")
@output_option
def cluster_cmd(action: str, name: str, as_json: bool, output: str, **opts: Any) -> int:
    # Imported here: `simulate` needs none of it.
    from neuronetes.devcluster import DevCluster
    from neuronetes.devcluster.cluster import check_name

    try:
        check_name(name)
    except ValueError as exc:  # the command line's: a usage error
        raise click.BadParameter(str(exc), param_hint="--name") from None
    if action == "up":
        with spinner(f"starting cluster {name!r}") as log:
            cluster = DevCluster(name, log=log)
            try:
                _up(opts, cluster, log)
            except _cluster_errors() as exc:
                raise CliError(str(exc)) from None
        click.echo(str(cluster.kubeconfig))  # after the spinner: stdout is the one result
        return 0

    def log_line(msg: str) -> None:
        click.echo(f">> {msg}", err=True)

    cluster = DevCluster(name, log=log_line)
    if action == "down":
        stopped = cluster.down()
        log_line(f"cluster {name!r}: stopped {', '.join(stopped) if stopped else 'nothing (not running)'}")
        return 0
    if action == "kubeconfig":
        if not cluster.kubeconfig.exists():
            raise CliError(f"cluster {name!r} has no kubeconfig (is it up?)")
        click.echo(str(cluster.kubeconfig))
        return 0
    return _status(cluster, "json" if as_json else output)


# ---- fault injection on simulated GPUs (the agent's verbs) ----------------------------------------------


def _inject(verb: str, gpu_id: str, kubeconfig: str | None, state_dir: str | None, **fields: Any) -> int:
    """One fault on a simulated GPU, wherever the target rule points (docs/workstation.md, "CLI"):
    a workstation daemon on the simulated backend, else a fleet agent through the cluster."""
    from neuronetes_agent.daemon.commands import cmd_inject, fault_order  # the agent's: only when run

    ns = argparse.Namespace(dev_command=verb, gpu_id=gpu_id, kubeconfig=kubeconfig, **fields)
    target = workstation.target_state_dir(state_dir, kubeconfig)
    if target is None:
        return cmd_inject(ns)
    from neuronetes_agent.workstation.protocol import Simulate

    try:
        fault = fault_order(ns)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    out = workstation.call(target, Simulate(gpu=gpu_id, fault=fault))
    click.echo(f"{out['gpu']}: {out['message']}")
    return 0


_SERVED_BY: Final = "served by a fleet agent or a workstation daemon's simulated backend; docs/gpu-health.md"


@dev.command("inject-xid", help=f"Report an XID on a simulated GPU ({_SERVED_BY}).")
@GPU_ID
@KUBECONFIG
@workstation.STATE_DIR
@click.option("--xid", type=click.IntRange(1, 999), required=True, help="the XID (1-999)")
def inject_xid(gpu_id: str, kubeconfig: str | None, state_dir: str | None, xid: int) -> int:
    return _inject("inject-xid", gpu_id, kubeconfig, state_dir, xid=xid)


@dev.command("inject-temperature", help=f"Set a simulated GPU's temperature ({_SERVED_BY}).")
@GPU_ID
@KUBECONFIG
@workstation.STATE_DIR
@click.option("--celsius", type=float, required=True)
def inject_temperature(gpu_id: str, kubeconfig: str | None, state_dir: str | None, celsius: float) -> int:
    return _inject("inject-temperature", gpu_id, kubeconfig, state_dir, celsius=celsius)


@dev.command("inject-ecc", help=f"Add ECC errors to a simulated GPU ({_SERVED_BY}).")
@GPU_ID
@KUBECONFIG
@workstation.STATE_DIR
@click.option("--corrected", type=click.IntRange(min=0), default=0)
@click.option("--uncorrected", type=click.IntRange(min=0), default=0)
def inject_ecc(
    gpu_id: str, kubeconfig: str | None, state_dir: str | None, corrected: int, uncorrected: int
) -> int:
    if not (corrected or uncorrected):
        raise click.UsageError("give --corrected and/or --uncorrected as positive counts")
    return _inject("inject-ecc", gpu_id, kubeconfig, state_dir, corrected=corrected, uncorrected=uncorrected)


# ---- GPU validation ---------------------------------------------------------------------------------


@dev.command(
    "gpu-validate",
    short_help="Prove the GPU-facing parts on this machine's NVIDIA GPU (or --fake).",
    help="Build the CUDA shim against this machine's CUDA headers and run every GPU check (NVML "
    "discovery, the exporter, the shim's memory limits and compute pacing, workstation preemption by "
    "checkpoint); write gpu-validate.json and a table to --out (docs/gpu-validation.md). The same as "
    "hack/gpu-validate.sh; needs a source checkout.",
)
@click.option("--fake", is_flag=True, help="no GPU: run over the fake driver and the simulated backend")
@click.option(
    "--out", "out", default=None, metavar="DIR", help="output folder (default $OUT, else out/gpu-validate)"
)
@click.option("--only", default=None, metavar="ID,ID", help="only these checks (ids of the check table)")
@click.option("--wheels", default=None, metavar="DIR", help="wheels to install for the run (offline)")
def gpu_validate(fake: bool, out: str | None, only: str | None, wheels: str | None) -> int:
    import subprocess

    from neuronetes.devcluster.tools import REPO_ROOT

    script = REPO_ROOT / "hack" / "gpu-validate.sh"
    if not script.is_file():
        raise CliError(f"gpu-validate needs a source checkout: {script} not found")
    argv = ["bash", str(script), *(["--fake"] if fake else [])]
    for flag, value in (("--out", out), ("--only", only), ("--wheels", wheels)):
        if value:
            argv += [flag, value]
    return subprocess.call(argv)


# ---- demo ------------------------------------------------------------------------------------------


@click.command(
    "demo",
    short_help="Sample pods on a fresh local cluster, and where each landed.",
    help="Start the local control plane with a few dozen simulated GPU nodes and the extender beside "
    "kube-scheduler, submit sample pods (whole GPUs, NVLink, shared slices, MIG, a gang, one that fits "
    "nowhere) and print where each landed and why, read from the API.",
)
@click.option("--name", default="demo", show_default=True, help="cluster name")
@click.option("--keep", is_flag=True, help="leave the cluster running afterwards")
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=180.0,
    show_default=True,
    help="seconds to wait for the pods",
)
def demo(name: str, keep: bool, timeout: float) -> int:
    from neuronetes.devcluster.demo import run_demo

    try:
        return run_demo(name=name, keep=keep, timeout=timeout)
    except _cluster_errors() as exc:
        raise CliError(str(exc)) from None
