#!/usr/bin/env bash
# What the NeuroNetes image holds, built by the same steps inside and outside a container.
#
# The Dockerfile RUNs these stages one by one (each in its build stage); `all` runs every stage
# in the same order into a staging root on this machine and smoke-tests the result, which is how
# hack/test.sh checks the image's contents where no container engine runs.
# tests/unit/test_image.py checks that the Dockerfile runs exactly `stages`, in order.
#
#   build-image-contents.sh nri ROOT            the NRI plugin   -> ROOT/usr/local/bin/neuronetes-nri
#   build-image-contents.sh shim-headers        pip-install the CUDA/NVML header packages the dev
#                                               extra pins (into $PYTHON; a no-op when present)
#   build-image-contents.sh shim ROOT           the CUDA shim    -> ROOT/usr/lib/neuronetes/libneuronetes-cuda.so
#   build-image-contents.sh wheel ROOT          the wheel        -> ROOT/wheels/neuronetes-*.whl
#   build-image-contents.sh venv ROOT WHEELS    a fresh venv at ROOT/opt/neuronetes with the wheel
#                                               from WHEELS (and its pinned dependencies)
#   build-image-contents.sh smoke ROOT          every entry point's --help, the NRI plugin's -help,
#                                               the shim over the fake driver, from ROOT
#   build-image-contents.sh all ROOT            every stage into ROOT (emptied first), then smoke
#   build-image-contents.sh stages              print the stages `all` runs, in order
#
# The shim's path in the image is the path containers see it at (contracts.SHIM_LIBRARY_PATH):
# the agent installs it onto the host from there (`neuronetes agent run --shim-library`).
# Environment: PYTHON (default python3), GO (default go), SHIM_BUILD (the shim's object folder,
# default the Makefile's node-agent/shim/build), CC.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
GO="${GO:-go}"
SHIM_BUILD="${SHIM_BUILD:-$REPO_ROOT/node-agent/shim/build}"  # the Makefile's own: the C tests reuse it

STAGES=(nri shim-headers shim wheel venv)
NRI_BINARY=usr/local/bin/neuronetes-nri
SHIM_LIBRARY=usr/lib/neuronetes/libneuronetes-cuda.so
VENV=opt/neuronetes

die() { echo "build-image-contents: $*" >&2; exit 1; }
need_root() { [[ -n "${1:-}" ]] || die "$2: give the staging root (see the header of $0)"; }

stage_nri() {
    need_root "${1:-}" nri
    mkdir -p "$1/$(dirname "$NRI_BINARY")"
    (cd "$REPO_ROOT/node-agent/nri" && CGO_ENABLED=0 GOFLAGS="${GOFLAGS:+$GOFLAGS }-modcacherw" \
        "$GO" build -trimpath -o "$1/$NRI_BINARY" ./cmd/neuronetes-nri)
}

stage_shim_headers() {
    # The exact pins of the dev extra (pyproject.toml), so the image's shim sees the same headers.
    local pins
    pins="$("$PYTHON" - "$REPO_ROOT/pyproject.toml" <<'EOF'
import sys, tomllib
dev = tomllib.load(open(sys.argv[1], "rb"))["project"]["optional-dependencies"]["dev"]
print(" ".join(p for p in dev if p.startswith(("nvidia-cuda-runtime==", "nvidia-nvml-dev=="))))
EOF
)"
    [[ -n "$pins" ]] || die "shim-headers: no nvidia-cuda-runtime/nvidia-nvml-dev pin in pyproject.toml"
    # shellcheck disable=SC2086  # two pins, split on purpose
    "$PYTHON" -m pip install -q $pins
}

stage_shim() {
    need_root "${1:-}" shim
    local lib="$SHIM_BUILD/release/lib/libneuronetes-cuda.so"
    make -s -C "$REPO_ROOT/node-agent/shim" PYTHON="$PYTHON" BUILD="$SHIM_BUILD" "$lib"
    install -D -m 0644 "$lib" "$1/$SHIM_LIBRARY"
}

stage_wheel() {
    need_root "${1:-}" wheel
    mkdir -p "$1/wheels"
    rm -f "$1"/wheels/neuronetes-*.whl
    (cd / && "$PYTHON" -m pip wheel -q --no-deps -w "$1/wheels" "$REPO_ROOT")
}

stage_venv() {
    need_root "${1:-}" venv
    local wheels="${2:-$1/wheels}"
    compgen -G "$wheels/neuronetes-*.whl" >/dev/null || die "venv: no neuronetes wheel in $wheels"
    (cd / && "$PYTHON" -m venv "$1/$VENV")
    (cd / && "$1/$VENV/bin/python" -m pip install -q "$wheels"/neuronetes-*.whl)
}

stage_smoke() {
    need_root "${1:-}" smoke
    local root="$1" bin="$1/$VENV/bin" script found=0 version
    version="$(cd / && "$bin/python" -c 'from importlib.metadata import version; print(version("neuronetes"))')"
    # Every console script the wheel declares runs its --help from the fresh venv, and says its
    # version (`neuronetes 0.1.0`, `kubectl neuronetes 0.1.0`).
    for script in $(cd / && "$bin/python" -c 'from importlib.metadata import distribution
print(" ".join(e.name for e in distribution("neuronetes").entry_points if e.group == "console_scripts"))'); do
        "$bin/$script" --help >/dev/null || die "smoke: $script --help failed"
        [[ "$("$bin/$script" --version)" == *" $version" ]] || die "smoke: $script --version is not $version"
        found=$((found + 1))
    done
    ((found > 0)) || die "smoke: the wheel declares no console script"
    "$root/$NRI_BINARY" -help >/dev/null 2>&1 || die "smoke: neuronetes-nri -help failed"
    # The shim, preloaded over the fake driver, enforces a region the venv's own writer creates.
    # Inside the image (no make, no compiler) the fake driver comes prebuilt in SHIM_BUILD
    # (hack/smoke-image.sh builds it in the Dockerfile's shim stage).
    local fake="$SHIM_BUILD/release/fake"
    if command -v make >/dev/null 2>&1; then
        make -s -C "$REPO_ROOT/node-agent/shim" PYTHON="$PYTHON" BUILD="$SHIM_BUILD" \
            "$fake/libcuda.so.1" "$fake/libnvidia-ml.so.1"
    fi
    [[ -f "$fake/libcuda.so.1" && -f "$fake/libnvidia-ml.so.1" ]] || die "smoke: no fake driver in $fake"
    local work
    work="$(mktemp -d)"
    # shellcheck disable=SC2064  # expand now: `work` is local
    trap "rm -rf '$work'" RETURN
    (cd / && NEURONETES_REGION_DIR="$work/region" FAKE_CUDA_STATE="$work/gpu" \
        LD_LIBRARY_PATH="$fake" LD_PRELOAD="$root/$SHIM_LIBRARY" \
        "$bin/python" "$REPO_ROOT/hack/shim-smoke.py") || die "smoke: the shim over the fake driver failed"
    echo "image contents OK: $found entry points, neuronetes-nri, the shim ($root)" >&2
}

# Folders as absolute paths: some steps run from / (so the checkout's operator/ never shadows the
# standard library's `operator`).
root="${2:+$(realpath -m "$2")}"
wheels="${3:+$(realpath -m "$3")}"
case "${1:-}" in
    nri) stage_nri "$root" ;;
    shim-headers) stage_shim_headers ;;
    shim) stage_shim "$root" ;;
    wheel) stage_wheel "$root" ;;
    venv) stage_venv "$root" "$wheels" ;;
    smoke) stage_smoke "$root" ;;
    stages) echo "${STAGES[*]}" ;;
    all)
        need_root "$root" all
        rm -rf "$root" && mkdir -p "$root"
        for s in "${STAGES[@]}"; do
            echo ">> image contents: $s" >&2
            "stage_${s//-/_}" "$root"
        done
        stage_smoke "$root" ;;
    *) die "unknown stage '${1:-}' (nri, shim-headers, shim, wheel, venv, smoke, all, stages)" ;;
esac
