"""The dashboard's and the alert rules' PromQL, and the metric names the components export.

Shared by tests/unit/test_observability.py (every metric an expression uses is exported) and
tests/e2e/test_observability_e2e.py (a real Prometheus evaluates every expression). Expressions
are parsed with `promql_parser` (a full PromQL parser), never matched with regular expressions.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import promql_parser
import yaml
from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric

REPO_ROOT: Final = Path(__file__).resolve().parents[1]
DASHBOARD: Final = REPO_ROOT / "helm" / "neuronetes" / "files" / "dashboards" / "neuronetes.json"
RULES: Final = REPO_ROOT / "helm" / "neuronetes" / "files" / "rules" / "neuronetes-rules.yaml"

GRAFANA_VARIABLES: Final = {
    # What Grafana puts in before it sends a query: a rate window and
    # the node variable's "All" (its allValue).
    "__rate_interval": "1m",
    "node": ".*",
}
_VARIABLE: Final = re.compile(r"\$\{?(\w+)\}?")

# Sample names each metric type exposes beside its family name.
_SUFFIXES: Final = {
    "counter": ("_total",),
    "gauge": ("",),
    "histogram": ("_bucket", "_sum", "_count"),
    "summary": ("", "_sum", "_count"),
}


@dataclass(frozen=True, slots=True)
class Query:
    where: str  # "panel <title> #<refId>" or "alert <name>"
    expr: str  # as Prometheus receives it (Grafana variables substituted)
    panel: str = ""  # the dashboard panel's title, for a panel's query


def _substitute(expr: str) -> str:
    def one(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in GRAFANA_VARIABLES:
            raise AssertionError(f"unknown Grafana variable ${name} in {expr!r}")
        return GRAFANA_VARIABLES[name]

    return _VARIABLE.sub(one, expr)


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels", []))


def dashboard_queries() -> list[Query]:
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return [
        Query(f"panel {p['title']!r} #{t['refId']}", _substitute(t["expr"]), p["title"])
        for p in _panels(dashboard["panels"])
        for t in p.get("targets", [])
    ]


def variable_queries() -> list[Query]:
    """The dashboard variables' label_values(...) selectors, as the series they read."""
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    out = []
    for var in dashboard["templating"]["list"]:
        if var["type"] != "query":
            continue
        found = re.fullmatch(r"label_values\((.+),\s*\w+\)", var["definition"])
        assert found, f"variable {var['name']}: only label_values(SELECTOR, LABEL) is supported"
        out.append(Query(f"variable {var['name']}", found.group(1)))
    return out


def rule_queries() -> list[Query]:
    rules = yaml.safe_load(RULES.read_text(encoding="utf-8"))
    return [
        Query(f"{'alert' if 'alert' in r else 'record'} {r.get('alert') or r.get('record')}", r["expr"])
        for group in rules["groups"]
        for r in group["rules"]
    ]


def all_queries() -> list[Query]:
    return dashboard_queries() + variable_queries() + rule_queries()


def metric_names(expr: str) -> set[str]:
    """Every metric name a PromQL expression selects (raises ValueError if it does not parse)."""
    names: set[str] = set()

    def visit(node: Any) -> bool:
        if isinstance(node, promql_parser.VectorSelector):
            if node.name:
                names.add(node.name)
            for m in node.matchers.matchers:
                if m.name == "__name__":
                    assert m.op == promql_parser.MatchOp.Equal, f"{expr}: a __name__ regex hides names"
                    names.add(m.value)
        return True

    promql_parser.walk(promql_parser.parse(expr), visit)
    return names


def sample_names(registry: CollectorRegistry) -> set[str]:
    """The sample names a registry's collectors expose (whether or not they hold samples now)."""
    out: set[str] = set()
    metric: Metric
    for metric in registry.collect():
        out.update(metric.name + suffix for suffix in _SUFFIXES[metric.type])
    return out


def exported_metric_names() -> dict[str, set[str]]:
    """Component -> the sample names its registry exports, built in-process as each process does."""
    from extender_support import node_objects, synced_cache

    from neuronetes_agent.daemon.exporter import AgentCollector
    from neuronetes_extender.app import create_app
    from neuronetes_extender.service import ExtenderService
    from neuronetes_operator.autoscaler import AutoscalerMetrics

    app = create_app(ExtenderService(synced_cache(node_objects({"t4x4-pcie": 1}))))
    agent = CollectorRegistry(auto_describe=False)
    agent.register(AgentCollector(list))  # what `serve_metrics` registers
    operator = CollectorRegistry()
    AutoscalerMetrics(operator)  # what the operator's metrics listener serves
    return {
        "extender": sample_names(app.state.metrics.registry),
        "agent": sample_names(agent),
        "operator": sample_names(operator),
    }
