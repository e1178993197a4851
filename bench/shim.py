"""The CUDA shim's acceptance benchmark: builds and runs `make -C node-agent/shim bench`.

It runs over the fake driver (no GPU needed) and prints one JSON object: per-launch cost through
the fake directly and through the shim, pacing accuracy at 10/25/50/75 % (mixed launch APIs, and
graph and cooperative launches at 25 %), two containers at 30/70 on one GPU, the memory race (8
processes x 16 threads against a 1 GiB limit, one killed: the fake's own peak and the reclaim
time), and the pause/resume latency. See docs/shim.md. Pacing figures are wall-clock sensitive:
run it on a quiet machine.

    .venv/bin/python bench/shim.py [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

SHIM = Path(__file__).resolve().parents[1] / "node-agent" / "shim"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", type=Path, help="also write the figures to this file")
    args = ap.parse_args()
    proc = subprocess.run(
        ["make", "-s", "-C", str(SHIM), f"PYTHON={sys.executable}", "bench"],
        stdout=subprocess.PIPE,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        sys.exit(f"bench/shim.py: make bench failed (rc={proc.returncode})")
    line = proc.stdout.strip().splitlines()[-1]
    figures = json.loads(line)  # one JSON object, checked before it is passed on
    print(json.dumps(figures))
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
