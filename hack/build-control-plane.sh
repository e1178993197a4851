#!/usr/bin/env bash
# Build the local control plane from the Go module proxy, pinned by hack/versions.env:
#
#   etcd                                         -> $BIN_ROOT/etcd-$ETCD_VERSION/etcd
#   kube-apiserver, kube-controller-manager,
#   kube-scheduler, kubectl                      -> $BIN_ROOT/kubernetes-$KUBERNETES_VERSION/
#   kwok (+ stages.yaml: kwok's "fast" stages)   -> $BIN_ROOT/kwok-$KWOK_VERSION/
#   helm                                         -> $BIN_ROOT/helm-$HELM_VERSION/helm
#   kubelet (same wrapper module as kubernetes)  -> $BIN_ROOT/kubelet-$KUBERNETES_VERSION/kubelet
#   containerd, containerd-shim-runc-v2, ctr     -> $BIN_ROOT/containerd-$CONTAINERD_VERSION/
#
# kubelet and containerd are the real nodes' binaries (`neuronetes dev cluster up --real-nodes N`);
# runc comes from Debian's package (hack/install-node-packages.sh). The kubelet has its own folder
# and stamp so that a checkout without it never rebuilds the control-plane folder, nor the reverse.
#
# BIN_ROOT is $NEURONETES_BIN_DIR, else ${XDG_CACHE_HOME:-~/.cache}/neuronetes/bin. Every tool is
# built only when its folder lacks a stamp for its pinned version (and this script's recipe), so a
# second run is a no-op and a version bump rebuilds that tool alone.
#
# usage: hack/build-control-plane.sh [--force] [TOOL...]
#        TOOL: etcd kubernetes kwok helm kubelet containerd (default: all)
#
# Kubernetes: k8s.io/kubernetes replaces its staging modules (k8s.io/api, …) with local folders, so
# `go install k8s.io/kubernetes/cmd/…@vX` cannot work. A wrapper module requires
# k8s.io/kubernetes vX.Y.Z and replaces every staging module (read from that release's own go.mod)
# with v0.Y.Z; the ldflags set the version /version reports. etcd's server module has relative
# replaces too, so it gets a wrapper module as well. kwok and helm build with `go install`.
#
# Knobs: GO (go binary), NEURONETES_BUILD_JOBS (parallel compile jobs; default: CPU count),
# NEURONETES_SKIP_KUBE_CONTROLLER_MANAGER=1 (build without kube-controller-manager).
set -euo pipefail

HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=hack/versions.env
source "$HACK_DIR/versions.env"

# Bump when the way a tool is built changes (flags, outputs): stamps from older recipes rebuild.
RECIPE=3

CACHE_ROOT="${NEURONETES_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/neuronetes}"
BIN_ROOT="${NEURONETES_BIN_DIR:-$CACHE_ROOT/bin}"
WORK_ROOT="$CACHE_ROOT/build"

GO="${GO:-$(command -v go || echo /usr/local/go/bin/go)}"
if [[ ! -x "$GO" ]] && ! command -v "$GO" >/dev/null 2>&1; then
    echo "build-control-plane: no Go toolchain (set GO=/path/to/go)" >&2
    exit 1
fi
JOBS="${NEURONETES_BUILD_JOBS:-$(nproc 2>/dev/null || echo 2)}"
export GOMAXPROCS="$JOBS"
export GOFLAGS="-trimpath -buildvcs=false -modcacherw ${GOFLAGS:-}"
export CGO_ENABLED=0          # static binaries, no C toolchain needed
export GOTOOLCHAIN="${GOTOOLCHAIN:-local}"
export GOWORK=off
BUILD_DATE="1970-01-01T00:00:00Z"   # reproducible

FORCE=0
TOOLS=()
for arg in "$@"; do
    case "$arg" in
        --force) FORCE=1 ;;
        -h|--help) sed -n '2,31p' "${BASH_SOURCE[0]}"; exit 0 ;;
        etcd|kubernetes|kwok|helm|kubelet|containerd) TOOLS+=("$arg") ;;
        *) echo "build-control-plane: unknown argument $arg" >&2; exit 2 ;;
    esac
done
[[ ${#TOOLS[@]} -gt 0 ]] || TOOLS=(etcd kubernetes kwok helm kubelet containerd)

# `go get` reports every module it adds to the wrapper's go.mod: keep the downloads as progress,
# drop that bookkeeping.
go_quiet() {
    "$GO" "$@" 2>&1 | { grep -v -E '^go: (added|upgraded|downgraded) ' || true; } >&2
}

START_ALL=$SECONDS
mkdir -p "$BIN_ROOT" "$WORK_ROOT"
# One build at a time per cache (parallel test sessions may all ask for the same binaries).
exec 9>"$BIN_ROOT/.build.lock"
if ! flock -n 9; then
    echo ">> another build-control-plane.sh holds $BIN_ROOT/.build.lock; waiting" >&2
    flock 9
fi
cleanup() {
    rm -rf "$BIN_ROOT"/.etcd.* "$BIN_ROOT"/.kubernetes.* "$BIN_ROOT"/.kwok.* "$BIN_ROOT"/.helm.* \
        "$BIN_ROOT"/.kubelet.* "$BIN_ROOT"/.containerd.*
}
trap cleanup EXIT
log() { printf '>> [%4ds] %s\n' "$((SECONDS - START_ALL))" "$*" >&2; }

# up_to_date DIR STAMP BIN...: the stamp matches and every binary is there.
up_to_date() {
    local dir="$1" stamp="$2"
    shift 2
    [[ $FORCE -eq 0 && -f "$dir/.stamp" && "$(cat "$dir/.stamp")" == "$stamp" ]] || return 1
    local b
    for b in "$@"; do [[ -x "$dir/$b" ]] || return 1; done
}

# finish DIR STAMP TMPDIR: move a finished build into place atomically-ish.
finish() {
    local dir="$1" stamp="$2" tmp="$3"
    echo "$stamp" >"$tmp/.stamp"
    chmod 755 "$tmp"
    rm -rf "$dir"
    mv -T "$tmp" "$dir"
}

build_etcd() {
    local v="$ETCD_VERSION" dir="$BIN_ROOT/etcd-$ETCD_VERSION" stamp="etcd $ETCD_VERSION recipe $RECIPE"
    if up_to_date "$dir" "$stamp" etcd; then log "etcd $v: up to date ($dir)"; return; fi
    local t0=$SECONDS work="$WORK_ROOT/etcd-$v"
    mkdir -p "$work" "$BIN_ROOT"
    cat >"$work/go.mod" <<EOF
module neuronetes.local/build/etcd

go 1.26
EOF
    rm -f "$work/go.sum"
    log "etcd $v: resolving go.etcd.io/etcd/server/v3 (wrapper module $work)"
    (cd "$work" && go_quiet get "go.etcd.io/etcd/server/v3@$v")
    log "etcd $v: compiling"
    local tmp
    tmp="$(mktemp -d "$BIN_ROOT/.etcd.XXXXXX")"
    (cd "$work" && "$GO" build -p "$JOBS" -ldflags "-s -w" -o "$tmp/etcd" go.etcd.io/etcd/server/v3)
    finish "$dir" "$stamp" "$tmp"
    log "etcd $v: built in $((SECONDS - t0)) s -> $dir/etcd"
}

# kubernetes_wrapper V WORK: write WORK/go.mod, a module requiring k8s.io/kubernetes V with every
# staging module replaced by its v0.Y.Z release (read from that release's own go.mod).
kubernetes_wrapper() {
    local v="$1" work="$2"
    local staging_version="v0.${v#v1.}"
    mkdir -p "$work"
    printf 'module neuronetes.local/build/kubernetes\n\ngo 1.26\n' >"$work/go.mod"
    rm -f "$work/go.sum"
    log "kubernetes $v: downloading k8s.io/kubernetes (~20 MB) to read its staging modules"
    local gomod
    gomod="$(cd "$work" && "$GO" mod download -json "k8s.io/kubernetes@$v" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",*$/\1/p')"
    [[ -f "$gomod" ]] || { echo "kubernetes $v: cannot download k8s.io/kubernetes@$v" >&2; exit 1; }
    local staging=()
    mapfile -t staging < <(sed -n 's|^[[:space:]]*\(k8s\.io/[a-z0-9.-]*\) => \./staging/src/.*$|\1|p' "$gomod")
    [[ ${#staging[@]} -gt 20 ]] || { echo "kubernetes $v: found only ${#staging[@]} staging modules in $gomod" >&2; exit 1; }
    {
        printf 'module neuronetes.local/build/kubernetes\n\ngo 1.26\n\nrequire k8s.io/kubernetes %s\n\nreplace (\n' "$v"
        local m
        for m in "${staging[@]}"; do printf '\t%s => %s %s\n' "$m" "$m" "$staging_version"; done
        printf ')\n'
    } >"$work/go.mod"
    log "kubernetes $v: ${#staging[@]} staging modules pinned to $staging_version"
}

# kubernetes_compile V WORK OUT BIN...: resolve and build k8s.io/kubernetes/cmd/BIN... into OUT,
# with the version /version reports.
kubernetes_compile() {
    local v="$1" work="$2" out="$3"
    shift 3
    local minor="${v#v}"
    minor="${minor#*.}"
    minor="${minor%%.*}"
    local pkgs=() b
    for b in "$@"; do pkgs+=("k8s.io/kubernetes/cmd/$b"); done
    log "kubernetes $v: resolving dependencies of $*"
    (cd "$work" && go_quiet get "${pkgs[@]/%/@$v}")
    local ldflags="-s -w" pkgpath
    for pkgpath in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        ldflags+=" -X $pkgpath.gitVersion=$v -X $pkgpath.gitMajor=1 -X $pkgpath.gitMinor=$minor"
        ldflags+=" -X $pkgpath.gitTreeState=clean -X $pkgpath.buildDate=$BUILD_DATE"
    done
    log "kubernetes $v: compiling $* with $JOBS jobs"
    (cd "$work" && "$GO" build -p "$JOBS" -ldflags "$ldflags" -o "$out/" "${pkgs[@]}")
}

build_kubernetes() {
    local v="$KUBERNETES_VERSION" dir="$BIN_ROOT/kubernetes-$KUBERNETES_VERSION"
    local bins=(kube-apiserver kube-scheduler kubectl)
    if [[ "${NEURONETES_SKIP_KUBE_CONTROLLER_MANAGER:-0}" != 1 ]]; then bins+=(kube-controller-manager); fi
    local stamp="kubernetes $v [${bins[*]}] recipe $RECIPE"
    if up_to_date "$dir" "$stamp" "${bins[@]}"; then log "kubernetes $v: up to date ($dir)"; return; fi
    local t0=$SECONDS work="$WORK_ROOT/kubernetes-$v" tmp
    mkdir -p "$BIN_ROOT"
    kubernetes_wrapper "$v" "$work"
    log "kubernetes $v: the long part: ~7 min cold on 2 cores"
    tmp="$(mktemp -d "$BIN_ROOT/.kubernetes.XXXXXX")"
    kubernetes_compile "$v" "$work" "$tmp" "${bins[@]}"
    finish "$dir" "$stamp" "$tmp"
    log "kubernetes $v: built in $((SECONDS - t0)) s -> $dir"
}

# The kubelet, from the same wrapper module as the control plane (CGO off like the rest: the
# static kubelet loses nothing a cgroupfs/containerd node here needs).
build_kubelet() {
    local v="$KUBERNETES_VERSION" dir="$BIN_ROOT/kubelet-$KUBERNETES_VERSION"
    local stamp="kubelet $v recipe $RECIPE"
    if up_to_date "$dir" "$stamp" kubelet; then log "kubelet $v: up to date ($dir)"; return; fi
    local t0=$SECONDS work="$WORK_ROOT/kubernetes-$v" tmp
    mkdir -p "$BIN_ROOT"
    kubernetes_wrapper "$v" "$work"
    tmp="$(mktemp -d "$BIN_ROOT/.kubelet.XXXXXX")"
    kubernetes_compile "$v" "$work" "$tmp" kubelet
    finish "$dir" "$stamp" "$tmp"
    log "kubelet $v: built in $((SECONDS - t0)) s -> $dir/kubelet"
}

# containerd 2.x (NRI on by default), its runc shim and ctr. The module has no replace directives,
# so a wrapper module requiring it builds the three commands at the pinned version. Build tags drop
# the snapshotters that need cgo or kernel features this node does not use (btrfs, devmapper);
# overlayfs and native stay.
build_containerd() {
    local v="$CONTAINERD_VERSION" dir="$BIN_ROOT/containerd-$CONTAINERD_VERSION"
    local bins=(containerd containerd-shim-runc-v2 ctr)
    local stamp="containerd $v [${bins[*]}] recipe $RECIPE"
    if up_to_date "$dir" "$stamp" "${bins[@]}"; then log "containerd $v: up to date ($dir)"; return; fi
    local t0=$SECONDS work="$WORK_ROOT/containerd-$v" tmp
    mkdir -p "$work" "$BIN_ROOT"
    printf 'module neuronetes.local/build/containerd\n\ngo 1.26\n' >"$work/go.mod"
    rm -f "$work/go.sum"
    local pkgs=() b
    for b in "${bins[@]}"; do pkgs+=("github.com/containerd/containerd/v2/cmd/$b"); done
    log "containerd $v: resolving github.com/containerd/containerd/v2@$v"
    (cd "$work" && go_quiet get "${pkgs[@]/%/@$v}")
    local tags="no_btrfs no_devmapper no_zfs no_aufs osusergo netgo"
    local ldflags="-s -w -X github.com/containerd/containerd/v2/version.Version=$v"
    ldflags+=" -X github.com/containerd/containerd/v2/version.Revision=go-module-proxy"
    log "containerd $v: compiling ${bins[*]} with $JOBS jobs (tags: $tags)"
    tmp="$(mktemp -d "$BIN_ROOT/.containerd.XXXXXX")"
    (cd "$work" && "$GO" build -p "$JOBS" -tags "$tags" -ldflags "$ldflags" -o "$tmp/" "${pkgs[@]}")
    finish "$dir" "$stamp" "$tmp"
    log "containerd $v: built in $((SECONDS - t0)) s -> $dir"
}

# kwok's resources from a kustomization folder, depth first, as one multi-document YAML.
kustomize_resources() {
    local folder="$1" r
    while IFS= read -r r; do
        if [[ -d "$folder/$r" ]]; then
            kustomize_resources "$folder/$r"
        else
            printf -- '---\n'
            cat "$folder/$r"
        fi
    done < <(sed -n '/^resources:/,/^[^ -]/{s/^- \(.*\)$/\1/p}' "$folder/kustomization.yaml")
}

build_kwok() {
    local v="$KWOK_VERSION" dir="$BIN_ROOT/kwok-$KWOK_VERSION" stamp="kwok $KWOK_VERSION recipe $RECIPE"
    if up_to_date "$dir" "$stamp" kwok && [[ -s "$dir/stages.yaml" ]]; then
        log "kwok $v: up to date ($dir)"
        return
    fi
    local t0=$SECONDS tmp
    mkdir -p "$BIN_ROOT"
    tmp="$(mktemp -d "$BIN_ROOT/.kwok.XXXXXX")"
    log "kwok $v: go install sigs.k8s.io/kwok/cmd/kwok@$v"
    GOBIN="$tmp" "$GO" install -p "$JOBS" \
        -ldflags "-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=${v#v}" "sigs.k8s.io/kwok/cmd/kwok@$v"
    local src
    src="$(cd "$tmp" && "$GO" env GOMODCACHE)/sigs.k8s.io/kwok@$v/kustomize/stage/fast"
    [[ -f "$src/kustomization.yaml" ]] || { echo "kwok $v: no stage folder $src" >&2; exit 1; }
    # kwok v0.8 has no built-in stages: without these, nodes never turn Ready and pods never run.
    {
        echo "# kwok $v stages from sigs.k8s.io/kwok@$v/kustomize/stage/fast (generated)"
        kustomize_resources "$src"
    } >"$tmp/stages.yaml"
    grep -q 'kind: Stage' "$tmp/stages.yaml" || { echo "kwok $v: no Stage in $src" >&2; exit 1; }
    finish "$dir" "$stamp" "$tmp"
    log "kwok $v: built in $((SECONDS - t0)) s -> $dir"
}

build_helm() {
    local v="$HELM_VERSION" dir="$BIN_ROOT/helm-$HELM_VERSION" stamp="helm $HELM_VERSION recipe $RECIPE"
    if up_to_date "$dir" "$stamp" helm; then log "helm $v: up to date ($dir)"; return; fi
    local major="${v%%.*}" t0=$SECONDS tmp
    mkdir -p "$BIN_ROOT"
    tmp="$(mktemp -d "$BIN_ROOT/.helm.XXXXXX")"
    log "helm $v: go install helm.sh/helm/$major/cmd/helm@$v"
    GOBIN="$tmp" "$GO" install -p "$JOBS" \
        -ldflags "-s -w -X helm.sh/helm/$major/internal/version.version=$v -X helm.sh/helm/$major/internal/version.gitTreeState=clean" \
        "helm.sh/helm/$major/cmd/helm@$v"
    finish "$dir" "$stamp" "$tmp"
    log "helm $v: built in $((SECONDS - t0)) s -> $dir"
}

log "control plane: kubernetes $KUBERNETES_VERSION, etcd $ETCD_VERSION, kwok $KWOK_VERSION, helm $HELM_VERSION;"\
    "node: kubelet $KUBERNETES_VERSION, containerd $CONTAINERD_VERSION -> $BIN_ROOT"
for tool in "${TOOLS[@]}"; do
    "build_$tool"
done
log "control plane ready in $((SECONDS - START_ALL)) s"
