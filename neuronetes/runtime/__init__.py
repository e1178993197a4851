"""The runtime library: cooperative in-process GPU scheduling (docs/runtime.md)."""
