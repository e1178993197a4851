"""Hold GPU memory until terminated, run with or without the shim (the reconciliation check):

    hold_memory.py --bytes N [--seconds S]

Allocates N bytes on device 0 through the driver API, prints ``RESULT {"pid", "alloc_rc", "bytes"}``
and holds them until it is terminated (at most S seconds, default 120, so a lost one ends itself).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

from .cudadrv import Driver, out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--bytes", type=int, required=True)
    p.add_argument("--seconds", type=float, default=120.0)
    args = p.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    d = Driver()
    rc, _ = d.alloc(args.bytes)
    out(pid=os.getpid(), alloc_rc=rc, bytes=args.bytes)
    deadline = time.monotonic() + args.seconds
    while time.monotonic() < deadline:
        time.sleep(0.2)


if __name__ == "__main__":
    main()
