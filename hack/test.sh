#!/usr/bin/env bash
# Set up the virtual environment, then lint (ruff), type-check (mypy) and run every test (pytest).
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

echo ">> pytest" >&2
status=0
pytest "$@" || status=$?
if [[ $status -eq 5 ]]; then
    echo "FAILED: pytest collected no tests" >&2
    exit 1
fi
exit "$status"
