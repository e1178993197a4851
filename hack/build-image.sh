#!/usr/bin/env bash
# Build the repository's Dockerfile with buildah, from the local base images of
# hack/build-base-images.sh (made first; cached), into buildah's local storage (root's:
# /var/lib/containers/storage) and, for the whole image, an OCI archive containerd imports:
#
#   ctr -n k8s.io images import $CACHE_ROOT/images/neuronetes-VERSION.oci.tar
#
# The archive's ref name is the image's full name, which ctr keeps (its --base-name only prefixes
# tag-only names): the node then has localhost/neuronetes:VERSION (the chart's
# image.repository=localhost/neuronetes, pullPolicy IfNotPresent, pulls nothing).
#
# The Dockerfile keeps its upstream defaults (python:3.11-slim-bookworm, golang:1.26-bookworm);
# they are replaced here by --build-arg, and nothing is pulled (--pull=never). The build's RUN
# steps share the host's network (--network host: pip's packages from PyPI, the NRI plugin's
# modules from the Go module proxy) and nothing more. Layers are cached (--layers): an unchanged
# step is not run again. The RUN steps see this machine's CA bundle (mounted read-only over the
# image's, never committed): where egress goes through a TLS-inspecting proxy, its CA is trusted
# only there (NEURONETES_BUILD_CA_BUNDLE overrides the file; empty: mount none). Prints the build
# time and the image's size.
#
# usage: hack/build-image.sh [--target STAGE] [--tag IMAGE] [--dockerfile FILE]
#   --tag         the image's name (default localhost/neuronetes:VERSION, VERSION from pyproject.toml)
#   --target      build only a stage of the Dockerfile (nri, shim, wheel); no archive is written
#   --dockerfile  another Dockerfile of the repository (default Dockerfile), e.g. the real-node
#                 tests' tests/images/gpu-probe/Dockerfile; the context is the repository
# The archive is named after the image: localhost/NAME:TAG -> $CACHE_ROOT/images/NAME-TAG.oci.tar.
# Root only; installs buildah (and what hack/build-base-images.sh needs) if missing.
set -euo pipefail

# shellcheck source=hack/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

CACHE_ROOT="${NEURONETES_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/neuronetes}"
VERSION="$(sed -n 's/^version = "\(.*\)"$/\1/p' "$REPO_ROOT/pyproject.toml" | head -1)"
PYTHON_BASE=localhost/neuronetes-base/python:3.11-bookworm
GO_BASE=localhost/neuronetes-base/golang:1.26-bookworm

die() { echo "build-image: $*" >&2; exit 1; }
image="localhost/neuronetes:$VERSION"
target=""
dockerfile="$REPO_ROOT/Dockerfile"
while [[ $# -gt 0 ]]; do
    case "$1" in
        --tag) image="${2:?--tag IMAGE}"; shift 2 ;;
        --target) target="${2:?--target STAGE}"; shift 2 ;;
        --dockerfile) dockerfile="$(realpath "${2:?--dockerfile FILE}")"; shift 2 ;;
        -h|--help) sed -n '2,/^set /{/^#/p}' "${BASH_SOURCE[0]}"; exit 0 ;;
        *) die "unknown argument $1" ;;
    esac
done
[[ "$(id -u)" == 0 ]] || die "needs root (buildah's storage)"
CA_BUNDLE="${NEURONETES_BUILD_CA_BUNDLE-/etc/ssl/certs/ca-certificates.crt}"
ca_mount=()
if [[ -n "$CA_BUNDLE" && -s "$CA_BUNDLE" ]]; then
    ca_mount=(--volume "$(realpath "$CA_BUNDLE"):/etc/ssl/certs/ca-certificates.crt:ro")
fi

bash "$REPO_ROOT/hack/build-base-images.sh"

base_name="${image##*/}"                 # NAME:TAG
archive="$CACHE_ROOT/images/${base_name%%:*}-${base_name##*:}.oci.tar"
log="$CACHE_ROOT/build-image-${base_name%%:*}.log"
mkdir -p "$CACHE_ROOT"
t0=$SECONDS
echo ">> buildah build ${target:+--target $target }-t $image (from $PYTHON_BASE, $GO_BASE)" >&2
buildah build --layers --force-rm --pull=never --network host "${ca_mount[@]}" \
    --build-arg "PYTHON_IMAGE=$PYTHON_BASE" --build-arg "GO_IMAGE=$GO_BASE" \
    ${target:+--target "$target"} -t "$image" -f "$dockerfile" "$REPO_ROOT" \
    >"$log" 2>&1 || { tail -40 "$log" >&2; die "buildah build failed (log: $log)"; }
size="$(buildah images --format '{{.Size}}' "$image" | head -1)"
echo ">> built $image in $((SECONDS - t0)) s ($size)" >&2

# The archive for containerd, rewritten only when the image changed (its ID beside it).
if [[ -z "$target" ]]; then
    id="$(buildah inspect --type image --format '{{.FromImageID}}' "$image")"
    if [[ ! -s "$archive" || "$(cat "$archive.id" 2>/dev/null)" != "$id" ]]; then
        mkdir -p "$(dirname "$archive")"
        rm -f "$archive.tmp"
        buildah push -q "$image" "oci-archive:$archive.tmp:$image" >/dev/null
        mv "$archive.tmp" "$archive"
        echo "$id" >"$archive.id"
    fi
    echo ">> $archive ($(du -h "$archive" | cut -f1); image ID ${id:0:12})" >&2
fi
