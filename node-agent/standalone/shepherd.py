"""The job's shepherd: leader of the job's process group, it runs the command and records its exit.

``python -m neuronetes.agent.standalone.shepherd EXIT_FILE -- ARGV…``. The daemon starts one per
job attempt in a new session, so the job's process group is the shepherd's. Signals the daemon
sends to the group (SIGTERM, SIGUSR1, …) reach the command; the shepherd ignores them (its
handlers do nothing; handlers are reset on exec, so the command gets the default dispositions) and
writes the command's exit status to EXIT_FILE when it ends (128+N for signal N), atomically, then
kills whatever is left in the group (itself included). A daemon that was restarted meanwhile reads
the status from that file, since the shepherd is no longer its child.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

_FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)


def _ignore(signum: int, frame: object) -> None:
    """The signal was sent to the whole group: the command got it too."""


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: shepherd EXIT_FILE -- ARGV...", file=sys.stderr)
        return 64
    exit_file = Path(argv[0])
    for sig in _FORWARDED:
        signal.signal(sig, _ignore)
    try:
        child = subprocess.Popen(argv[2:], stdin=subprocess.DEVNULL)
    except OSError as exc:
        print(f"neuronetes: cannot start the job: {exc}", file=sys.stderr)
        code = 127
    else:
        rc = child.wait()
        code = 128 - rc if rc < 0 else rc
    tmp = exit_file.with_name(exit_file.name + ".tmp")
    tmp.write_text(f"{code}\n")
    os.replace(tmp, exit_file)
    if os.getpgid(0) == os.getpid():
        # The job is its process group: what the command left behind ends with it (and with it
        # this shepherd, its status already written), so no stray copy runs on after the job.
        os.killpg(0, signal.SIGKILL)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
