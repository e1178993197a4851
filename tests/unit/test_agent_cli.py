"""The agent's CLI verbs refuse bad input with one line, never a traceback."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from neuronetes.cli import main

pytestmark = pytest.mark.unit


def unreachable_kubeconfig(tmp_path: Path) -> Path:
    """A kubeconfig naming an API server nobody listens on (nothing here contacts it)."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\n"
        'clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]\n'
        "users: [{name: u, user: {token: x}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\ncurrent-context: c\n"
    )
    return kubeconfig


@pytest.mark.parametrize(
    ("argv", "status"),
    [
        (["online", "--gpu-id", "GPU-x", "--kubeconfig", "/nonexistent/kubeconfig"], 1),
        (["offline", "--force", "--gpu-id", "GPU-x", "--kubeconfig", "/nonexistent/kubeconfig"], 1),
        (
            [
                "dev",
                "inject-xid",
                "--gpu-id",
                "GPU-x",
                "--xid",
                "48",
                "--kubeconfig",
                "/nonexistent/kubeconfig",
            ],
            1,
        ),
        # a value the command line got wrong is a usage error (docs/cli.md, "Errors and exit codes")
        (["dev", "inject-xid", "--gpu-id", "GPU-x", "--xid", "0"], 2),
        (["dev", "inject-ecc", "--gpu-id", "GPU-x"], 2),
        (["agent", "run", "--node", "n1", "--kubeconfig", "/nonexistent/kubeconfig"], 1),
    ],
)
def test_one_line_errors(argv: list[str], status: int, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == status
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err


def test_agent_run_needs_exactly_one_target(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["agent", "run", "--node", "a", "--simulate-nodes", "x=y"]) == 2
    assert main(["agent", "run"]) == 2
    assert capsys.readouterr().err.count("error: give exactly one of --node and --simulate-nodes") == 2


def test_agent_on_a_node_without_nvml_exits_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass  # no NVML here: what this test is about
    else:
        pynvml.nvmlShutdown()
        pytest.skip("this machine has NVML")
    kubeconfig = unreachable_kubeconfig(tmp_path)
    argv = ["agent", "run", "--node", "n1", "--kubeconfig", str(kubeconfig), "--metrics-port", "-1"]
    assert main(argv) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: NVML is not available") and "\n" not in err


def test_reconciliation_flags_reach_the_agents_policy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from neuronetes_agent.daemon import fleet
    from neuronetes_agent.daemon.reconcile import Mode, Policy

    seen: list[Policy] = []

    class Recorder:
        def __init__(self, api: object, settings: fleet.AgentSettings, **kwargs: object) -> None:
            seen.append(settings.reconcile)
            self.agents: dict[str, object] = {}

        def run(self) -> None:
            pass

        def stop(self) -> None:
            pass

    monkeypatch.setattr(fleet, "AgentProcess", Recorder)
    kubeconfig = unreachable_kubeconfig(tmp_path)
    base = ["agent", "run", "--node", "n1", "--kubeconfig", str(kubeconfig), "--metrics-port", "-1"]
    assert main(base) == 0
    assert (
        main([*base, "--reconcile=report", "--reconcile-grace=5", "--reconcile-context-allowance=768"]) == 0
    )
    assert seen == [
        Policy(),
        Policy(mode=Mode.REPORT, grace_s=5.0, context_allowance_bytes=768 << 20, margin_bytes=64 << 20),
    ]
    assert seen[0] == Policy(mode=Mode.ENFORCE, grace_s=30.0, context_allowance_bytes=1 << 30)
    assert main([*base, "--reconcile=evict"]) == 2  # not a mode


def test_cluster_verbs_find_a_gpu_by_uuid_or_unique_prefix() -> None:
    from neuronetes_agent.daemon import commands

    a, b = "GPU-3f2a1b0c-0000", "GPU-3f2a9999-0001"

    class FakeKube:
        def request(self, method: str, path: str) -> dict[str, object]:
            gpunode = {"metadata": {"name": "n1"}, "status": {"gpus": [{"uuid": a}, {"uuid": b}]}}
            return {"items": [gpunode]}

    kube: Any = FakeKube()
    assert commands._find_gpunode(kube, "GPU-3f2a9")[1] == b
    assert commands._find_gpunode(kube, a)[0]["metadata"]["name"] == "n1"
    with pytest.raises(KeyError, match="is ambiguous: it starts GPU-3f2a1b0c-0000, GPU-3f2a9999-0001"):
        commands._find_gpunode(kube, "GPU-3f2a")
    with pytest.raises(KeyError, match="no GPUNode lists GPU 0"):
        commands._find_gpunode(kube, "0")  # an index names nothing across a cluster


def test_cluster_health_finds_a_gpu_by_unique_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    from neuronetes.cli.kube import Cluster
    from neuronetes.cli.output import CliError

    gpunode = {"metadata": {"name": "n1"}, "status": {"gpus": [{"uuid": "GPU-aa1"}, {"uuid": "GPU-ab2"}]}}
    monkeypatch.setattr(Cluster, "gpunodes", lambda self: [gpunode])
    cluster = Cluster.__new__(Cluster)  # no API server: only the GPUNodes above are read
    assert cluster.gpu("GPU-ab")[1] == {"uuid": "GPU-ab2"}
    with pytest.raises(CliError, match="'GPU-a' is ambiguous: it starts GPU-aa1, GPU-ab2"):
        cluster.gpu("GPU-a")
    with pytest.raises(CliError, match="no GPUNode lists GPU GPU-b"):
        cluster.gpu("GPU-b")
