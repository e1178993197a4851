"""GPU validation: one prepared command that proves every GPU-facing part on a real NVIDIA GPU.

`hack/gpu-validate.sh` (also ``neuronetes dev gpu-validate``) builds the shim and the launch probe
against the machine's CUDA headers, makes this package importable without installing anything, and
runs `runner` over the check table `checks.toml`. Each check runs in a process of its own with the
table's time limit, so one that fails, crashes or hangs does not stop the others; each reports
pass/fail per sub-check with its figures. The result is one JSON object and a readable table
(docs/gpu-validation.md documents the schema and the goal of every figure).

With ``--fake`` the same checks run over the fake driver (``node-agent/shim/fake``) and the agent's
simulated backend: what needs a real GPU says "skipped: no GPU", the rest runs, so the script cannot
rot. Part of the CLI/dev layer: it drives the agent, the shim and the workstation daemon from outside.
"""
