#!/usr/bin/env bash
# GPU validation: prove every GPU-facing part on a real NVIDIA GPU, in one command, with no network.
#
#   bash hack/gpu-validate.sh [--fake] [--out DIR] [--only ID,ID] [--wheels DIR]
#   (also: neuronetes dev gpu-validate ...)
#
# Builds what it needs from the working tree — the CUDA shim and the launch probe against the
# machine's CUDA headers ($CUDA_HOME/include, /usr/local/cuda/include, else the venv's nvidia
# wheels) — makes this checkout's Python packages importable without installing them, runs every
# check of neuronetes/gpuvalidate/checks.toml and writes gpu-validate.json, gpu-validate.txt (the
# table, also printed) and gpu-validate.log to $OUT, or out/gpu-validate/ (docs/gpu-validation.md).
#
# --fake    no GPU: the same checks over the fake driver (node-agent/shim/fake) and the simulated
#           backend; what needs real hardware says "skipped: no GPU". The test command runs this.
# --wheels  install these wheels (offline, no dependencies) for the run only: Python packages the
#           GPU machine lacks (msgspec, kubernetes, ...).
# PYTHON    the interpreter (default: python3 when it has PyTorch, else the project's .venv).
# Exit status: 0 when no check failed or erred.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
fake=0 out="${OUT:-$REPO_ROOT/out/gpu-validate}" only="" wheels=""
while [[ $# -gt 0 ]]; do
    case "$1" in
        --fake) fake=1 ;;
        --out) out="${2:?--out needs a folder}"; shift ;;
        --only) only="${2:?--only needs check ids}"; shift ;;
        --wheels) wheels="${2:?--wheels needs a folder}"; shift ;;
        -h|--help) sed -n '2,19p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "error: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done
mkdir -p "$out"
out="$(cd "$out" && pwd)"
build="$REPO_ROOT/build/gpu-validate"
mkdir -p "$build"
buildlog="$out/build.log"
: >"$buildlog"

# ---- the interpreter ----------------------------------------------------------------------------
if [[ -n "${PYTHON:-}" ]]; then
    py="$PYTHON"
elif [[ $fake == 0 ]] && command -v python3 >/dev/null && python3 -c 'import torch' 2>/dev/null; then
    py="$(command -v python3)"
elif [[ -x "$REPO_ROOT/.venv/bin/python" ]]; then
    py="$REPO_ROOT/.venv/bin/python"
else
    py="$(command -v python3)"
fi

# ---- this checkout's packages, importable as installed (the folders that hold them) ----------
# neuronetes/ is at the root; neuronetes_operator, neuronetes_extender and neuronetes_agent are in
# operator/, extender/ and node-agent/ (docs/architecture.md, "Packages").
pythonpath="$REPO_ROOT:$REPO_ROOT/operator:$REPO_ROOT/extender:$REPO_ROOT/node-agent"
if [[ -n "$wheels" ]]; then
    echo ">> installing $(ls "$wheels"/*.whl | wc -l) wheels from $wheels (offline, for this run)" >&2
    rm -rf "$build/site"
    "$py" -m pip install -q --no-index --no-deps --no-compile --disable-pip-version-check \
        --target "$build/site" "$wheels"/*.whl >>"$buildlog" 2>&1 \
        || echo "WARNING: the wheels did not install (see $buildlog)" >&2
    pythonpath="$pythonpath:$build/site"
fi
export PYTHONPATH="$pythonpath${PYTHONPATH:+:$PYTHONPATH}"

# ---- the shim and the launch probe -------------------------------------------------------------
shim_make() { make -s -C "$REPO_ROOT/node-agent/shim" PYTHON="$py" "$@" >>"$buildlog" 2>&1; }
runner_args=()
if [[ $fake == 1 ]]; then
    shim_build="$REPO_ROOT/node-agent/shim/build/release"
    echo ">> building the shim, the fake driver and the launch probe (make -C node-agent/shim)" >&2
    shim_make || echo "WARNING: the shim build failed (see $buildlog)" >&2
    runner_args+=(--fake --fake-lib-dir "$shim_build/fake")
    # every process of the run, the runner's own NVML included, finds the fake driver
    export LD_LIBRARY_PATH="$shim_build/fake${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
else
    include=""
    for dir in "${CUDA_HOME:-/usr/local/cuda}/include" /usr/local/cuda/targets/x86_64-linux/include \
        /usr/local/cuda/targets/sbsa-linux/include; do
        if [[ -f "$dir/cuda.h" && -f "$dir/nvml.h" ]]; then include="$dir"; break; fi
    done
    shim_build="$build/shim/release"
    echo ">> building the shim and the launch probe against ${include:-the CUDA headers of the venv}" >&2
    shim_make ${include:+CUDA_INCLUDE="$include"} BUILD="$build/shim" \
        "$shim_build/lib/libneuronetes-cuda.so" "$shim_build/launch_probe" \
        || echo "WARNING: the shim build failed (see $buildlog); the checks that need it will fail" >&2
    command -v nvidia-smi >/dev/null && nvidia-smi -q -x >"$out/nvidia-smi.xml" 2>>"$buildlog" || true
fi
[[ -n "$only" ]] && runner_args+=(--only "$only")

# `python -m` puts the working directory first on sys.path: run from the output folder, where the
# checks write, so nothing there stands in for a module.
cd "$out"
exec "$py" -m neuronetes.gpuvalidate --out "$out" --shim "$shim_build/lib/libneuronetes-cuda.so" \
    --launch-probe "$shim_build/launch_probe" "${runner_args[@]}"
