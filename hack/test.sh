#!/usr/bin/env bash
# Set up the virtual environment, then lint (ruff), type-check (mypy), check the layers (lint-imports),
# build the local control plane (hack/build-control-plane.sh, cached) and run every test (pytest: unit and e2e).
# Extra arguments go to pytest, e.g. `bash hack/test.sh -m unit`.
set -euo pipefail

# shellcheck source=hack/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$REPO_ROOT"
neuronetes_setup_venv

echo ">> ruff check ." >&2
ruff check .

echo ">> mypy" >&2
mypy

# The layers as contracts ([tool.importlinter] in pyproject.toml): the core imports no component
# and no top-layer tool, the components are independent, only the CLI and tools use the dev cluster.
echo ">> lint-imports" >&2
lint-imports --no-logo

# ---- NRI plugin (node-agent/nri, Go) --------------------------------------------------------
# gofmt, go vet and go test for the plugin module (its decoder also runs the shared vectors in
# tests/fixtures/assignment-vectors.json); the binary is built with the image's contents below
# (build/neuronetes-nri links to it). Modules come from the Go module proxy into the normal module
# cache. Without a Go toolchain this fails under CI and is skipped (with a warning) on a workstation.
have_go=0
nri_plugin_checks() {
    local dir="$REPO_ROOT/node-agent/nri" unformatted
    unformatted="$(cd "$dir" && gofmt -l .)"
    if [[ -n "$unformatted" ]]; then
        echo "FAILED: gofmt -l node-agent/nri lists: $unformatted" >&2
        return 1
    fi
    (cd "$dir" && go vet ./... && go test ./...)
}
if command -v go >/dev/null 2>&1; then
    have_go=1
    echo ">> node-agent/nri: gofmt, go vet, go test" >&2
    GOFLAGS="${GOFLAGS:+$GOFLAGS }-modcacherw" GOTOOLCHAIN=local nri_plugin_checks
else
    case "${CI:-}" in
        1|true|TRUE|True|yes|on)
            echo "FAILED: no Go toolchain for node-agent/nri" >&2
            exit 1 ;;
        *) echo "WARNING: no Go toolchain; node-agent/nri not built or tested" >&2 ;;
    esac
fi
# ---- end of the NRI plugin block -------------------------------------------------------------

# The e2e tier runs against a real local control plane built from the Go module proxy (cached
# under ~/.cache/neuronetes/bin; a no-op when built). Under CI a failed build fails the run; on a
# workstation the e2e tests then skip. NEURONETES_SKIP_CONTROL_PLANE_BUILD=1 skips this step
# (e.g. with `-m unit`).
if [[ "${NEURONETES_SKIP_CONTROL_PLANE_BUILD:-0}" != 1 ]]; then
    echo ">> hack/build-control-plane.sh" >&2
    if ! bash "$REPO_ROOT/hack/build-control-plane.sh"; then
        case "${CI:-}" in
            1|true|TRUE|True|yes|on)
                echo "FAILED: building the control plane (needed by the e2e tests)" >&2
                exit 1 ;;
            *) echo "WARNING: control plane not built; e2e tests will be skipped" >&2 ;;
        esac
    fi
fi

# ---- the chart (helm/neuronetes) ----------------------------------------------------------------
# `helm lint --strict` with the pinned helm (built above), and the chart's README values table and
# docs/rbac.md regenerated from their sources must equal the committed ones. The chart's own tests
# (tests/unit/test_chart*.py) run with pytest below.
echo ">> helm lint --strict helm/neuronetes; hack/chart-docs.py --check" >&2
python hack/chart-docs.py --check
HELM="$(cd / && python -c 'from neuronetes.devcluster.tools import Toolchain; print(Toolchain.pinned().helm)')"
if [[ -x "$HELM" ]]; then
    "$HELM" lint --strict "$REPO_ROOT/helm/neuronetes" --namespace neuronetes-system 2> >(grep -v '^level=INFO' >&2)
elif [[ "${CI:-}" =~ ^(1|true|TRUE|True|yes|on)$ ]]; then
    echo "FAILED: no helm at $HELM (hack/build-control-plane.sh builds it)" >&2
    exit 1
else
    echo "WARNING: no helm at $HELM; chart not linted (its tests will skip)" >&2
fi

# ---- CUDA shim (node-agent/shim): build it and run its C tests under sanitizers ------------------
# libneuronetes-cuda.so, the fake libcuda/libnvidia-ml and the C tests are built against the real
# cuda.h / nvml.h of the dev extra; every case runs under ASan+UBSan, the region logic under TSan
# too (gcc's libasan/libubsan/libtsan; Debian's gcc ships them). ~30 s on 2 cores.
echo ">> make -C node-agent/shim test" >&2
make -s -C "$REPO_ROOT/node-agent/shim" PYTHON="$VIRTUAL_ENV/bin/python" test

# ---- GPU validation in fake mode (docs/gpu-validation.md) ----------------------------------------
# The same command a GPU machine runs, over the fake driver and the simulated backend, so it cannot
# rot: the checks that need real hardware say "skipped: no GPU", the rest run; prints the table.
echo ">> hack/gpu-validate.sh --fake" >&2
PYTHON="$VIRTUAL_ENV/bin/python" bash "$REPO_ROOT/hack/gpu-validate.sh" --fake --out "$REPO_ROOT/out/gpu-validate-fake"

# ---- The image's contents (Dockerfile), built and smoke-tested outside a container ---------------
# hack/build-image-contents.sh runs the Dockerfile's build steps into build/image (the NRI plugin,
# the shim, the wheel installed into a fresh venv), then runs every entry point's --help, the NRI
# plugin's -help and the shim over the fake driver. ~1 min on 2 cores (mostly the venv's installs,
# from pip's cache). Needs Go: skipped with the NRI plugin above on a workstation without it.
if [[ $have_go == 1 ]]; then
    echo ">> hack/build-image-contents.sh all build/image" >&2
    GOTOOLCHAIN=local PYTHON="$VIRTUAL_ENV/bin/python" bash "$REPO_ROOT/hack/build-image-contents.sh" all "$REPO_ROOT/build/image"
    ln -sfn image/usr/local/bin/neuronetes-nri "$REPO_ROOT/build/neuronetes-nri"
fi

# Prometheus (Debian package `prometheus`: the server and `promtool`) for the agent's exporter
# tests: `promtool check metrics` on its output, and a real server scraping it in tests/e2e.
# Installed without recommends (the package alone and a few JavaScript libraries of its web UI).
if ! command -v promtool >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [[ "$(id -u)" == 0 ]]; then
    neuronetes_install_debian_packages prometheus \
        || echo "WARNING: prometheus not installed; the agent's promtool/scrape tests will skip" >&2
fi

# The real dev-cluster nodes' Debian packages (runc, the CNI plugins, busybox-static): root only,
# only those missing (tests/e2e/test_real_node_e2e.py skips without them).
bash "$REPO_ROOT/hack/install-node-packages.sh"

echo ">> pytest" >&2
status=0
pytest "$@" || status=$?
if [[ $status -eq 5 ]]; then
    echo "FAILED: pytest collected no tests" >&2
    exit 1
fi
exit "$status"
