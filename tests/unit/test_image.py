"""The Dockerfile and hack/build-image-contents.sh build the same image contents.

The Dockerfile runs the script's stages (one RUN each, in its build stages); `bash hack/test.sh`
runs the same script's `all` outside a container and smoke-tests the result. This checks the two
cannot drift: the Dockerfile runs exactly the stages `all` runs, in the same order; the final
stage copies what every build stage made, runs as a numeric non-root user, and the shim lands
where containers see it (`contracts.SHIM_LIBRARY_PATH`).
"""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest

from neuronetes import contracts as c

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "hack" / "build-image-contents.sh"
DOCKERFILE = REPO / "Dockerfile"


def script(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPT), *args], capture_output=True, text=True, check=False, timeout=30
    )


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Dockerfile, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n\s*", " ", DOCKERFILE.read_text(encoding="utf-8"))
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def stages_run() -> list[str]:
    runs = [args for word, args in instructions() if word == "RUN"]
    found = []
    for run in runs:
        for command in re.split(r"&&|;", run):
            words = shlex.split(command)
            if len(words) >= 3 and words[0] == "bash" and words[1].endswith("build-image-contents.sh"):
                found.append(words[2])
    return found


def test_the_dockerfile_runs_exactly_the_script_stages_in_order() -> None:
    done = script("stages")
    assert done.returncode == 0, done.stderr
    assert stages_run() == done.stdout.split()


def test_the_final_stage_takes_every_build_stage_and_runs_as_non_root() -> None:
    steps = instructions()
    froms = [i for i, (word, _) in enumerate(steps) if word == "FROM"]
    named = [steps[i][1].split()[-1] for i in froms[:-1]]
    assert named == ["nri", "shim", "wheel"]
    final = steps[froms[-1] :]
    copied = {m.group(1) for word, args in final if (m := re.match(r"--from=(\S+)", args))}
    assert copied == set(named)
    users = [args for word, args in final if word == "USER"]
    assert len(users) == 1 and re.fullmatch(r"[1-9]\d*(:[1-9]\d*)?", users[0]), users
    assert ("ENTRYPOINT", '["neuronetes"]') in final


def test_the_shim_lands_where_containers_see_it() -> None:
    text = SCRIPT.read_text(encoding="utf-8")
    assert f"SHIM_LIBRARY={c.SHIM_LIBRARY_PATH.lstrip('/')}\n" in text
    assert c.SHIM_LIBRARY_PATH in DOCKERFILE.read_text(encoding="utf-8")


@pytest.mark.parametrize("args", [(), ("bake",), ("nri",), ("venv",)])
def test_a_bad_stage_or_missing_root_is_one_line(args: tuple[str, ...]) -> None:
    done = script(*args)
    assert done.returncode == 1
    assert done.stdout == "" and len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stderr.startswith("build-image-contents: ")
