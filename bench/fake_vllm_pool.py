"""A fake vLLM pool on loopback ports: the simulator's replica model served over HTTP in real time.

    python bench/fake_vllm_pool.py [--replicas N] [--cold-start S] [--time-scale K] [--kv-tokens T] ...

bench/autoscale_sim/live_server.py documents the endpoints; bench/autoscale_live.py drives it.
"""

from __future__ import annotations

import sys

from autoscale_sim.live_server import main

if __name__ == "__main__":
    sys.exit(main())
