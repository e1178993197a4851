"""Check "reconciliation": the agent's NVML reconciliation (`neuronetes_agent.daemon.reconcile`,
docs/gpu-health.md "Reconciliation") decides on the real NVML's process list (the fake driver's in
fake mode) with real processes holding GPU memory.

Three containers share the GPU under test, each with a 1 GiB slice in its assignment, a region the
agent's region writer wrote where the agent keeps it (`RegionKeeper.directory`), and one process
(``hold_memory``) holding memory on the GPU:

- ``shimmed``: the shim preloaded over its region; holds 256 MiB;
- ``unshimmed``: no shim (what a static binary or a musl loader amounts to); holds 256 MiB;
- ``raised``: the shim preloaded over a region whose limit says 8 GiB while its assignment says
  1 GiB (what a tenant that keeps resetting its usage in its own state file amounts to: the shim
  lets it hold 3 GiB).

There is no Kubernetes here, so the per-container data is built directly: a container's processes
are its workload's PID, written into a ``cgroup.procs`` file, and the agent's own
`hostpids.register_host_pids` registers the shim's slots from it against the real ``/proc`` (NSpid
and start time), as each round on a node does; `RegionKeeper.registered_host_pids` reads them back.
NVML's running compute processes of the GPU are read as the agent reads them (host PID → bytes;
processes of other users of the GPU are in the list too, and belong to no container).
"""

from __future__ import annotations

import contextlib
import select
import subprocess
import time
from typing import Any, Final

from ..context import GIB, MIB, Context, parse_results
from ..model import Report

LIMIT: Final = 1 * GIB  # each container's slice, as the assignment gives it
HOLD: Final = {"shimmed": 256 * MIB, "unshimmed": 256 * MIB, "raised": 3 * GIB}
RAISED_LIMIT: Final = 8 * GIB  # the "raised" tenant's region limit (its assignment says LIMIT)


def _first_result(proc: subprocess.Popen[str], timeout: float) -> dict[str, Any] | None:
    """The workload's RESULT line, once it holds its memory (None: it died or took too long)."""
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 0.5)
        if ready:
            line = proc.stdout.readline()
            if not line:
                return None
            results = parse_results(line)
            if results:
                return results[0]
        elif proc.poll() is not None:
            return None
    return None


def run(ctx: Context) -> Report:
    from neuronetes_agent import region as shim
    from neuronetes_agent.daemon.hostpids import register_host_pids
    from neuronetes_agent.daemon.reconcile import (
        ContainerView,
        Grant,
        GrantKind,
        Memory,
        Policy,
        Reason,
        find,
        plan,
    )
    from neuronetes_agent.daemon.regions import RegionKeeper

    report = Report()
    keeper = RegionKeeper(ctx.path("containers"))
    uids = {name: f"00000000-0000-4000-8000-{k:012d}" for k, name in enumerate(HOLD)}
    pids: dict[str, int] = {}
    with contextlib.ExitStack() as stack:
        for name, held in HOLD.items():
            at = keeper.directory(uids[name], "main")
            ctx.region(name, RAISED_LIMIT if name == "raised" else LIMIT, at=at)
            env = ctx.env(None if name == "unshimmed" else at)
            proc = stack.enter_context(
                ctx.background("hold_memory", ["--bytes", str(held), "--seconds", "60"], env, name=name)
            )
            result = _first_result(proc, timeout=60)
            if result is None or result.get("alloc_rc") != 0 or "pid" not in result:
                report.check(f"{name}.holds", False, f"{name}: no memory held ({result})")
                return report
            pids[name] = int(result["pid"])

        # what each round does on a node: register the shim's slots from the container's cgroup
        registered: dict[str, frozenset[int]] = {}
        for name, pid in pids.items():
            procs = ctx.path(f"cgroups/{name}/cgroup.procs")
            procs.write_text(f"{pid}\n")
            with shim.open_region(keeper.directory(uids[name], "main")) as region:
                register_host_pids(region, region.read_state(), procs)
            registered[name] = frozenset(keeper.registered_host_pids(uids[name], "main"))
        want = {"shimmed": {pids["shimmed"]}, "unshimmed": set(), "raised": {pids["raised"]}}
        ok = all(registered[n] == want[n] for n in HOLD)
        report.check(
            "registered",
            ok,
            "the shim's processes are registered through the real /proc, the unshimmed one is not"
            if ok
            else "registered host PIDs differ",
            registered={n: sorted(p) for n, p in registered.items()},
            pids=pids,
        )

        nvml = ctx.gpu_processes()
        attributed = {n: nvml.get(pid) for n, pid in pids.items()}
        ok = all(attributed[n] for n in HOLD)
        report.check(
            "nvml.lists",
            ok,
            "NVML lists every workload with memory" if ok else "NVML does not list every workload",
            attributed=attributed,
            other_processes=len(set(nvml) - set(pids.values())),
        )

    def view(name: str, kind: GrantKind = GrantKind.SLICE) -> ContainerView:
        return ContainerView(
            uids[name],
            "gpu-validate",
            name,
            "main",
            {ctx.gpu_uuid: Grant(kind, LIMIT)},
            registered[name],
            frozenset({pids[name]}),
        )

    policy = Policy()
    views = [view(n) for n in HOLD]
    findings = find(views, {ctx.gpu_uuid: nvml}, policy)
    by = {n: sorted((f.reason.value, f.pid) for f in findings if f.pod.name == n) for n in HOLD}
    allowed = policy.allowed(LIMIT, 1)
    report.figures.update(allowed_bytes=allowed, limit_bytes=LIMIT, attributed=attributed)
    report.check(
        "shimmed.clean",
        by["shimmed"] == [],
        "a shimmed process within its limit is no finding" if not by["shimmed"] else f"found {by['shimmed']}",
        attributed=attributed["shimmed"],
        allowed=allowed,
    )
    report.check(
        "unshimmed.found",
        by["unshimmed"] == [(Reason.UNSHIMMED.value, pids["unshimmed"])],
        f"found {by['unshimmed']}",
        attributed=attributed["unshimmed"],
    )
    report.check(
        "over-limit.found",
        by["raised"] == [(Reason.OVER_LIMIT.value, 0)],
        f"found {by['raised']} (the region said {RAISED_LIMIT}, the assignment {LIMIT})",
        attributed=attributed["raised"],
        allowed=allowed,
    )
    whole = find(
        [view(n, GrantKind.WHOLE) for n in HOLD] + [view(n, GrantKind.MIG) for n in HOLD],
        {ctx.gpu_uuid: nvml},
        policy,
    )
    report.check(
        "whole-and-mig.ignored",
        whole == [],
        "the same processes on a whole GPU or a MIG instance are no finding"
        if not whole
        else f"found {whole}",
    )
    early = plan(findings, Memory(), 0.0, policy)
    due = plan(findings, early.memory, policy.grace_s, policy)
    evicted = sorted(pod.name for pod, _ in due.evict)
    ok = early.evict == () and early.report == () and evicted == ["raised", "unshimmed"]
    report.check(
        "grace.evicts",
        ok,
        f"nothing acted on within the {policy.grace_s:.0f} s grace, then evicted: {evicted}",
        evicted=evicted,
        counted=sorted(f"{p.name}/{r.value}" for p, r in due.count),
    )
    return report
