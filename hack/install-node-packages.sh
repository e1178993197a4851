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
if [[ "$(id -u)" != 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
    echo "WARNING: real-node packages missing (${missing[*]}): the real-node tests will skip" >&2
    exit 0
fi
echo ">> apt-get install ${missing[*]}" >&2
# A fresh machine may have no package lists yet: refresh them once if the first try fails.
{ DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null 2>&1 \
    || { apt-get update -qq >/dev/null 2>&1 \
         && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null; }; } \
    || echo "WARNING: could not install ${missing[*]}: the real-node tests will skip" >&2
