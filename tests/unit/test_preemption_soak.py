"""The churn soak, short and seeded (the 30-minute one is bench/preemption_soak.py): the
extender's cache and preemption controller on a simulated cluster and clock, with mixed
priorities, arrivals and departures, and evicted pods re-queued (tests/preemption_churn.py)."""

from __future__ import annotations

import pytest
from preemption_churn import ChurnSoak

pytestmark = pytest.mark.unit


def test_ten_minutes_of_churn_preempt_without_a_loop() -> None:
    """Overloaded (about twice what the GPUs hold): preemption happens, and no pod evicted,
    re-placed, ever evicts its evictor back (nor through others); no victim takes back the GPUs
    held for its preemptor."""
    figures = ChurnSoak(7, arrivals_per_s=0.5, mean_run_s=400).run(600)
    assert figures.preemptions >= 10 and figures.evictions >= figures.preemptions
    assert figures.gang_preemptions > 0  # gangs preempted for all their members too
    assert figures.requeued > 0  # evicted pods came back, pending, and were placed again or wait
    assert figures.loops == 0
    assert figures.victims_retook_held_gpus == 0
    # Every preemptor bound or is still within its hold, bar those a higher priority overtook.
    assert figures.preemptors_bound >= 0.8 * figures.preemptions


def test_equal_priorities_never_share_a_held_node() -> None:
    """Two preemptors of one priority do not free the same GPUs: a node held for one is not
    offered to the other's decision, nor to pods of that priority (kube-scheduler's rule for
    nominated pods), so no hold runs out because a peer took its room."""
    soak = ChurnSoak(3, arrivals_per_s=0.4, mean_run_s=400)
    for _ in range(600):
        soak.step()
        held = soak.cache.reservations()
        nodes = [(r.node, r.priority) for r in held]
        assert len(nodes) == len(set(nodes)), nodes
