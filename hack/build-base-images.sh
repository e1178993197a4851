#!/usr/bin/env bash
# Make the Dockerfile's two base images locally, from Debian's packages, where no container
# registry can be reached (the Dockerfile keeps the upstream defaults; hack/build-image.sh passes
# these as --build-arg):
#
#   localhost/neuronetes-base/debian:bookworm-minbase    debootstrap --variant=minbase bookworm
#                                                         (+ ca-certificates), the other two's base
#   localhost/neuronetes-base/python:3.11-bookworm        stands in for python:3.11-slim-bookworm
#   localhost/neuronetes-base/golang:1.26-bookworm        stands in for golang:1.26-bookworm
#
# The python image is Debian's own Python 3.11 arranged so the Dockerfile's commands work as in the
# slim image: `python`/`python3`/`pip` on PATH, `python -m venv` (python3-venv's ensurepip), and
# root's pip may install into the system (/usr/local/lib/python3.11/dist-packages: Debian's
# EXTERNALLY-MANAGED marker is removed, the upstream image has none). The golang image is the
# minbase with this machine's Go toolchain (GO's GOROOT) at /usr/local/go, as upstream lays it out;
# its version must match the Dockerfile's GO_IMAGE tag (Debian bookworm's golang-go is 1.19).
#
# Cached like hack/build-control-plane.sh: the debootstrapped rootfs is a tarball under
# $CACHE_ROOT/base with a stamp (suite, mirror, recipe); every image carries its stamp as a label
# and is rebuilt only when that label differs (a new recipe, Go version or rootfs). --force
# rebuilds all. Debian's suite is pinned, not its point release: deb.debian.org serves only the
# newest, and snapshot.debian.org cannot be reached here; the rootfs's package list is written
# beside its tarball.
#
# usage: hack/build-base-images.sh [--force]     (root; installs buildah and debootstrap if missing)
set -euo pipefail

# shellcheck source=hack/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# Bump when the way an image is made changes: images and rootfs from older recipes are rebuilt.
RECIPE=1
SUITE=bookworm
MIRROR="${NEURONETES_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
CACHE_ROOT="${NEURONETES_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/neuronetes}"
BASE_CACHE="$CACHE_ROOT/base"
STAMP_LABEL=org.neuronetes.base.stamp
GO="${GO:-$(command -v go || echo /usr/local/go/bin/go)}"

MINBASE_IMAGE=localhost/neuronetes-base/debian:$SUITE-minbase
PYTHON_IMAGE=localhost/neuronetes-base/python:3.11-$SUITE
GO_IMAGE_TAG="$(sed -n 's/^ARG GO_IMAGE=golang:\([0-9.]*\)-.*$/\1/p' "$REPO_ROOT/Dockerfile")"
GO_IMAGE=localhost/neuronetes-base/golang:$GO_IMAGE_TAG-$SUITE
BASE_PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

FORCE=0
for arg in "$@"; do
    case "$arg" in
        --force) FORCE=1 ;;
        -h|--help) sed -n '2,/^set /{/^#/p}' "${BASH_SOURCE[0]}"; exit 0 ;;
        *) echo "build-base-images: unknown argument $arg" >&2; exit 2 ;;
    esac
done

die() { echo "build-base-images: $*" >&2; exit 1; }
[[ "$(id -u)" == 0 ]] || die "needs root (debootstrap, buildah's storage)"
[[ -n "$GO_IMAGE_TAG" ]] || die "no 'ARG GO_IMAGE=golang:X.Y-…' in $REPO_ROOT/Dockerfile"
neuronetes_install_debian_packages buildah debootstrap runc || die "buildah, debootstrap, runc are needed"

START_ALL=$SECONDS
log() { printf '>> [%4ds] %s\n' "$((SECONDS - START_ALL))" "$*" >&2; }

# Everything this run creates that outlives a failure: working containers, debootstrap's mounts.
containers=()
target=""
cleanup() {
    local c m
    for c in "${containers[@]}"; do buildah rm "$c" >/dev/null 2>&1 || true; done
    if [[ -n "$target" ]]; then
        # debootstrap mounts /proc and /sys in the target and leaves them when it fails: deepest first.
        while read -r m; do umount -l "$m" 2>/dev/null || true; done \
            < <(findmnt -rn -o TARGET | grep -F "$target/" | sort -r)
        rm -rf "$target"
    fi
}
trap cleanup EXIT

mkdir -p "$BASE_CACHE"
exec 9>"$BASE_CACHE/.build.lock"
flock -n 9 || { log "another build-base-images.sh holds $BASE_CACHE/.build.lock; waiting"; flock 9; }

image_stamp() { buildah inspect --type image --format "{{index .OCIv1.Config.Labels \"$STAMP_LABEL\"}}" "$1" 2>/dev/null || true; }
up_to_date() { [[ $FORCE -eq 0 && "$(image_stamp "$1")" == "$2" ]]; }

# working_container FROM: a working container of FROM in `ctr`, removed on exit unless committed.
working_container() {
    ctr="$(buildah from --pull=never "$1")"
    containers+=("$ctr")
}

# commit CONTAINER IMAGE STAMP: the image's config as the upstream ones have it, then commit.
commit() {
    local ctr="$1" image="$2" stamp="$3"
    shift 3
    buildah config --label "$STAMP_LABEL=$stamp" --env "LANG=C.UTF-8" "$@" "$ctr"
    buildah commit -q --rm "$ctr" "$image" >/dev/null
    containers=("${containers[@]/$ctr/}")
}

# ---- the rootfs: debootstrap minbase, as a cached tarball ------------------------------------
ROOTFS_TAR="$BASE_CACHE/debian-$SUITE-minbase.tar"
ROOTFS_STAMP="debian $SUITE minbase +ca-certificates from $MIRROR recipe $RECIPE"
if [[ $FORCE -eq 1 || ! -s "$ROOTFS_TAR" || "$(cat "$ROOTFS_TAR.stamp" 2>/dev/null)" != "$ROOTFS_STAMP" ]]; then
    t0=$SECONDS
    target="$(mktemp -d "$BASE_CACHE/.rootfs.XXXXXX")"
    log "debian $SUITE: debootstrap --variant=minbase from $MIRROR (~2 min)"
    debootstrap --variant=minbase --include=ca-certificates "$SUITE" "$target" "$MIRROR" \
        >"$BASE_CACHE/debootstrap.log" 2>&1 || { tail -20 "$BASE_CACHE/debootstrap.log" >&2; die "debootstrap failed"; }
    # What upstream's images drop too: package lists and caches (the Dockerfile runs apt-get update).
    rm -rf "$target"/var/lib/apt/lists/* "$target"/var/cache/apt/*.bin "$target"/var/cache/apt/archives/*.deb
    chroot "$target" dpkg-query -W >"$ROOTFS_TAR.packages"
    tar --numeric-owner --xattrs -C "$target" -cf "$ROOTFS_TAR.tmp" .
    mv "$ROOTFS_TAR.tmp" "$ROOTFS_TAR"
    echo "$ROOTFS_STAMP" >"$ROOTFS_TAR.stamp"
    rm -rf "$target"
    target=""
    log "debian $SUITE: rootfs in $((SECONDS - t0)) s -> $ROOTFS_TAR ($(wc -l <"$ROOTFS_TAR.packages") packages)"
else
    log "debian $SUITE: rootfs up to date ($ROOTFS_TAR)"
fi
ROOTFS_ID="$(sha256sum "$ROOTFS_TAR" | cut -c1-16)"

# ---- the minbase image: the rootfs as one layer ----------------------------------------------
stamp="$ROOTFS_STAMP rootfs $ROOTFS_ID"
if up_to_date "$MINBASE_IMAGE" "$stamp"; then
    log "$MINBASE_IMAGE: up to date"
else
    t0=$SECONDS
    working_container scratch
    buildah add "$ctr" "$ROOTFS_TAR" / >/dev/null   # a local tarball is extracted
    commit "$ctr" "$MINBASE_IMAGE" "$stamp" --env "PATH=$BASE_PATH" --cmd /bin/bash
    log "$MINBASE_IMAGE: built in $((SECONDS - t0)) s"
fi
base_stamp="$stamp"

# ---- python:3.11 (Debian's) ------------------------------------------------------------------
stamp="python 3.11 recipe $RECIPE on $base_stamp"
if up_to_date "$PYTHON_IMAGE" "$stamp"; then
    log "$PYTHON_IMAGE: up to date"
else
    t0=$SECONDS
    working_container "$MINBASE_IMAGE"
    log "$PYTHON_IMAGE: apt-get install python3 python3-venv python3-pip python-is-python3"
    buildah run --network host "$ctr" -- sh -euc '
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
            python3 python3-venv python3-pip python-is-python3 >/dev/null
        rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /var/cache/apt/archives/*.deb
        # The slim image lets root pip-install into the system Python; so does this one.
        rm -f /usr/lib/python3.*/EXTERNALLY-MANAGED
        [ -x /usr/bin/pip ] || ln -s pip3 /usr/bin/pip
        python --version; pip --version >/dev/null; python -m venv --help >/dev/null'
    commit "$ctr" "$PYTHON_IMAGE" "$stamp" --env "PATH=$BASE_PATH" --cmd python3
    log "$PYTHON_IMAGE: built in $((SECONDS - t0)) s"
fi

# ---- golang (this machine's toolchain) -------------------------------------------------------
go_version="$("$GO" env GOVERSION)"
goroot="$("$GO" env GOROOT)"
[[ "$go_version" == "go$GO_IMAGE_TAG" || "$go_version" == "go$GO_IMAGE_TAG."* ]] \
    || die "$GO is $go_version, the Dockerfile's GO_IMAGE wants golang:$GO_IMAGE_TAG (set GO=)"
stamp="$go_version recipe $RECIPE on $base_stamp"
if up_to_date "$GO_IMAGE" "$stamp"; then
    log "$GO_IMAGE: up to date ($go_version)"
else
    t0=$SECONDS
    working_container "$MINBASE_IMAGE"
    log "$GO_IMAGE: $goroot ($go_version) -> /usr/local/go"
    buildah copy "$ctr" "$goroot" /usr/local/go >/dev/null
    buildah run --network none "$ctr" -- sh -euc 'mkdir -p /go/bin /go/src && chmod -R 1777 /go && /usr/local/go/bin/go version' >&2
    # As upstream's image: GOPATH=/go, the toolchain on PATH, no toolchain downloads.
    commit "$ctr" "$GO_IMAGE" "$stamp" --env "PATH=/go/bin:/usr/local/go/bin:$BASE_PATH" \
        --env GOPATH=/go --env GOTOOLCHAIN=local --workingdir /go --cmd /bin/bash
    log "$GO_IMAGE: built in $((SECONDS - t0)) s"
fi

log "base images ready in $((SECONDS - START_ALL)) s: $PYTHON_IMAGE, $GO_IMAGE"
