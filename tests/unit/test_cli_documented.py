"""Every command line README.md and docs/cli.md show parses: the commands, options and values
exist as written (parsed by the real click commands, nothing run). What each one does is tested
where its area is (docs/cli.md's table of commands; the cluster ones in tests/e2e)."""

from __future__ import annotations

import shlex

import click
import pytest

from neuronetes.cli.root import build_root

pytestmark = pytest.mark.unit

DOCUMENTED = [
    # README.md, "Workstation mode"
    "agent run --workstation --simulate-gpus 1",
    'submit --cmd "python train.py" --priority 1 --name train --checkpointable',
    'submit --cmd "python infer.py" --priority 10 --name infer',
    "status",
    "jobs describe train -o yaml",
    "watch --interval 1s",
    # README.md, "Local control plane", "Install with Helm", "Scheduler extender"
    "dev cluster up --nodes dgx-a100-80gb=4 --nodes t4x4-pcie=2",
    "dev cluster kubeconfig",
    "dev cluster status",
    "dev cluster down",
    "dev cluster up --no-install --nodes dgx-a100-80gb=2 --nodes a100-40gb-mig=1",
    "dev cluster up --direct --no-agent --no-operator --schedulers 2 --no-policies --no-crds "
    "--no-controller-manager --feature-gates A=true --runtime-config group/version=true --name other",
    "dev cluster up --nodes dgx-a100-80gb=4 --extender-url http://127.0.0.1:8888",
    "dev cluster up --no-extender",
    'extender serve --kubeconfig "$KUBECONFIG" --port 8888 --config extender.yaml',
    "extender serve --host 127.0.0.1 --port 8888 --config extender-settings.json "
    "--kubeconfig extender.kubeconfig",
    "extender serve --host 10.0.0.1 --tls-cert-file tls.crt --tls-private-key-file tls.key "
    "--client-ca-file ca.crt",
    "extender serve --host 10.0.0.1 --insecure-allow-remote --resync-period 300",
    "dev gpu-validate --fake --out out/gpu --only a,b --wheels wheels/",
    "demo --keep",
    "simulate --nodes NODES.csv --pods PODS.csv --policy fgd --seeds 42-51 --tune 1.3 --json OUT.json "
    "--compare DIR --plot OUT.png -o json",
    "simulate --nodes NODES.csv --pods PODS.csv --policy fgd,default --seeds 42,43,44 -o yaml",
    "simulate --from-cluster --kubeconfig FILE --save-trace DIR --policy fgd,default",
    # docs/cli.md, "Commands"
    "top --nodes-only --kubeconfig FILE -o yaml",
    "explain my-namespace/my-pod",
    "explain my-pod -n my-namespace -o json",
    "status --all -o json",
    "health --gpu-id GPU-3f2a1b0c",
    "health --gpu-id 0",
    "drain --gpu-id GPU-3f2a1b0c",
    "offline --gpu-id GPU-3f2a1b0c --force",
    "online --gpu-id GPU-3f2a1b0c",
    "jobs list --all",
    *(f"jobs {verb} train" for verb in ("describe", "cancel", "kill", "logs")),
    "cancel j1",
    "watch",
    "dev inject-xid --gpu-id GPU-3f2a1b0c --xid 48",
    "dev inject-temperature --gpu-id 0 --celsius 90",
    "dev inject-ecc --gpu-id 0 --corrected 2 --uncorrected 1",
    "operator run",
    "webhook serve --cert-dir certs",  # its serving certificate is required
]


def _parse(argv: list[str]) -> click.Context:
    """The context of the leaf command `argv` names, its arguments parsed as click parses them."""
    root = build_root()
    command: click.Command = root
    path = ["neuronetes"]
    while isinstance(command, click.Group) and argv and argv[0] in command.commands:
        path.append(argv[0])
        command = command.commands[argv.pop(0)]
    return command.make_context(" ".join(path), argv)


@pytest.mark.parametrize("line", DOCUMENTED)
def test_a_documented_command_line_parses(line: str) -> None:
    ctx = _parse(shlex.split(line))
    assert isinstance(ctx.command, click.Command) and not isinstance(ctx.command, click.Group)
    assert not ctx.args  # nothing left over that the command would not take


def test_the_table_of_commands_in_docs_cli_is_the_cli() -> None:
    """docs/cli.md's "Commands" table names every top-level command, and nothing else."""
    root = build_root()
    assert set(root.commands) == {
        "top", "explain", "status", "health", "drain", "offline", "online", "submit", "jobs",
        "cancel", "watch", "simulate", "dev", "demo", "extender", "operator", "webhook", "agent",
    }  # fmt: skip
    dev = root.commands["dev"]
    assert isinstance(dev, click.Group) and set(dev.commands) >= {
        "cluster", "inject-xid", "inject-temperature", "inject-ecc", "gpu-validate",
    }  # fmt: skip
