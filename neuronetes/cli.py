"""The `neuronetes` command line."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from neuronetes.engine.policy import POLICIES
from neuronetes.model import NodeSpec, PodRequest
from neuronetes.sim import report
from neuronetes.sim.simulate import RunResult, parse_seeds, simulate, summarise
from neuronetes.sim.trace import TraceError, load_nodes, load_pods

if TYPE_CHECKING:
    from neuronetes.devcluster import DevCluster


def _run_one(args: tuple[Sequence[NodeSpec], Sequence[PodRequest], str, int, float]) -> RunResult:
    nodes, pods, policy, seed, tune = args
    return simulate(nodes, pods, policy, seed, tune)


def cmd_simulate(ns: argparse.Namespace) -> int:
    policies = [p.strip() for p in ns.policy.split(",") if p.strip()]
    for p in policies:
        if p not in POLICIES:
            print(f"error: unknown policy {p!r}; choose from {', '.join(POLICIES)}", file=sys.stderr)
            return 2
    try:
        seeds = parse_seeds(ns.seeds)
        nodes = load_nodes(ns.nodes)
        pods = load_pods(ns.pods)
    except (OSError, TraceError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    trace = Path(ns.pods).stem
    jobs = [(nodes, pods, p, s, ns.tune) for p in policies for s in seeds]
    workers = max(1, min(ns.workers or os.cpu_count() or 1, len(jobs)))
    if workers == 1:
        done = [_run_one(j) for j in jobs]
    else:
        with ProcessPoolExecutor(workers) as pool:
            done = list(pool.map(_run_one, jobs))
    results: dict[str, list[RunResult]] = {p: [] for p in policies}
    for (_, _, p, _, _), r in zip(jobs, done, strict=True):
        results[p].append(r)
        if ns.verbose:
            print(
                f"{p:<11} seed {r.seed}: {r.seconds:6.1f}s  unallocated@100% {r.unallocated(100):6.2f}",
                file=sys.stderr,
            )
    expected = report.load_expected(ns.compare, trace) if ns.compare else None
    print(report.table(trace, results, expected))
    for p, runs in results.items():
        secs = [r.seconds for r in runs]
        print(f"{p}: {len(runs)} seed(s), {min(secs):.1f}–{max(secs):.1f} s per seed")
    if ns.json:
        summaries = [summarise(trace, p, runs) for p, runs in results.items()]
        Path(ns.json).parent.mkdir(parents=True, exist_ok=True)
        Path(ns.json).write_text(
            json.dumps(summaries[0] if len(summaries) == 1 else summaries, indent=2) + "\n"
        )
    if ns.plot:
        Path(ns.plot).parent.mkdir(parents=True, exist_ok=True)
        report.plot(ns.plot, trace, results, expected)
    return 0


def _feature_gates(items: Sequence[str]) -> dict[str, bool]:
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


def _dev_cluster_up(ns: argparse.Namespace, cluster: DevCluster, log: Callable[[str], None]) -> int:
    from neuronetes.devcluster import POLICIES_DIR, ExtenderConfig, parse_node_counts
    from neuronetes.devcluster.tools import REPO_ROOT

    try:
        nodes = parse_node_counts(ns.nodes or [])
        gates = _feature_gates(ns.feature_gates or [])
        if ns.schedulers < 1:
            raise ValueError("--schedulers: at least 1")
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    url = ns.extender_url if ns.extender_url is not None else os.environ.get("NEURONETES_EXTENDER_URL")
    external = ExtenderConfig.from_url(url)
    shaped = (url, ns.no_extender, ns.no_agent, ns.no_operator, ns.schedulers != 1, ns.crds, ns.no_crds)
    if not ns.direct and not any(shaped) and not ns.no_policies and not ns.no_controller_manager:
        from neuronetes.devcluster.chartmode import ChartRelease

        seconds = cluster.up(
            nodes=nodes,
            feature_gates=gates,
            apiserver_args=[f"--runtime-config={ns.runtime_config}"] if ns.runtime_config else [],
            auto_build=ns.build,
            chart=ChartRelease(),
            install_chart=not ns.no_install,
        )
        what = "helm install it yourself" if ns.no_install else "chart installed"
        log(f"cluster {ns.name!r} up in {seconds:.1f} s ({what}); logs in {cluster.log_dir}")
        print(cluster.kubeconfig)
        return 0
    seconds = cluster.up(
        nodes=nodes,
        extender=external,
        run_extender=external is None and not ns.no_extender,
        run_agent=not ns.no_agent,
        run_operator=not ns.no_operator,
        schedulers=ns.schedulers,
        feature_gates=gates,
        controller_manager=False if ns.no_controller_manager else None,
        crds_dir=None if ns.no_crds else Path(ns.crds) if ns.crds else REPO_ROOT / "crds",
        policies_dir=None if ns.no_policies else POLICIES_DIR,
        apiserver_args=[f"--runtime-config={ns.runtime_config}"] if ns.runtime_config else [],
        auto_build=ns.build,
    )
    log(f"cluster {ns.name!r} up in {seconds:.1f} s; logs in {cluster.log_dir}")
    print(cluster.kubeconfig)
    return 0


def _dev_cluster_status(ns: argparse.Namespace, cluster: DevCluster) -> int:
    st = cluster.status()
    if ns.json:
        doc = {
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
        print(json.dumps(doc, indent=2))
    elif not st.components:
        print(f"cluster {st.name!r}: not running (state {st.state_dir})")
    else:
        print(
            f"cluster {st.name!r}: {'up' if st.up else 'DEGRADED'}  server {st.server}  api {st.api_version}"
        )
        extenders = ", ".join(dict.fromkeys(st.extender_urls)) or "none"
        print(f"  kubeconfig {st.kubeconfig}  nodes {st.nodes}  extender {extenders}")
        for c in st.components:
            health = "healthy" if c.healthy else ("-" if c.healthy is None else f"unhealthy ({c.detail})")
            role = "" if c.leader is None else ("  leader" if c.leader else "  standby")
            print(f"  {c.name:<24} pid {c.pid:<8} {'running' if c.running else 'STOPPED':<8} {health}{role}")
    return 0 if st.up or not st.components else 1


def cmd_dev_cluster(ns: argparse.Namespace) -> int:
    # Imported here: `simulate` needs none of it.
    from neuronetes.devcluster import BuildError, ClusterError, DevCluster, KubectlError

    def log(msg: str) -> None:
        print(f">> {msg}", file=sys.stderr)

    cluster = DevCluster(ns.name, log=log)
    if ns.action == "up":
        try:
            return _dev_cluster_up(ns, cluster, log)
        except (BuildError, ClusterError, KubectlError, OSError, RuntimeError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
    if ns.action == "down":
        stopped = cluster.down()
        log(f"cluster {ns.name!r}: stopped {', '.join(stopped) if stopped else 'nothing (not running)'}")
        return 0
    if ns.action == "kubeconfig":
        if not cluster.kubeconfig.exists():
            print(f"error: cluster {ns.name!r} has no kubeconfig (is it up?)", file=sys.stderr)
            return 1
        print(cluster.kubeconfig)
        return 0
    return _dev_cluster_status(ns, cluster)


def cmd_extender(ns: argparse.Namespace) -> int:
    # Imported here: the HTTP stack is only the extender's. (Through importlib: the extender lives
    # in extender/, mapped to neuronetes.extender at install time, which mypy cannot follow.)
    server = importlib.import_module("neuronetes.extender.server")
    return int(server.serve(ns))


def cmd_demo(ns: argparse.Namespace) -> int:
    from neuronetes.devcluster import BuildError, ClusterError, KubectlError
    from neuronetes.devcluster.demo import run_demo

    try:
        return run_demo(name=ns.name, keep=ns.keep, timeout=ns.timeout)
    except (BuildError, ClusterError, KubectlError, OSError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


def add_agent_commands_to(sub: Any, dev: Any) -> None:
    """The node agent's verbs (``agent run``, ``drain``/``offline``/``online``, ``dev inject-*``).
    Through importlib: node-agent/ is mapped to neuronetes.agent at install time."""
    importlib.import_module("neuronetes.agent.daemon.commands").add_agent_commands(sub, dev)


def cmd_operator(ns: argparse.Namespace) -> int:
    # Through importlib: operator/ is installed as neuronetes.operator, which mypy cannot follow.
    main_module = importlib.import_module("neuronetes.operator.main")
    return int(main_module.operator_run(ns))


def cmd_webhook(ns: argparse.Namespace) -> int:
    main_module = importlib.import_module("neuronetes.operator.main")
    return int(main_module.webhook_serve(ns))


def add_operator_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    op = sub.add_parser("operator", help="the AgentPool/GPUSlice/ToolBinding operator").add_subparsers(
        dest="operator_command", required=True
    )
    run = op.add_parser(
        "run",
        help="reconcile AgentPools (one replica)",
        description="The NeuroNetes operator (kopf): AgentPool -> pods, status, events. Run one replica.",
    )
    run.add_argument("--kubeconfig", help="kubeconfig (default: in-cluster)")
    run.add_argument("--config", help="settings file, YAML or JSON (default: built-in settings)")
    run.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    run.set_defaults(func=cmd_operator)


def add_webhook_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    wh = sub.add_parser("webhook", help="the admission webhook").add_subparsers(
        dest="webhook_command", required=True
    )
    serve = wh.add_parser(
        "serve",
        help="serve pod and NeuroNetes-object admission over HTTPS",
        description="The NeuroNetes admission webhook: refuses what no GPU could satisfy, sets the "
        "scheduler name. Run two or more replicas; they may share --port on one host (SO_REUSEPORT).",
    )
    serve.add_argument("--host", default="127.0.0.1", help="listen address (default: 127.0.0.1)")
    serve.add_argument("--port", type=int, default=9443, help="listen port (default: 9443)")
    serve.add_argument("--cert-dir", required=True, help="folder with tls.crt and tls.key")
    serve.add_argument(
        "--trusted-user",
        action="append",
        help="user allowed to change neuronetes.io/* annotations of existing pods (repeatable)",
    )
    serve.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    serve.set_defaults(func=cmd_webhook)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="neuronetes", description="NeuroNetes GPU scheduling")
    sub = parser.add_subparsers(dest="command", required=True)
    sim = sub.add_parser("simulate", help="replay a pod trace through the placement engine (FGD protocol)")
    sim.add_argument("--nodes", required=True, help="node list CSV (sn,cpu_milli,memory_mib,gpu,model)")
    sim.add_argument("--pods", required=True, help="pod list CSV (openb columns)")
    sim.add_argument("--policy", default="default", help=f"policy or comma list: {', '.join(POLICIES)}")
    sim.add_argument("--seeds", default="42-51", help="seeds, e.g. 42-51 or 42,43")
    sim.add_argument("--tune", type=float, default=1.3, help="inflate GPU requests to TUNE × capacity")
    sim.add_argument("--json", help="write results JSON here")
    sim.add_argument("--compare", help="folder with the paper's analysis_allo_discrete.csv")
    sim.add_argument("--plot", help="write an allocated-vs-arrived PNG here")
    sim.add_argument("--workers", type=int, default=0, help="processes (default: CPU count)")
    sim.add_argument("-v", "--verbose", action="store_true")
    sim.set_defaults(func=cmd_simulate)

    dev = sub.add_parser("dev", help="development tools").add_subparsers(dest="dev_command", required=True)
    dc = dev.add_parser(
        "cluster",
        help="a local control plane with simulated GPU nodes",
        description="Local etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok and the "
        "NeuroNetes extender on loopback (binaries built by hack/build-control-plane.sh); state in "
        "~/.cache/neuronetes/clusters/NAME.",
    )
    dc.add_argument("action", choices=["up", "down", "status", "kubeconfig"])
    dc.add_argument("--name", default="dev", help="cluster name (default: dev)")
    dc.add_argument(
        "--nodes",
        action="append",
        metavar="PROFILE=COUNT",
        help="up: simulated GPU nodes of a profile (repeatable), e.g. dgx-a100-80gb=4",
    )
    dc.add_argument(
        "--extender-url",
        help="up: an external extender's URL prefix instead of the one the cluster runs "
        "(default: $NEURONETES_EXTENDER_URL)",
    )
    dc.add_argument(
        "--direct",
        action="store_true",
        help="up: run NeuroNetes as the cluster's own processes instead of installing helm/neuronetes "
        "(implied by the flags that shape them: --extender-url, --no-*, --schedulers, --crds)",
    )
    dc.add_argument(
        "--no-install",
        action="store_true",
        help="up: run the chart's pods but leave `helm install` to you (README: Install with Helm)",
    )
    dc.add_argument("--no-extender", action="store_true", help="up: kube-scheduler without an extender")
    dc.add_argument(
        "--no-agent", action="store_true", help="up: no node agent (fleet mode) for the simulated nodes"
    )
    dc.add_argument("--no-operator", action="store_true", help="up: no operator and admission webhook")
    dc.add_argument(
        "--schedulers",
        type=int,
        default=1,
        metavar="N",
        help="up: N kube-scheduler + extender pairs with leader election (default: 1, no election)",
    )
    dc.add_argument(
        "--feature-gates",
        action="append",
        metavar="NAME=BOOL,...",
        help="up: feature gates of kube-apiserver and kube-scheduler (repeatable)",
    )
    dc.add_argument(
        "--runtime-config",
        metavar="GROUP/VERSION=true,...",
        help="up: kube-apiserver's --runtime-config (alpha APIs, e.g. scheduling.k8s.io/v1alpha2=true)",
    )
    dc.add_argument("--no-policies", action="store_true", help="up: do not apply manifests/policies/")
    dc.add_argument("--no-controller-manager", action="store_true", help="up: run without it")
    dc.add_argument("--crds", help="up: folder of CRD YAML to apply (default: the checkout's crds/)")
    dc.add_argument("--no-crds", action="store_true", help="up: do not apply crds/")
    dc.add_argument("--build", action="store_true", help="up: build missing binaries first")
    dc.add_argument("--json", action="store_true", help="status: print JSON")
    dc.set_defaults(func=cmd_dev_cluster)

    ext = sub.add_parser("extender", help="the kube-scheduler extender").add_subparsers(
        dest="extender_command", required=True
    )
    srv = ext.add_parser(
        "serve",
        help="serve filter/prioritize/bind/preempt for kube-scheduler",
        description="The NeuroNetes scheduler extender: one uvicorn worker, the GPU cache fed by list+watch.",
    )
    srv.add_argument("--kubeconfig", help="kubeconfig (default: in-cluster, else ~/.kube/config)")
    srv.add_argument(
        "--host",
        default="127.0.0.1",
        help="listen address (default: 127.0.0.1; any other needs client-certificate HTTPS "
        "or --insecure-allow-remote)",
    )
    srv.add_argument("--port", type=int, default=8888, help="listen port (default: 8888)")
    srv.add_argument("--tls-cert-file", help="serve HTTPS with this certificate (PEM)")
    srv.add_argument("--tls-private-key-file", help="the private key of --tls-cert-file (PEM)")
    srv.add_argument(
        "--client-ca-file",
        help="require client certificates signed by this CA (PEM): kube-scheduler's tlsConfig certificate",
    )
    srv.add_argument(
        "--insecure-allow-remote",
        action="store_true",
        help="listen on a non-loopback address without client certificates (only behind a network "
        "policy that lets nothing but kube-scheduler reach the port)",
    )
    srv.add_argument(
        "--config", help="settings file, JSON or YAML, hot-reloaded (default: built-in settings)"
    )
    srv.add_argument("--resync-period", type=float, default=600.0, help="seconds between full relists")
    srv.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    srv.set_defaults(func=cmd_extender)

    demo = sub.add_parser(
        "demo",
        help="local cluster + simulated GPU nodes + the extender; sample pods and where they landed",
        description=(
            "Start the local control plane with a few dozen simulated GPU nodes and the extender "
            "beside kube-scheduler, submit sample pods (whole GPUs, NVLink, shared slices, MIG, a "
            "gang, one that fits nowhere) and print where each landed and why, read from the API."
        ),
    )
    demo.add_argument("--name", default="demo", help="cluster name (default: demo)")
    demo.add_argument("--keep", action="store_true", help="leave the cluster running afterwards")
    demo.add_argument("--timeout", type=float, default=180.0, help="seconds to wait for the pods")
    demo.set_defaults(func=cmd_demo)
    add_agent_commands_to(sub, dev)

    add_operator_parser(sub)
    add_webhook_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    ns = build_parser().parse_args(argv)
    return int(ns.func(ns))


if __name__ == "__main__":
    raise SystemExit(main())
