"""Package list for setuptools (metadata and the folder mapping live in pyproject.toml).

Lists `neuronetes` and its subpackages, plus every package below the top-level folders
that `[tool.setuptools] package-dir` maps into the `neuronetes` namespace (operator/ ->
neuronetes.operator, ...), so new subpackages are picked up without editing any list.
"""

import tomllib
from pathlib import Path

from setuptools import find_packages, setup

ROOT = Path(__file__).resolve().parent
PACKAGE_DIR: dict[str, str] = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"][
    "setuptools"
]["package-dir"]

packages = set(find_packages(where=str(ROOT), include=["neuronetes", "neuronetes.*"]))
for package, folder in PACKAGE_DIR.items():
    packages.add(package)
    packages.update(f"{package}.{sub}" for sub in find_packages(where=str(ROOT / folder)))

setup(packages=sorted(packages))
