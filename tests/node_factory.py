"""Builders for the node shapes the engine tests use (the `nodes` fixture of tests/unit/conftest.py)."""

from __future__ import annotations

from collections.abc import Mapping

from neuronetes.model import GpuHealth, GpuSpec, NodeSpec


class NodeFactory:
    """Builders for the node shapes the engine tests use (all arguments keyword-only)."""

    @staticmethod
    def dgx(
        name: str = "dgx",
        *,
        groups: int = 2,
        n_gpus: int = 8,
        model: str = "A100-SXM4-80GB",
        gpu_memory_mib: int = 81920,
        nvlink_bw: float = 600.0,
        pcie_gen: int = 4,
        cpu_milli: int = 128_000,
        memory_mib: int = 1_024_000,
        health: Mapping[int, GpuHealth] | None = None,
        **node_kw: object,
    ) -> NodeSpec:
        """An NVLink node: `groups` equal NVLink groups (2: GPUs 0-3 and 4-7), each on its own NUMA
        node and socket (with one group, GPUs 0-3 are NUMA/socket 0 and 4-7 NUMA/socket 1)."""
        per_group = n_gpus // groups
        health = health or {}
        gpus = []
        for j in range(n_gpus):
            half = 0 if j < n_gpus // 2 else 1
            group = j // per_group
            peers = tuple(k for k in range(n_gpus) if k != j and k // per_group == group)
            gpus.append(
                GpuSpec(
                    index=j,
                    uuid=f"GPU-{name}-{j}",
                    model=model,
                    memory_mib=gpu_memory_mib,
                    numa_node=half,
                    socket=half,
                    pcie_gen=pcie_gen,
                    nvlink_group=group,
                    nvlink_bandwidth_gbps=nvlink_bw,
                    nvlink_peers=peers,
                    health=health.get(j, GpuHealth.AVAILABLE),
                )
            )
        return NodeSpec(name, cpu_milli, memory_mib, tuple(gpus), **node_kw)  # type: ignore[arg-type]

    @staticmethod
    def t4(
        name: str = "t4",
        *,
        n_gpus: int = 4,
        cpu_milli: int = 64_000,
        memory_mib: int = 256_000,
        health: Mapping[int, GpuHealth] | None = None,
        **node_kw: object,
    ) -> NodeSpec:
        """A PCIe-only node: T4s (15109 MiB), first half on socket/NUMA 0, second half on 1."""
        health = health or {}
        gpus = tuple(
            GpuSpec(
                index=j,
                uuid=f"GPU-{name}-{j}",
                model="T4",
                memory_mib=15109,
                numa_node=0 if j < n_gpus // 2 else 1,
                socket=0 if j < n_gpus // 2 else 1,
                pcie_gen=3,
                health=health.get(j, GpuHealth.AVAILABLE),
            )
            for j in range(n_gpus)
        )
        return NodeSpec(name, cpu_milli, memory_mib, gpus, **node_kw)  # type: ignore[arg-type]

    @staticmethod
    def mig(
        name: str = "mig",
        *,
        n_gpus: int = 1,
        model: str = "A100-SXM4-40GB",
        cpu_milli: int = 64_000,
        memory_mib: int = 256_000,
        **node_kw: object,
    ) -> NodeSpec:
        """A node whose GPUs are all in MIG mode (A100-40GB by default)."""
        gpus = tuple(
            GpuSpec(
                index=j,
                uuid=f"GPU-{name}-{j}",
                model=model,
                memory_mib=40960,
                numa_node=0,
                socket=0,
                mig_enabled=True,
            )
            for j in range(n_gpus)
        )
        return NodeSpec(name, cpu_milli, memory_mib, gpus, **node_kw)  # type: ignore[arg-type]

    @staticmethod
    def cpu(
        name: str = "cpu", *, cpu_milli: int = 32_000, memory_mib: int = 128_000, **node_kw: object
    ) -> NodeSpec:
        """A node without GPUs."""
        return NodeSpec(name, cpu_milli, memory_mib, (), **node_kw)  # type: ignore[arg-type]
