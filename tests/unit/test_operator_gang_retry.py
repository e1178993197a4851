"""A gang whose reservation the extender reported Failed or Expired: read, retried with backoff, and
said in the pool's status (`neuronetes_operator.gang_retry`, `.status`)."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from neuronetes import contracts as c
from neuronetes.api.models import AgentPool, decode
from neuronetes_operator.gang_retry import (
    GangFailure,
    GangRetries,
    failed_reservations,
    plan_gang_retries,
    pool_of_gang,
)
from neuronetes_operator.pods import desired_pods, gang_name
from neuronetes_operator.policy import resolve
from neuronetes_operator.reconcile import Action
from neuronetes_operator.status import pool_status

pytestmark = pytest.mark.unit


def reservation(group: str, phase: str, rid: str = "r1", bound: int = 0) -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"{group}-x",
            "annotations": {c.ANNOTATION_RESERVATION_ID: rid},
            "resourceVersion": "7",
        },
        "spec": {"groupName": group, "size": 2},
        "status": {"phase": phase, "boundMembers": bound},
    }


def test_only_failed_or_expired_reservations_of_the_pools_gangs_count() -> None:
    found = failed_reservations(
        [
            reservation("p-0", "Expired", bound=1),
            reservation("p-1", "Failed", rid="r2"),
            reservation("p-2", "Reserved"),
            reservation("other-0", "Expired"),
        ],
        {"p-0", "p-1", "p-2"},
    )
    assert found == {
        "p-0": GangFailure("p-0", "Expired", "r1", 1),
        "p-1": GangFailure("p-1", "Failed", "r2", 0),
    }


@pytest.mark.parametrize(("gang", "pool"), [("p-0", "p"), ("my-pool-12", "my-pool"), ("nogang", None)])
def test_the_pool_of_a_gang_label(gang: str, pool: str | None) -> None:
    assert pool_of_gang(gang) == pool
    if pool is not None:
        assert gang_name(pool, int(gang.rsplit("-", 1)[1])) == gang


def test_retries_back_off_and_each_report_is_handled_once() -> None:
    retries = GangRetries(base_s=10, cap_s=30)
    first = GangFailure("p-0", "Expired", "r1", 0)
    verdict = retries.decide("ns/p-0", first, now=100.0)
    assert verdict is not None and (verdict.retry, verdict.attempt, verdict.wait_s) == (True, 1, 10)
    assert retries.decide("ns/p-0", first, now=101.0) is None  # the same report: done already
    second = GangFailure("p-0", "Expired", "r2", 0)
    waiting = retries.decide("ns/p-0", second, now=104.0)
    assert waiting is not None and (waiting.retry, waiting.wait_s) == (False, 6)
    again = retries.decide("ns/p-0", second, now=110.0)
    assert again is not None and (again.retry, again.attempt, again.wait_s) == (True, 2, 20)
    third = GangFailure("p-0", "Failed", "r3", 0)
    assert not retries.decide("ns/p-0", third, now=129.0).retry  # type: ignore[union-attr]
    late = retries.decide("ns/p-0", third, now=130.0)
    assert late is not None and (late.attempt, late.wait_s) == (3, 30)  # capped
    retries.settled("ns/p-0")
    fresh = retries.decide("ns/p-0", GangFailure("p-0", "Expired", "r4", 0), now=131.0)
    assert fresh is not None and (fresh.retry, fresh.attempt) == (True, 1)
    retries.decide("ns/p-10-1", GangFailure("p-10-1", "Expired", "r5", 0), now=131.0)
    retries.forget_pool("ns", "p")  # the pool went: its gangs' records go, not another pool's
    assert len(retries) == 1 and retries.attempts("ns/p-10-1") == 1


def gang_pool() -> tuple[dict[str, Any], Any]:
    spec = "minReplicas: 2\ngpuRequirements: {count: 1}\nscheduling: {gangScheduling: {enabled: true}}"
    pool = {
        "apiVersion": c.API_VERSION,
        "kind": "AgentPool",
        "metadata": {"name": "p", "namespace": "ns", "uid": "u", "generation": 1},
        "spec": yaml.safe_load(spec),
    }
    spec_obj = decode(pool, AgentPool).spec
    return pool, desired_pods(pool, spec_obj, resolve(spec_obj))


def test_the_pool_says_its_gang_reservation_failed() -> None:
    pool, want = gang_pool()
    resolved = resolve(decode(pool, AgentPool).spec)
    pods = [d.manifest for d in want]
    note = "gang p-0: the scheduler's reservation Expired (1 of 2 bound); recreated (retry 1)"
    st = pool_status(pool, resolved, pods, {}, gang_notes={"p-0": note})
    gang = next(cd for cd in st.conditions or [] if cd.type == "GangScheduled")
    assert (gang.status, gang.reason) == ("False", "GangReservationFailed")
    assert note in (gang.message or "")


def test_a_replacement_gangs_label_names_its_pool() -> None:
    """A gang replaced on a spot interruption is labelled ``<pool>-<g>-r`` (`spot_plan`): its
    reservation's events still reach its pool."""
    assert pool_of_gang("my-pool-12-r") == "my-pool"
    assert pool_of_gang("x-3-r-0") == "x-3-r"


def test_a_failed_gang_is_deleted_whole_and_its_creations_held_back() -> None:
    _, want = gang_pool()
    pods = [want[0].manifest]  # one member exists, the other is about to be created
    creating = [Action("create", want[1].name, "Created", want[1], want[1].unit)]
    retries = GangRetries(base_s=10.0)
    got = plan_gang_retries(retries, "ns", 2, want, pods, creating, [reservation("p-0", "Expired")], 100.0)
    assert [(a.verb, a.name, a.reason) for a in got.actions] == [("delete", want[0].name, "GangRetry")]
    assert got.retried == {"p-0": [want[0].name]}
    assert "recreated (retry 1, the next waits at least 10s)" in got.notes["p-0"]
    # The same report again: handled already; nothing deleted twice.
    again = plan_gang_retries(retries, "ns", 2, want, pods, [], [reservation("p-0", "Expired")], 101.0)
    assert again.actions == [] and again.retried == {} and "1 retries so far" in again.notes["p-0"]


def test_a_spot_replacement_gang_whose_reservation_failed_is_retried_too() -> None:
    """The replacement of a gang on a spot interruption (``p-0-r``) is a gang of its own: its
    failed reservation is retried like the original's, its members deleted, the original kept."""
    _, want = gang_pool()
    replacement = [d.swapped() for d in want]
    pods = [d.manifest for d in want] + [d.manifest for d in replacement]
    assert {p["metadata"]["labels"][c.LABEL_GANG] for p in pods} == {"p-0", "p-0-r"}
    got = plan_gang_retries(GangRetries(), "ns", 2, want, pods, [], [reservation("p-0-r", "Failed")], 5.0)
    assert sorted(a.name for a in got.actions) == sorted(d.name for d in replacement)
    assert {a.reason for a in got.actions} == {"GangRetry"} and list(got.notes) == ["p-0-r"]
