#!/usr/bin/env bash
# Install the Debian packages the real dev-cluster nodes need (`neuronetes dev cluster up
# --real-nodes N`), only those missing, only as root on a Debian-like machine; otherwise say what
# is missing and succeed (the tests that need them skip with that reason).
#
#   runc                         the OCI runtime containerd's runc shim calls
#   containernetworking-plugins  the CNI `loopback` plugin: a pod's own network namespace, lo only
#   busybox-static               the static busybox the local test image is made of
#
# usage: hack/install-node-packages.sh
set -euo pipefail

# package:a file it installs (what says it is there)
NEEDED=(
    runc:/usr/sbin/runc
    containernetworking-plugins:/usr/lib/cni/loopback
    busybox-static:/bin/busybox
)

missing=()
for entry in "${NEEDED[@]}"; do
    [[ -x "${entry#*:}" ]] || missing+=("${entry%%:*}")
done
[[ ${#missing[@]} -gt 0 ]] || exit 0
# shellcheck source=hack/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
neuronetes_install_debian_packages "${missing[@]}" \
    || echo "WARNING: could not install ${missing[*]}: the real-node tests will skip" >&2
