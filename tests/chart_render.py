"""Rendering the chart ``helm/neuronetes`` with the pinned helm binary, for the chart's unit tests.

helm is one of the binaries `hack/build-control-plane.sh` builds (``Toolchain.helm``); without it
the chart tests skip, as the e2e tier does without the control plane (under CI the build fails the
run first).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from collections.abc import Iterable, Mapping
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from neuronetes.devcluster.tools import Toolchain

REPO_ROOT = Path(__file__).resolve().parents[1]
CHART = REPO_ROOT / "helm" / "neuronetes"
NAMESPACE = "neuronetes-system"
RELEASE = "neuronetes"


def helm_binary() -> Path:
    helm = Toolchain.pinned().helm
    if not helm.exists():
        pytest.skip(f"helm not built ({helm}): run hack/build-control-plane.sh")
    return helm


def helm(*args: str | Path, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run helm; its INFO lines about the chart's links (crds/, files/policies) are dropped."""
    done = subprocess.run(
        [str(helm_binary()), *map(str, args)], capture_output=True, text=True, timeout=120, check=False
    )
    stderr = "\n".join(line for line in done.stderr.splitlines() if not line.startswith("level=INFO"))
    if check and done.returncode != 0:
        raise AssertionError(f"helm {' '.join(map(str, args))} failed:\n{stderr}")
    return subprocess.CompletedProcess(done.args, done.returncode, done.stdout, stderr)


def template_args(
    values: Mapping[str, Any] | None = None,
    *,
    chart: Path = CHART,
    namespace: str = NAMESPACE,
    extra: Iterable[str] = (),
    tmp: Path | None = None,
) -> list[str | Path]:
    args: list[str | Path] = ["template", RELEASE, chart, "--namespace", namespace, *extra]
    if values:
        assert tmp is not None, "values need a folder for their file"
        path = tmp / "values.json"
        path.write_text(json.dumps(values))
        args += ["--values", path]
    return args


def render(
    values: Mapping[str, Any] | None = None,
    *,
    tmp: Path | None = None,
    chart: Path = CHART,
    namespace: str = NAMESPACE,
    extra: Iterable[str] = (),
) -> list[dict[str, Any]]:
    """The objects `helm template` renders (empty documents dropped)."""
    args = template_args(values, chart=chart, namespace=namespace, extra=extra, tmp=tmp)
    return [d for d in yaml.safe_load_all(helm(*args).stdout) if d]


@cache
def default_objects() -> tuple[dict[str, Any], ...]:
    """The default rendering, once per test process (do not mutate the objects)."""
    return tuple(render())


def find(objects: Iterable[Mapping[str, Any]], kind: str, name: str | None = None) -> list[dict[str, Any]]:
    return [dict(o) for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]


def one(objects: Iterable[Mapping[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = find(objects, kind, name)
    assert len(found) == 1, f"{kind}/{name}: {len(found)} rendered"
    return found[0]


def containers(obj: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    spec = obj["spec"]["template"]["spec"]
    return {c["name"]: c for c in [*spec.get("initContainers", []), *spec["containers"]]}


@cache
def chart_docs() -> ModuleType:
    """hack/chart-docs.py as a module (a script, not a package)."""
    spec = importlib.util.spec_from_file_location("chart_docs", REPO_ROOT / "hack" / "chart-docs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def parse_cli(args: list[str]) -> str:
    """Parse `args` with the `neuronetes` command line's own parser, running nothing; returns the
    top-level command. Raises what the parser raises for arguments it refuses (argparse:
    SystemExit; click: a UsageError). Works with the argparse and the click command line."""
    cli: Any = importlib.import_module("neuronetes.cli")
    if hasattr(cli, "build_parser"):
        return str(cli.build_parser().parse_args(args).command)
    import click

    command: Any = importlib.import_module("neuronetes.cli.root").build_root()
    top = name = args[0]
    rest = list(args[1:])
    while True:  # the rendered args name their subcommands first, with no group options
        command = command.commands[name]
        if not isinstance(command, click.Group):
            break
        name, *rest = rest
    command.make_context(name, rest)
    return top


def rbac_source() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((CHART / "files" / "rbac.yaml").read_text())
    return doc
