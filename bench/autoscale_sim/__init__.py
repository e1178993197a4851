"""A simulated pool of LLM inference replicas, its workloads and the autoscalers compared on it.

`server` models a vLLM replica (continuous batching, chunked prefill, a KV-token budget, a cold
start) and the pool with its router and /metrics scrape; `workloads` builds the request streams;
`policies` implements the autoscalers; `run` drives one (workload, policy) pair and summarises it.
bench/autoscale.py is the command line; bench/README.md has the figures and the sources.
"""
