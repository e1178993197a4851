"""Spot interruption notice → replacement pod Ready, on the local cluster: p50 and max over N runs.

Runs ``tests/e2e/test_spot_e2e.py::test_notice_to_replacement_ready_measured`` (a fresh local
control plane with kwok nodes, the real kube-scheduler with the extender, the operator and the
webhook as processes; docs/spot.md, "Measured") with ``NEURONETES_SPOT_RUNS`` set, and prints its
figures: each run puts the AWS Node Termination Handler's ``spot-itn`` taint on the spot node that
hosts the pool's spot pod and times the taint's PATCH to the replacement pod Ready on an on-demand
node (the pods polled every 50 ms).

    python bench/spot_interruption.py --runs 20 [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEST = "tests/e2e/test_spot_e2e.py::test_notice_to_replacement_ready_measured"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20, help="notices to time (default 20)")
    parser.add_argument("--json", type=Path, help="write the figures here as JSON")
    args = parser.parse_args(argv)
    if args.runs < 1:
        print("spot_interruption: --runs must be at least 1", file=sys.stderr)
        return 2
    env = {**os.environ, "NEURONETES_SPOT_RUNS": str(args.runs)}
    cmd = [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", TEST]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("SPOT_RESULT ")]
    if done.returncode != 0 or not lines:
        print(done.stdout[-4000:] + done.stderr[-2000:], file=sys.stderr)
        print(f"spot_interruption: the measurement failed (pytest exit {done.returncode})", file=sys.stderr)
        return 1
    result = json.loads(lines[-1].removeprefix("SPOT_RESULT "))
    print(
        f"notice -> replacement Ready over {result['runs']} runs: "
        f"p50 {result['p50_s']:.2f} s, max {result['max_s']:.2f} s"
    )
    print("each run (s): " + " ".join(f"{s:.2f}" for s in result["seconds"]))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
