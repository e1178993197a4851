#!/usr/bin/env bash
# One real dev-cluster node: containerd and a kubelet, run by neuronetes.devcluster.realnodes as
#
#   unshare --fork --pid --mount-proc --mount --propagation private --kill-child=SIGKILL \
#       bash hack/real-node.sh NODE_DIR
#
# so this script is PID 1 of the node's own PID namespace, in a mount namespace of its own. Every
# process of the node (containerd, its shims, the containers, the kubelet) lives in that PID
# namespace: when this script ends, however it ends, the kernel kills them all, and the mount
# namespace (every overlay, tmpfs and network-namespace mount of the node) goes with them. Nothing
# is mounted outside it; the node shares the host's network namespace (loopback ports only) and
# makes no change to it (the kubelet's iptables chains are off: makeIPTablesUtilChains false).
#
# NODE_DIR holds what realnodes.py rendered: containerd.toml, kubelet.yaml, kubelet.env (the
# binaries, the node's name and labels), images/ (OCI archives of the local images, imported in
# name order), sysctl/ (see below), run/ (copied into the node's /run). containerd and the kubelet
# log to containerd.log and kubelet.log there; this script to stdout.
set -euo pipefail

NODE_DIR="$1"
export KUBELET_LOG="$NODE_DIR/kubelet.log"
# shellcheck source=/dev/null
source "$NODE_DIR/kubelet.env"   # CONTAINERD_BIN KUBELET_BIN NODE_NAME CGROUP_ROOT KUBECONFIG_FILE
                                 # NODE_LABELS STAND_IN_DEVICES FAKE_GPU_DIR

log() { echo "real-node[$NODE_NAME]: $*"; }

# Private /run: containerd's shim sockets (/run/containerd/s), runc's state and the pods' network
# namespace mounts are hard-wired below /run; here they are the node's own and vanish with it.
mount -t tmpfs -o mode=755 tmpfs /run
# The node's folder again at a short path: the kubelet makes Unix sockets below its root folder
# (device plugins, pod resources), whose paths may not pass 108 bytes.
mkdir -p /run/node
mount --bind "$NODE_DIR" /run/node
# What realnodes.py put in the node's /run: on a GPU node of the chart (realchart.py) the fake
# driver's libraries where NVIDIA's GPU operator puts a driver's, and NVIDIA's CDI spec in /run/cdi.
cp -a "$NODE_DIR/run/." /run/

# The fake driver's account of its GPU (FAKE_GPU_DIR, realchart.py): every process using the GPU
# maps a file there, the agent and GPU pods alike, as the real driver's state is the kernel's. GPU
# pods may not mount anything below /run, so it lives in a tmpfs of the node's own over the
# folder's parent (/mnt): the host's stays as it is.
if [[ -n "${FAKE_GPU_DIR:-}" ]]; then
    mount -t tmpfs -o mode=755 tmpfs "$(dirname "$FAKE_GPU_DIR")"
    mkdir -p "$FAKE_GPU_DIR"
fi

# A GPU node's device nodes (STAND_IN_DEVICES: "PATH:MAJOR:MINOR ..."): made in a /dev of the node's
# own — a tmpfs over /dev holding the host's device nodes (copies) and its pts, shm, mqueue and
# hugepages mounts (bound), plus the stand-ins. Nothing is created in the host's /dev. Privileged
# containers (the agent) see them as NVIDIA's; nothing opens them (the fake driver is the GPU).
if [[ -n "${STAND_IN_DEVICES:-}" ]]; then
    host_dev=/run/neuronetes-host-dev
    mkdir -p "$host_dev"
    mount --rbind /dev "$host_dev"
    mount -t tmpfs -o mode=755,nosuid tmpfs /dev
    cp -a --one-file-system "$host_dev/." /dev/
    while read -r sub; do
        [[ "$sub" == "$host_dev" || "$sub" != "$host_dev/"* ]] && continue
        rel="${sub#"$host_dev"/}"
        [[ "$rel" == */* ]] && continue   # each top-level mount once, with what is below it
        mkdir -p "/dev/$rel"
        mount --rbind "$sub" "/dev/$rel"
    done < <(findmnt -rn -o TARGET)
    umount -l "$host_dev"
    for device in $STAND_IN_DEVICES; do
        IFS=: read -r path major minor <<<"$device"
        mkdir -p "$(dirname "$path")"
        [[ -e "$path" ]] || mknod -m 666 "$path" c "$major" "$minor"   # a host with the driver has it
    done
fi
# The kubelet writes pod logs to /var/log/pods and links them from /var/log/containers.
mkdir -p "$NODE_DIR/var-log"
mount --bind "$NODE_DIR/var-log" /var/log
# The kubelet sets six kernel sysctls to its liking (vm.overcommit_memory, kernel.panic, …)
# unless they already have those values: it sees files holding them instead of the host's, and
# protectKernelDefaults makes it fail rather than write, should one ever be missed.
for f in "$NODE_DIR"/sysctl/*; do
    mount --bind -o ro "$f" "/proc/sys/$(basename "$f" | tr . /)"
done

# The kubelet's cgroups (cgroupfs driver) go under CGROUP_ROOT in every hierarchy (cgroup v1 or
# hybrid, as here: one per controller) or in the one unified hierarchy (cgroup v2, where each level
# must pass the controllers down); realnodes.py removes that tree once the node has stopped.
if [[ -f /sys/fs/cgroup/cgroup.controllers ]]; then
    path=/sys/fs/cgroup
    IFS=/ read -ra parts <<<"${CGROUP_ROOT#/}"
    for part in "${parts[@]}"; do
        mkdir -p "$path/$part"
        # Only our own levels: the root's delegation is the host's (systemd's) to give.
        if [[ "$path" != /sys/fs/cgroup ]]; then
            for c in $(cat "$path/cgroup.controllers"); do echo "+$c" >"$path/cgroup.subtree_control" 2>/dev/null || true; done
        fi
        path="$path/$part"
    done
    for c in $(cat "$path/cgroup.controllers"); do echo "+$c" >"$path/cgroup.subtree_control" 2>/dev/null || true; done
else
    for h in /sys/fs/cgroup/*/; do
        mkdir -p "$h${CGROUP_ROOT#/}"
    done
fi

children=()
stop() {
    log "stopping"
    for pid in "${children[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    wait || true
    exit 0
}
trap stop TERM INT

# NAME COMMAND...: run COMMAND, and again 1 s after it ends, as systemd's Restart=always does for a
# node's containerd and kubelet: either may be killed (the restart tests do) and the node goes on —
# running containers stay with their runc shims, and the kubelet finds them again.
keep_running() {
    local name="$1"
    shift
    (
        child=""
        trap '[[ -n "$child" ]] && kill -TERM "$child" 2>/dev/null; wait; exit 0' TERM
        while :; do
            "$@" &
            child=$!
            rc=0
            wait "$child" || rc=$?
            log "$name exited ($rc); restarting it in 1 s"
            sleep 1
        done
    ) &
    children+=($!)
}

keep_running containerd sh -c 'exec "$0" --config "$1" >>"$2" 2>&1' \
    "$CONTAINERD_BIN/containerd" "$NODE_DIR/containerd.toml" "$NODE_DIR/containerd.log"
ctr=("$CONTAINERD_BIN/ctr" --address /run/containerd/containerd.sock)
for _ in $(seq 100); do
    "${ctr[@]}" version >/dev/null 2>&1 && break
    sleep 0.1
done
"${ctr[@]}" version >/dev/null
for archive in "$NODE_DIR"/images/*.tar; do
    log "importing $(basename "$archive")"
    t0=$SECONDS
    "${ctr[@]}" -n k8s.io images import "$archive"
    log "imported $(basename "$archive") in $((SECONDS - t0)) s"
done

keep_running kubelet sh -c 'exec "$0" "$@" >>"$KUBELET_LOG" 2>&1' \
    "$KUBELET_BIN" --config "$NODE_DIR/kubelet.yaml" --kubeconfig "$KUBECONFIG_FILE" --root-dir /run/node/kubelet \
    --hostname-override "$NODE_NAME" --node-ip 127.0.0.1 --node-labels "$NODE_LABELS" --v 1
log "kubelet started"
wait
