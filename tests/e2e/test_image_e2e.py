"""The repository's image, built and run: ``hack/build-image.sh`` builds the Dockerfile with buildah
from the local base images (``hack/build-base-images.sh``; both cached, so a second run is quick),
``hack/smoke-image.sh`` runs the contents smoke test of ``hack/build-image-contents.sh`` inside
the image (as its user, no network), and the image's contents and configuration are checked from
a container of it.

Needs root (buildah's storage) and buildah with debootstrap, which the scripts install with
apt-get when missing: without root, or without buildah and apt-get, the tests skip.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tarfile
from collections.abc import Iterator
from importlib.metadata import version as installed_version
from pathlib import Path

import pytest

from neuronetes.devcluster.tools import REPO_ROOT, cache_root

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

VERSION = installed_version("neuronetes")  # the checkout's (editable install), as pyproject.toml
IMAGE = f"localhost/neuronetes:{VERSION}"
ARCHIVE = cache_root() / "images" / f"neuronetes-{VERSION}.oci.tar"
COLD_BUILD_S = 1800  # base images and image from nothing: ~4 min on 2 cores, pip and Go downloads


def run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, check=False)


@pytest.fixture(scope="module")
def image() -> str:
    """The image, built (or found up to date) by hack/build-image.sh."""
    if os.geteuid() != 0:
        pytest.skip("the image tests need root (buildah's storage)")
    if shutil.which("buildah") is None and shutil.which("apt-get") is None:
        pytest.skip("no buildah, and no apt-get to install it")
    built = run("bash", str(REPO_ROOT / "hack" / "build-image.sh"), timeout=COLD_BUILD_S)
    assert built.returncode == 0, built.stderr[-4000:]
    assert f">> built {IMAGE} in " in built.stderr
    return IMAGE


@pytest.fixture
def container(image: str) -> Iterator[str]:
    """A working container of the image, removed afterwards."""
    made = run("buildah", "from", "--pull=never", image)
    assert made.returncode == 0, made.stderr
    name = made.stdout.strip()
    try:
        yield name
    finally:
        run("buildah", "rm", name)


def in_container(container: str, *command: str) -> subprocess.CompletedProcess[str]:
    return run("buildah", "run", "--network", "none", container, "--", *command)


def test_the_contents_smoke_test_passes_inside_the_image(image: str) -> None:
    smoke = run("bash", str(REPO_ROOT / "hack" / "smoke-image.sh"), image, timeout=600)
    assert smoke.returncode == 0, smoke.stderr[-4000:]
    assert re.search(
        r"image contents OK: [1-9]\d* entry points, neuronetes-nri, the shim \(/\)", smoke.stderr
    )


def test_the_image_runs_as_a_numeric_non_root_user_with_its_entry_point(image: str) -> None:
    inspected = run("buildah", "inspect", "--type", "image", image)
    assert inspected.returncode == 0, inspected.stderr
    config = json.loads(inspected.stdout)["OCIv1"]["config"]
    assert config["User"] == "65532:65532"
    assert config["Entrypoint"] == ["neuronetes"] and config["Cmd"] == ["--help"]
    assert config["WorkingDir"] == "/"


def test_the_components_are_in_the_image(container: str) -> None:
    assert in_container(container, "id", "-u").stdout.strip() == "65532"
    shim = in_container(container, "test", "-f", "/usr/lib/neuronetes/libneuronetes-cuda.so")
    assert shim.returncode == 0, "no /usr/lib/neuronetes/libneuronetes-cuda.so in the image"
    version = in_container(container, "neuronetes", "--version")
    assert version.returncode == 0 and version.stdout.strip() == f"neuronetes {VERSION}", version
    nri = in_container(container, "neuronetes-nri", "-help")
    assert nri.returncode == 0, nri.stderr
    assert "Usage" in nri.stdout + nri.stderr
    # Nothing the build only needed: no compiler, no Go toolchain, no wheels, no build script.
    for absent in ("/usr/bin/gcc", "/usr/local/go", "/tmp/wheels", "/tmp/build-image-contents.sh"):
        assert in_container(container, "test", "-e", absent).returncode == 1, f"{absent} is in the image"


def test_the_oci_archive_names_the_image_for_containerd(image: str) -> None:
    assert ARCHIVE.is_file(), f"no {ARCHIVE}"
    with tarfile.open(ARCHIVE) as archive:
        index_file = archive.extractfile("index.json")
        assert index_file is not None
        index = json.load(index_file)
    names = [m.get("annotations", {}).get("org.opencontainers.image.ref.name") for m in index["manifests"]]
    assert names == [image]
    assert Path(f"{ARCHIVE}.id").read_text().strip()
