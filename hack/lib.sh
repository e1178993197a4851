# Shared setup for hack/*.sh: source it, don't run it.
#
# Sets REPO_ROOT, creates the virtual environment at $REPO_ROOT/.venv when it is missing,
# installs the project into it (editable, with the dev extra) and puts it first on PATH.
# NEURONETES_VENV overrides the venv location; PYTHON the interpreter used to create it.

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export REPO_ROOT

neuronetes_setup_venv() {
    local venv
    venv="$(realpath -m "${NEURONETES_VENV:-$REPO_ROOT/.venv}")"
    local python="${PYTHON:-python3}"
    # Run from /, so the working directory's folders never stand in for installed modules.
    if [[ ! -x "$venv/bin/python" ]]; then
        echo ">> creating virtual environment $venv" >&2
        (cd / && "$python" -m venv "$venv")
    fi
    echo ">> installing neuronetes[dev] into $venv" >&2
    (cd / && PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1 \
        "$venv/bin/python" -m pip install -q -e "$REPO_ROOT[dev]")
    export VIRTUAL_ENV="$venv"
    export PATH="$venv/bin:$PATH"
}
