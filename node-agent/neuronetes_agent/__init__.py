"""NeuroNetes node agent: NVML discovery and health, GPUNode, in-node admission, NRI plugin, MIG, metrics."""
