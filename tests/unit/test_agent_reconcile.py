"""NVML reconciliation's decisions (node-agent/neuronetes_agent/daemon/reconcile.py; docs/gpu-health.md
"Reconciliation", docs/threat-model.md "Reconciliation"): each rule, the tolerance, the grace,
slices against whole GPUs and MIG instances, and a process of another pod on the same GPU."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import pytest

from neuronetes_agent.daemon.reconcile import (
    ContainerView,
    Finding,
    Grant,
    GrantKind,
    Memory,
    Mode,
    Plan,
    Policy,
    Reason,
    find,
    grant_kind,
    plan,
)

pytestmark = pytest.mark.unit

MIB = 1 << 20
GIB = 1 << 30
GPU = "GPU-00000000-0000-4000-8000-000000000000"
OTHER_GPU = "GPU-00000000-0000-4000-8000-000000000001"
POLICY = Policy()  # enforce, 30 s, 1 GiB per process, 64 MiB


def view(
    registered: Iterable[int],
    pids: Iterable[int],
    *,
    limit: int = 2 * GIB,
    kind: GrantKind = GrantKind.SLICE,
    pod: str = "a",
    container: str = "main",
    gpu: str = GPU,
) -> ContainerView:
    return ContainerView(
        pod_uid=f"uid-{pod}",
        namespace="team",
        pod=pod,
        container=container,
        grants={gpu: Grant(kind, limit)},
        registered=frozenset(registered),
        host_pids=frozenset(pids),
    )


def found(
    views: Iterable[ContainerView], nvml: Mapping[str, Mapping[int, int]], policy: Policy = POLICY
) -> list[tuple[Reason, str, int, int]]:
    return [(f.reason, f.pod.name, f.pid, f.used_bytes) for f in find(views, nvml, policy)]


# ---- what is judged ------------------------------------------------------------------------------


def test_a_slice_a_whole_gpu_and_a_mig_instance_are_told_apart() -> None:
    kind = grant_kind
    assert kind(10240, mig=False, gpu_memory_mib=81920, gpu_mig_enabled=False) is GrantKind.SLICE
    # all of the GPU's memory: nobody fits beside it (the node ledger's "held whole" rule)
    assert kind(81920, mig=False, gpu_memory_mib=81920, gpu_mig_enabled=False) is GrantKind.WHOLE
    assert kind(10240, mig=True, gpu_memory_mib=81920, gpu_mig_enabled=True) is GrantKind.MIG
    assert kind(10240, mig=False, gpu_memory_mib=81920, gpu_mig_enabled=True) is GrantKind.MIG


@pytest.mark.parametrize("kind", [GrantKind.WHOLE, GrantKind.MIG])
def test_whole_gpus_and_mig_instances_are_never_judged(kind: GrantKind) -> None:
    # an unshimmed process far past any limit: not a finding on a GPU nobody shares
    assert found([view([], [10], kind=kind, limit=GIB)], {GPU: {10: 70 * GIB}}) == []


def test_a_gpu_nvml_did_not_answer_for_is_not_judged() -> None:
    assert found([view([], [10])], {OTHER_GPU: {10: GIB}}) == []


def test_off_finds_nothing() -> None:
    assert found([view([], [10], limit=GIB)], {GPU: {10: 8 * GIB}}, Policy(mode=Mode.OFF)) == []


# ---- unshimmed -----------------------------------------------------------------------------------


def test_a_process_of_the_container_without_a_registered_slot_is_unshimmed() -> None:
    nvml = {GPU: {10: 300 * MIB, 11: 500 * MIB}}
    (f,) = find([view([10], [10, 11, 12])], nvml, POLICY)  # 12 holds nothing on the GPU
    assert (f.reason, f.pid, f.used_bytes, f.limit_bytes, f.pids) == (
        Reason.UNSHIMMED,
        11,
        500 * MIB,
        2 * GIB,
        (10, 11),
    )
    text = f.describe()
    assert "process 11" in text and f"{500 * MIB} bytes" in text and f"{2 * GIB} bytes" in text
    assert "without the CUDA shim" in text and GPU in text


def test_registered_processes_are_not_findings() -> None:
    assert found([view([10, 11], [10, 11])], {GPU: {10: 300 * MIB, 11: 500 * MIB}}) == []


def test_a_process_of_another_pod_on_the_same_gpu_is_that_pods_finding() -> None:
    a = view([10], [10], pod="a", limit=GIB)  # honest, small limit
    b = view([], [20], pod="b")  # runs a static binary
    nvml = {GPU: {10: 600 * MIB, 20: 6 * GIB, 30: 9 * GIB}}  # 30: in no container the agent knows
    assert found([a, b], nvml) == [
        (Reason.UNSHIMMED, "b", 20, 6 * GIB),
        (Reason.OVER_LIMIT, "b", 0, 6 * GIB),
    ]


# ---- over the limit ------------------------------------------------------------------------------


def test_the_tolerance_is_a_context_allowance_per_process_plus_a_margin() -> None:
    limit = 2 * GIB
    allowed = limit + 2 * GIB + 64 * MIB  # two processes
    assert POLICY.allowed(limit, 2) == allowed
    at = {GPU: {10: allowed - GIB, 11: GIB}}
    assert found([view([10, 11], [10, 11], limit=limit)], at) == []
    over = {GPU: {10: allowed - GIB + 1, 11: GIB}}
    (f,) = find([view([10, 11], [10, 11], limit=limit)], over, POLICY)
    assert (f.reason, f.pid, f.used_bytes, f.allowed_bytes, f.pids) == (
        Reason.OVER_LIMIT,
        0,
        allowed + 1,
        allowed,
        (10, 11),
    )
    assert f"{allowed + 1} bytes" in f.describe() and f"{allowed} bytes" in f.describe()
    assert "[10, 11]" in f.describe()


def test_a_pytorch_context_within_its_limit_is_not_over() -> None:
    # measured on an H100: 612 MiB attributed beyond a 2 GiB limit to a PyTorch process with cuBLAS
    assert found([view([10], [10])], {GPU: {10: 2 * GIB + 612 * MIB}}) == []
    # a tighter allowance than the context's cost finds it
    tight = Policy(context_allowance_bytes=512 * MIB)
    assert found([view([10], [10])], {GPU: {10: 2 * GIB + 612 * MIB}}, tight) == [
        (Reason.OVER_LIMIT, "a", 0, 2 * GIB + 612 * MIB)
    ]


def test_the_limit_is_per_container_and_per_gpu() -> None:
    one = view([10], [10], container="one", limit=GIB)
    two = view([20], [20], container="two", limit=4 * GIB)
    nvml = {GPU: {10: 3 * GIB, 20: 3 * GIB}}  # "one" holds 3 GiB against 1 GiB + 1 GiB + 64 MiB
    assert [(f.reason, f.container) for f in find([one, two], nvml, POLICY)] == [(Reason.OVER_LIMIT, "one")]


def test_negative_settings_are_refused() -> None:
    for bad in ({"grace_s": -1.0}, {"context_allowance_bytes": -1}, {"margin_bytes": -1}):
        with pytest.raises(ValueError, match="must not be negative"):
            Policy(**bad)


# ---- grace, reporting, counting, evicting ---------------------------------------------------------


def unshimmed(pid: int, pod: str = "a") -> Finding:
    (f,) = find([view([], [pid], pod=pod)], {GPU: {pid: 100 * MIB}}, POLICY)
    return f


def over(pod: str = "a") -> Finding:
    (f,) = find([view([10], [10], pod=pod, limit=MIB)], {GPU: {10: 2 * GIB}}, POLICY)
    return f


def rounds(script: Iterable[tuple[float, list[Finding]]], policy: Policy = POLICY) -> list[Plan]:
    memory = Memory()
    out = []
    for now, findings in script:
        p = plan(findings, memory, now, policy)
        memory = p.memory
        out.append(p)
    return out


def test_a_finding_is_acted_on_only_after_lasting_its_grace() -> None:
    f = unshimmed(11)
    early, almost, due, later = rounds([(0.0, [f]), (29.0, [f]), (30.0, [f]), (31.0, [f])])
    for p in (early, almost):
        assert p.pending == (f,) and p.report == () and p.count == () and p.evict == ()
    assert due.report == (f,) and due.count == ((f.pod, Reason.UNSHIMMED),)
    assert due.evict == ((f.pod, (f,)),)
    # reported and counted once; evicted again while it lasts (the agent spaces the retries)
    assert later.report == () and later.count == () and later.evict == ((f.pod, (f,)),)


def test_a_round_without_the_finding_restarts_its_grace() -> None:
    f = unshimmed(11)
    plans = rounds([(0.0, [f]), (20.0, []), (25.0, [f]), (50.0, [f]), (55.0, [f])])
    assert [bool(p.report) for p in plans] == [False, False, False, False, True]
    # a finding that clears and comes back after being acted on is a new episode
    plans = rounds([(0.0, [f]), (30.0, [f]), (31.0, []), (32.0, [f]), (62.0, [f])])
    assert [len(p.report) for p in plans] == [0, 1, 0, 0, 1]
    assert [len(p.count) for p in plans] == [0, 1, 0, 0, 1]


def test_a_zero_grace_acts_at_once() -> None:
    f = unshimmed(11)
    (p,) = rounds([(0.0, [f])], Policy(grace_s=0))
    assert p.report == (f,) and p.evict == ((f.pod, (f,)),)


def test_report_mode_reports_and_counts_but_never_evicts() -> None:
    f = unshimmed(11)
    _, due = rounds([(0.0, [f]), (30.0, [f])], Policy(mode=Mode.REPORT))
    assert due.report == (f,) and due.count == ((f.pod, Reason.UNSHIMMED),) and due.evict == ()


def test_one_count_per_pod_and_reason_one_event_per_finding() -> None:
    first, second, limit = unshimmed(11), unshimmed(12), over()
    plans = rounds([(0.0, [first]), (10.0, [first, second, limit]), (30.0, [first, second, limit])])
    assert plans[2].report == (first,) and plans[2].count == ((first.pod, Reason.UNSHIMMED),)
    plans = rounds(
        [
            (0.0, [first]),
            (10.0, [first, second, limit]),
            (30.0, [first, second, limit]),
            (40.0, [first, second, limit]),
        ]
    )
    last = plans[3]
    assert set(last.report) == {second, limit}  # each finding's own Event
    assert last.count == ((limit.pod, Reason.OVER_LIMIT),)  # the unshimmed episode was counted already
    (pod, why) = last.evict[0]
    assert pod == first.pod and set(why) == {first, second, limit}


def test_each_pod_is_evicted_for_its_own_findings() -> None:
    a, b = unshimmed(11, pod="a"), unshimmed(21, pod="b")
    (p,) = rounds([(0.0, [a, b])], Policy(grace_s=0))
    assert p.evict == ((a.pod, (a,)), (b.pod, (b,)))
