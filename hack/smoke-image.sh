#!/usr/bin/env bash
# Smoke-test the built image from inside it: the same `build-image-contents.sh smoke` that
# hack/test.sh runs outside a container (every entry point's --help and --version, the NRI
# plugin's -help, the shim over the fake driver), run in a container of the image as the image's
# own user, with no network, the checkout mounted read-only at /src.
#
# The image has no compiler, so the fake driver (libcuda.so.1, libnvidia-ml.so.1 of
# node-agent/shim) is built first in the Dockerfile's `shim` stage (the same compiler and headers
# as the image's shim; its layers are cached from the image's build) into a temporary folder the
# smoke run reads.
#
# usage: hack/smoke-image.sh [IMAGE]     (default localhost/neuronetes:VERSION; build it first
#                                          with hack/build-image.sh). Root only.
set -euo pipefail

# shellcheck source=hack/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

VERSION="$(sed -n 's/^version = "\(.*\)"$/\1/p' "$REPO_ROOT/pyproject.toml" | head -1)"
die() { echo "smoke-image: $*" >&2; exit 1; }
case "${1:-}" in
    -h|--help) sed -n '2,/^set /{/^#/p}' "${BASH_SOURCE[0]}"; exit 0 ;;
    -*) die "unknown option $1" ;;
esac
[[ $# -le 1 ]] || die "one IMAGE at most"
image="${1:-localhost/neuronetes:$VERSION}"
shim_image="localhost/neuronetes/build-shim:$VERSION"
[[ "$(id -u)" == 0 ]] || die "needs root (buildah's storage)"
buildah inspect --type image "$image" >/dev/null 2>&1 || die "no image $image (hack/build-image.sh builds it)"

containers=()
fake_build="$(mktemp -d)"
cleanup() {
    local c
    for c in "${containers[@]}"; do buildah rm "$c" >/dev/null 2>&1 || true; done
    rm -rf "$fake_build"
}
trap cleanup EXIT

bash "$REPO_ROOT/hack/build-image.sh" --target shim --tag "$shim_image"
echo ">> the fake driver, built in $shim_image" >&2
ctr="$(buildah from --pull=never "$shim_image")"
containers+=("$ctr")
buildah run --network none --volume "$fake_build:/fake-build" "$ctr" -- \
    make -s -C /src/node-agent/shim BUILD=/fake-build \
    /fake-build/release/fake/libcuda.so.1 /fake-build/release/fake/libnvidia-ml.so.1
chmod -R a+rX "$fake_build"

echo ">> build-image-contents.sh smoke / in $image (--network none, the image's user)" >&2
ctr="$(buildah from --pull=never "$image")"
containers+=("$ctr")
buildah run --network none --env SHIM_BUILD=/fake-build \
    --volume "$REPO_ROOT:/src:ro" --volume "$fake_build:/fake-build:ro" "$ctr" -- \
    bash /src/hack/build-image-contents.sh smoke /
