"""A simulated pool of LLM inference replicas, its workloads and the autoscalers compared on it.

`server` models a vLLM replica (continuous batching, chunked prefill, a KV-token budget, a cold
start) and the pool with its router and /metrics scrape; `workloads` builds the request streams;
`policies` implements the autoscalers; `run` drives one (workload, policy) pair and summarises it.
`live_server` serves the same replica model over HTTP in wall-clock time (one process, one loopback
port a replica, vLLM's metric names; bench/fake_vllm_pool.py), `live_run` drives it as `run` drives
the simulation, and `http1` is the little HTTP both speak. bench/autoscale.py and
bench/autoscale_live.py are the command lines; bench/README.md has the figures and the sources.
"""
