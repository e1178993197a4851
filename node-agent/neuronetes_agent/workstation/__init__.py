"""Workstation mode: the node agent run with ``--workstation`` schedules GPU jobs on one machine.

No cluster: a daemon keeps a priority queue of jobs (real processes), admits them when the GPU is
safe to use, preempts low-priority work for urgent work (stop/continue, transparent CUDA checkpoint,
cooperative checkpoint) and survives its own restart. One module per job (docs/workstation.md):

- `jobs`: the job record, the job state machine (a transition table) and job specs;
- `store`: SQLite state in the state directory (jobs, transitions, GPU holds);
- `gpus`: the GPU view (the agent's discovery backends and GPU state machine);
- `admission`: queue order with aging and the safety rules;
- `preemption`: choosing victims and the preemption ladder;
- `checkpoint`: the CUDA driver's checkpoint API through ctypes;
- `launcher` / `shepherd`: starting jobs as process groups and recording their exit; `commands`:
  what a command line runs (its argv, whether its program exists);
- `containment`: a cgroup per attempt, else the shepherd as subreaper (nothing outlives it);
- `statedir`: the state directory's checks and link-free file access; `logtail`: bounded tails;
- `scheduler`: the loop tying these together; `recovery`: re-adoption after a restart;
- `protocol` / `server` / `client`: the local socket and its JSON protocol;
- `main`: the daemon's entry point (the CLI verbs are `neuronetes.cli`'s).
"""
