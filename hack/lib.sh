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

# neuronetes_install_debian_packages PACKAGE...: the Debian packages a hack/ script needs, installed
# in one place, the same way everywhere: only those missing, only as root with apt-get (without
# recommends), the package lists refreshed once when the first try fails (a fresh machine may have
# none). Returns non-zero when a package is still missing; the caller decides whether that is fatal.
neuronetes_install_debian_packages() {
    local missing=() p
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
    done
    [[ ${#missing[@]} -eq 0 ]] && return 0
    if [[ "$(id -u)" != 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
        echo "missing Debian packages: ${missing[*]} (install them, or run as root with apt-get)" >&2
        return 1
    fi
    echo ">> apt-get install ${missing[*]}" >&2
    { DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null 2>&1 \
        || { apt-get update -qq >/dev/null 2>&1 \
             && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; }; }
}
