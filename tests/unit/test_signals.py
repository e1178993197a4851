"""`neuronetes.signals.relay_signals`: a process flooded with signals keeps running its Event loop
and stops on SIGTERM (a handler that set the Event itself could deadlock the main thread)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.unit

CHILD = textwrap.dedent(
    """
    import signal, sys, threading
    from neuronetes.signals import relay_signals

    stop, wake = threading.Event(), threading.Event()
    woken = 0

    def handle(signum):
        if signum == signal.SIGTERM:
            stop.set()
        wake.set()

    relay_signals(handle, (signal.SIGTERM, signal.SIGUSR1))
    print("ready", flush=True)
    while not stop.is_set():
        if wake.wait(0.0001):  # the main thread lives inside Event.wait, where a handler could deadlock
            wake.clear()
            woken += 1
    print(f"stopped after {woken} wakes", flush=True)
    """
)


@pytest.mark.parametrize("run", range(3))
def test_a_signal_flood_wakes_the_loop_and_sigterm_stops_it(run: int) -> None:
    # With handlers that set the Events themselves, one run in five of this flood hung for good.
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True, cwd="/")
    try:
        assert child.stdout is not None and child.stdout.readline() == "ready\n"
        for _ in range(30_000):
            os.kill(child.pid, signal.SIGUSR1)
        os.kill(child.pid, signal.SIGTERM)
        out, _ = child.communicate(timeout=60)
    finally:
        child.kill()
        child.wait()
    assert child.returncode == 0
    assert out.startswith("stopped after ") and int(out.split()[2]) >= 1
