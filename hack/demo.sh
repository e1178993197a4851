#!/usr/bin/env bash
# Set up the virtual environment, then run the placement-quality simulation on the openb
# trace (FGD protocol, seeds 42-44) and compare it with the FGD authors' results.
#   NEURONETES_TRACE_DIR  folder of the openb CSVs     (default ../shared/data/openb/csv)
#   NEURONETES_FGD_DIR    folder of the FGD results    (default ../shared/data/fgd-expected)
# Writes out/demo.json.
set -euo pipefail

# shellcheck source=hack/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$REPO_ROOT"
neuronetes_setup_venv

DATA="${NEURONETES_TRACE_DIR:-$REPO_ROOT/../shared/data/openb/csv}"
FGD="${NEURONETES_FGD_DIR:-$REPO_ROOT/../shared/data/fgd-expected}"
mkdir -p out

neuronetes simulate \
    --nodes "$DATA/openb_node_list_gpu_node.csv" \
    --pods "$DATA/openb_pod_list_default.csv" \
    --policy bestfit,fgd,default \
    --seeds 42-44 \
    --tune 1.3 \
    --compare "$FGD" \
    --json out/demo.json \
    --plot out/demo.png
