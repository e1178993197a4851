#!/usr/bin/env python3
"""Generate the chart's documentation from its sources, so nothing is written twice.

- ``helm/neuronetes/README.md``: the values table, from the ``# --`` comments of
  ``helm/neuronetes/values.yaml`` (the comment block right above a key documents it; a documented
  key whose value is a mapping with documented keys of its own gets a row and its children rows).
- ``docs/rbac.md``: each component's permissions and the code that needs them, from
  ``helm/neuronetes/files/rbac.yaml`` (the file the chart renders its RBAC from).

Only the part between the ``<!-- generated:NAME begin -->`` / ``end`` markers is rewritten; the
prose around it is the document's own. ``--check`` writes nothing and exits 1 when a document is
out of date (``tests/unit/test_chart.py`` runs the same check). Every value must be documented: an
undocumented one is an error naming it.

    python hack/chart-docs.py           # rewrite the generated parts
    python hack/chart-docs.py --check   # fail when they are stale
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parents[1]
CHART = REPO_ROOT / "helm" / "neuronetes"
VALUES = CHART / "values.yaml"
RBAC = CHART / "files" / "rbac.yaml"
README = CHART / "README.md"
RBAC_DOC = REPO_ROOT / "docs" / "rbac.md"

_KEY = re.compile(r"^(?P<indent>\s*)(?P<key>[A-Za-z0-9_.\-/]+):(?:\s|$)")
_DOC = re.compile(r"^\s*# -- ?(?P<text>.*)$")
_MORE = re.compile(r"^\s*# ?(?P<text>.*)$")


class DocsError(ValueError):
    """A source the documents cannot be generated from (an undocumented value, a bad marker)."""


@dataclass(frozen=True)
class ValueRow:
    key: str
    type: str
    default: str
    description: str


def value_docs(text: str) -> dict[tuple[str, ...], str]:
    """The ``# --`` descriptions of values.yaml by key path, in file order."""
    docs: dict[tuple[str, ...], str] = {}
    stack: list[tuple[int, str]] = []
    pending: list[str] | None = None
    for line in text.splitlines():
        if not line.strip():
            pending = None
            continue
        if m := _DOC.match(line):
            pending = [m["text"].strip()]
            continue
        if line.lstrip().startswith("#"):
            if pending is not None and (m := _MORE.match(line)):
                pending.append(m["text"].strip())
            continue
        m = _KEY.match(line)
        if m is None:  # a list item or a continuation: no key of its own
            pending = None
            continue
        indent = len(m["indent"])
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, m["key"]))
        if pending is not None:
            docs[tuple(k for _, k in stack)] = " ".join(pending)
        pending = None
    return docs


def _type(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "list"
    return "object"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def value_rows(values_text: str) -> list[ValueRow]:
    """One row per documented value; raises `DocsError` naming any undocumented value."""
    docs = value_docs(values_text)
    values = yaml.safe_load(values_text) or {}
    rows: list[ValueRow] = []

    def has_documented_children(path: tuple[str, ...]) -> bool:
        return any(len(p) > len(path) and p[: len(path)] == path for p in docs)

    def walk(node: Mapping[str, Any], path: tuple[str, ...]) -> None:
        for key, value in node.items():
            here = (*path, str(key))
            nested = isinstance(value, Mapping) and value and has_documented_children(here)
            if here in docs:
                default = "see below" if nested else json.dumps(value, separators=(", ", ": "))
                rows.append(ValueRow(".".join(here), _type(value), default, docs[here]))
            elif not (isinstance(value, Mapping) and value):
                raise DocsError(f"values.yaml: {'.'.join(here)} has no '# --' description")
            if isinstance(value, Mapping) and value and (nested or here not in docs):
                walk(value, here)

    walk(values, ())
    return rows


def values_table(values_text: str) -> str:
    lines = ["| Key | Type | Default | Description |", "|---|---|---|---|"]
    for r in value_rows(values_text):
        default = r.default if r.default == "see below" else f"`{_cell(r.default)}`"
        lines.append(f"| `{r.key}` | {r.type} | {default} | {_cell(r.description)} |")
    return "\n".join(lines)


def _rule_rows(rules: list[Mapping[str, Any]], scope: str) -> Iterator[str]:
    for rule in rules:
        groups = ", ".join(f"`{g}`" if g else "core" for g in rule["apiGroups"])
        resources = ", ".join(f"`{r}`" for r in rule["resources"])
        if rule.get("resourceNames"):
            resources += " (only " + ", ".join(f"`{n}`" for n in rule["resourceNames"]) + ")"
        verbs = ", ".join(rule["verbs"])
        called = "<br>".join(f"`{c}`" for c in rule.get("calledBy", []))
        yield f"| {groups} | {resources} | {verbs} | {scope} | {called} |"


def rbac_markdown(rbac_text: str) -> str:
    """The per-component sections of docs/rbac.md."""
    components = (yaml.safe_load(rbac_text) or {}).get("components") or {}
    out: list[str] = []
    for name, spec in components.items():
        out += [
            f"### {name}",
            "",
            f"ServiceAccount `{spec['serviceAccount']}`. {spec['summary'].strip()}",
            "",
        ]
        rows = list(_rule_rows(spec.get("clusterRole") or [], f"cluster (ClusterRole `neuronetes:{name}`)"))
        for role in spec.get("roles") or []:
            ns = f"namespace {role['namespace']}" if role["namespace"] else "the release namespace"
            rows += _rule_rows(role["rules"], f"{ns} (Role `neuronetes:{name}`)")
        if rows:
            out += [
                "| API group | resources | verbs | scope | called by |",
                "|---|---|---|---|---|",
                *rows,
                "",
            ]
        else:
            out += ["No permission: no Role, no binding, no token mounted.", ""]
        bound = [
            f"| ClusterRole `{b['name']}` | cluster | {b['why']} |"
            for b in spec.get("boundClusterRoles") or []
        ] + [
            f"| Role `{b['name']}` | namespace {b['namespace']} | {b['why']} |"
            for b in spec.get("boundRoles") or []
        ]
        if bound:
            out += ["Roles the cluster defines itself, bound as they are:", ""]
            out += ["| role | scope | for |", "|---|---|---|", *bound, ""]
    return "\n".join(out).rstrip()


def replace_generated(document: str, name: str, content: str) -> str:
    """`document` with the part between the markers of `name` replaced by `content`."""
    begin, end = f"<!-- generated:{name} begin -->", f"<!-- generated:{name} end -->"
    if document.count(begin) != 1 or document.count(end) != 1 or document.index(begin) > document.index(end):
        raise DocsError(f"need exactly one '{begin}' followed by one '{end}'")
    head, rest = document.split(begin)
    _, tail = rest.split(end)
    return f"{head}{begin}\n{content}\n{end}{tail}"


def generated() -> dict[Path, str]:
    """Each generated document's expected full text."""
    return {
        README: replace_generated(README.read_text(), "values", values_table(VALUES.read_text())),
        RBAC_DOC: replace_generated(RBAC_DOC.read_text(), "rbac", rbac_markdown(RBAC.read_text())),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail when a document is out of date")
    ns = parser.parse_args(argv)
    try:
        expected = generated()
    except (OSError, DocsError, yaml.YAMLError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    stale = [path for path, text in expected.items() if path.read_text() != text]
    if ns.check:
        for path in stale:
            print(
                f"{path.relative_to(REPO_ROOT)} is out of date: run python hack/chart-docs.py",
                file=sys.stderr,
            )
        return 1 if stale else 0
    for path in stale:
        path.write_text(expected[path])
        print(f"wrote {path.relative_to(REPO_ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
