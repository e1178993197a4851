#!/usr/bin/env bash
# Set up the virtual environment and the local control plane (built once from the Go module
# proxy, cached under ~/.cache/neuronetes), then run the demo: a local cluster with simulated GPU
# nodes (kwok), NeuroNetes installed by its Helm chart (helm/neuronetes, hack/local-values.yaml;
# the chart's pods run as host processes exactly as rendered: docs/dev-cluster.md, "Chart mode"),
# sample GPU pods (whole GPUs, NVLink, shared slices, MIG, a gang, one that fits nowhere) and where each
# landed and why, read from the API (pods, their assignment annotation, Events).
#   NEURONETES_DEMO_KEEP=1   leave the cluster running (neuronetes dev cluster down --name demo)
# The placement-quality simulation on the openb traces: see README ("Simulator").
set -euo pipefail

# shellcheck source=hack/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$REPO_ROOT"
neuronetes_setup_venv

echo ">> hack/build-control-plane.sh (a no-op once built)" >&2
bash "$REPO_ROOT/hack/build-control-plane.sh"

args=()
if [[ "${NEURONETES_DEMO_KEEP:-0}" == 1 ]]; then
    args+=(--keep)
fi
# Not from the checkout's root: its operator/ folder would shadow Python's operator module.
cd /
neuronetes demo "${args[@]}"
