"""e2e fixtures: one real local control plane per pytest session.

`cluster` (session scope) builds the pinned binaries if needed (``hack/build-control-plane.sh``),
starts etcd, kube-apiserver, kube-controller-manager, kube-scheduler (``neuronetes-scheduler``
profile; extender from ``$NEURONETES_EXTENDER_URL`` if set) and kwok, applies ``crds/`` and the
admission policies of ``manifests/policies/``, and yields an `E2ECluster`:

- ``.kubeconfig: Path`` (admin) and ``.extender_kubeconfig: Path`` (the extender's ServiceAccount:
  an extender a test runs must use it, the policies let no one else write GPU assignments)
- ``.kubectl(*args, input=None, check=True) -> subprocess.CompletedProcess[str]``
- ``.add_nodes(profile, count, prefix) -> list[str]`` (kwok nodes of a named topology profile,
  Ready on return; profiles in ``neuronetes/profiles.py``)
- ``.api_client() -> kubernetes.client.ApiClient`` (admin; ``extender_api_client()``: the extender's)
- ``.set_extender(url_or_config_or_None)`` restarts kube-scheduler with another extender
- ``.wait_until(fn, timeout=..., what=...)`` polls until ``fn()`` is truthy and returns it
- ``.dev``: the underlying `neuronetes.devcluster.DevCluster`

Every test under tests/e2e is marked ``e2e``. When the binaries are missing and cannot be built,
e2e tests are skipped on a workstation but FAIL under ``CI=true``. After the session, no process the
cluster started may remain: the fixture's teardown and a session-finish hook both check, and
SIGTERM is turned into KeyboardInterrupt so a killed run tears its clusters down too.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e_cluster import RECORDS, STARTED, E2ECluster, ensure_toolchain, prerequisites_missing, track

from neuronetes.devcluster import POLICIES_DIR, DevCluster, ExtenderConfig, procs
from neuronetes.devcluster.tools import REPO_ROOT

E2E_DIR = Path(__file__).resolve().parent


def pytest_configure(config: pytest.Config) -> None:
    # A run stopped with SIGTERM (a CI timeout, `kill`) tears its clusters down as Ctrl-C does: the
    # fixtures' `finally` blocks run, so no etcd, kube-apiserver or kwok outlives the run
    # (test_sigterm_e2e.py).
    procs.interrupt_on(signal.SIGTERM)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if E2E_DIR in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.e2e)


def crds_dir() -> Path | None:
    """``crds/`` of the checkout; ``$NEURONETES_E2E_CRDS_DIR`` overrides it (empty: apply none)."""
    override = os.environ.get("NEURONETES_E2E_CRDS_DIR")
    if override is None:
        return REPO_ROOT / "crds"
    return Path(override) if override else None


def policies_dir() -> Path | None:
    """``manifests/policies/`` (the admission policies), unless ``$NEURONETES_E2E_CRDS_DIR`` is set."""
    return POLICIES_DIR if os.environ.get("NEURONETES_E2E_CRDS_DIR") is None else None


@pytest.fixture(scope="session")
def cluster(request: pytest.FixtureRequest) -> Iterator[E2ECluster]:
    tools = ensure_toolchain()
    if shutil.which("openssl") is None:
        prerequisites_missing("the openssl command (service-account key generation)")
    dev = DevCluster(f"e2e-{os.getpid()}", tools=tools)
    STARTED.append(dev)
    started = time.monotonic()
    try:
        dev.up(extender=ExtenderConfig.from_env(), crds_dir=crds_dir(), policies_dir=policies_dir())
    except BaseException:
        dev.down()
        raise
    track(dev)
    print(f"\ne2e cluster {dev.name} up in {time.monotonic() - started:.1f}s ({dev.state_dir})")
    try:
        yield E2ECluster(dev)
    finally:
        dev.down()
        left = dev.leftover_processes()
        if left:
            pytest.fail(f"processes of cluster {dev.name} left after down: {left}", pytrace=False)
        if request.session.testsfailed == 0:  # as `own_cluster`: a failed run keeps its logs and state
            dev.purge()
        if request.session.testsfailed == 0:
            dev.purge()
        else:
            print(f"\ne2e cluster logs kept in {dev.log_dir}")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the session if any process a dev cluster of this session started is still alive."""
    for dev in STARTED:
        dev.down()  # idempotent; a no-op for clusters already stopped
    left = procs.survivors(RECORDS)
    if left:
        print(f"\nERROR: dev-cluster processes survived the session: {left}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
