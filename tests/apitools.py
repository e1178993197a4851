"""Paths and loaders shared by the API tests (unit and e2e): CRDs, seed 004 examples, invalid objects.

Importable from any test module (pytest's ``pythonpath`` holds ``tests/``). YAML is read with
:func:`load_yaml`, PyYAML's safe loader refusing duplicate keys (which kubectl refuses too).

Seed 004 fixtures (``tests/fixtures/seed004/``): each complete object of the seed is one file,
copied verbatim. The seed's partial snippets ("Best Practices", "Troubleshooting") are verbatim
slices in ``fragments/``; ``fragments/wrap.tsv`` names where each belongs in an AgentPool
(``spec``, ``spec.gpuRequirements``, ...), and :func:`wrap_fragment` indents the snippet, unchanged,
under that path in a minimal AgentPool named ``seed004-<file stem>``. A snippet that listed a bad
and a good variant under one key is split into two slices, since one YAML document cannot hold a
key twice.

Invalid fixtures (``tests/fixtures/invalid/``): one object each, whose first line is
``# expect: <substring of the API server's error>``; the substring names the offending field.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
CRD_DIR = REPO / "crds"
FIXTURES = REPO / "tests" / "fixtures"
SEED004_DIR = FIXTURES / "seed004"
FRAGMENT_DIR = SEED004_DIR / "fragments"
INVALID_DIR = FIXTURES / "invalid"
SEED004_FILE = REPO.parent / "shared" / "seeds" / "004_2c430fd10453cf9e.txt"


class _StrictLoader(yaml.SafeLoader):  # type: ignore[misc]  # PyYAML ships no types
    """PyYAML's safe loader, refusing a key given twice in one mapping."""


def _mapping_without_duplicates(loader: _StrictLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node)
        if key in seen:
            raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
        seen.add(key)
    mapping: dict[Any, Any] = loader.construct_mapping(node)
    return mapping


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_without_duplicates)


def load_yaml(text: str) -> Any:
    """The single YAML document in ``text``."""
    return yaml.load(text, Loader=_StrictLoader)


_EXPECT = re.compile(r"^# expect: (?P<expect>.+?)\s*$")


@dataclass(frozen=True)
class Example:
    """An object to send to the API server: its YAML text and where it came from."""

    name: str
    text: str
    source: Path
    fragment: bool = False
    expect: str = ""

    @property
    def obj(self) -> Any:
        return load_yaml(self.text)


def load_crds() -> dict[str, dict[str, Any]]:
    """Every CRD in ``crds/``, by kind."""
    crds: dict[str, dict[str, Any]] = {}
    for path in sorted(CRD_DIR.glob("*.yaml")):
        crd = load_yaml(path.read_text())
        crds[crd["spec"]["names"]["kind"]] = crd
    return crds


def openapi_schema(crd: dict[str, Any]) -> dict[str, Any]:
    (version,) = crd["spec"]["versions"]
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return schema


def wrap_fragment(text: str, under: str, name: str) -> str:
    """A minimal AgentPool holding ``text`` (unchanged, only indented) at the dotted path ``under``."""
    keys = under.split(".")
    if keys[0] != "spec":
        raise ValueError(f"fragment path {under!r} must start at spec")
    head = f"apiVersion: neuronetes.io/v1alpha1\nkind: AgentPool\nmetadata:\n  name: {name}\n"
    head += "".join(f"{'  ' * depth}{key}:\n" for depth, key in enumerate(keys))
    pad = "  " * len(keys)
    return head + "".join(pad + line if line.strip() else line for line in text.splitlines(keepends=True))


def fragment_index() -> list[tuple[str, str]]:
    rows = []
    for line in (FRAGMENT_DIR / "wrap.tsv").read_text().splitlines():
        if line.strip():
            file, under = line.split("\t")
            rows.append((file, under))
    return rows


def seed_examples() -> list[Example]:
    """Every seed 004 example: the complete objects verbatim, then the wrapped fragments."""
    examples = [Example(p.stem, p.read_text(), p) for p in sorted(SEED004_DIR.glob("*.yaml"))]
    for file, under in fragment_index():
        path = FRAGMENT_DIR / file
        name = f"seed004-{path.stem}"
        examples.append(Example(name, wrap_fragment(path.read_text(), under, name), path, fragment=True))
    return examples


def invalid_examples() -> list[Example]:
    """Every invalid object with the error substring the API server must answer with."""
    out = []
    for path in sorted(INVALID_DIR.glob("*.yaml")):
        text = path.read_text()
        match = _EXPECT.match(text.splitlines()[0])
        if match is None:
            raise ValueError(f"{path}: first line must be '# expect: <error substring>'")
        out.append(Example(path.stem, text, path, expect=match["expect"]))
    return out
