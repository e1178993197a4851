#!/usr/bin/env bash
# Run one C test case of the shim: run_case.sh <build variant dir> <case>
# Each case gets a fresh region (both files, written as the agent writes them) and a fresh fake-GPU
# account.
set -euo pipefail
build="$1" name="$2"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
export FAKE_CUDA_STATE="$work/gpu" NEURONETES_REGION_DIR="$work/region"
export LD_LIBRARY_PATH="$build/fake${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
preload="$build/lib/libneuronetes-cuda.so"
if [[ "$build" == *asan* ]]; then
    # the sanitizer runtime must come first in the initial library list
    preload="$(${CC:-gcc} -print-file-name=libasan.so):$preload"
    export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0" UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
fi
mib=$((1 << 20))
limit=$((128 * mib)) share=100 control=1 flags=0 case="$name" major=""
case "$name" in
    memory|checkpoint) limit=$((256 * mib)) ;;
    capture) share=10 ;;
    admission) control=0 ;;
    env-cluster) case=env; export CUDA_DEVICE_MEMORY_LIMIT=64m ;;
    env-workstation) case=env flags=2; export CUDA_DEVICE_MEMORY_LIMIT=64m ;;
    unassigned) export FAKE_CUDA_DEVICES=2 ;;
    refused-missing) case=refused ;;
    refused-version) case=refused major=1 ;; # both files of the old major version
    refused-legacy)
        # what an agent of major 1 left: one 64 KiB file named "region", no control or state file
        mkdir "$work/region" && truncate -s 65536 "$work/region/region"
        LD_PRELOAD="$preload" "$build/test_shim" refused "$work/region"
        exit 0 ;;
    region-container)
        # In a container (a region at /run/neuronetes, as the NRI plugin mounts it) the environment
        # cannot move the region: NEURONETES_REGION_DIR names a tenant-made region of 1 GiB, the
        # default one holds 128 MiB, and the shim must report and enforce 128 MiB. A private mount
        # namespace puts a tmpfs over /run for this one process tree.
        if ! unshare -rm true 2>/dev/null; then
            if [[ "${CI:-}" =~ ^(1|true|yes)$ ]]; then
                echo "region-container: unshare -rm is not available (CI=true: may not be skipped)" >&2
                exit 1
            fi
            echo "region-container: SKIPPED (no user and mount namespaces here)" >&2
            exit 0
        fi
        "$build/mkregion" "$work/region" $((1024 * mib)) 100 1 0
        exec unshare -rm sh -c 'mount -t tmpfs nn-test /run && mkdir /run/neuronetes &&
            "$1" /run/neuronetes "$2" 100 1 0 && exec env LD_PRELOAD="$3" "$4" env /run/neuronetes' \
            sh "$build/mkregion" "$limit" "$preload" "$build/test_shim" ;;
    race)
        # processes x threads racing every allocation API against the limit; one is killed
        LD_PRELOAD="$preload" "$build/race" 4 8 1500 $((256 * mib)) 1
        exit 0 ;;
esac
if [[ "$name" != refused-missing ]]; then
    "$build/mkregion" "$work/region" "$limit" "$share" "$control" "$flags" $major
fi
LD_PRELOAD="$preload" "$build/test_shim" "$case" "$work/region"
