"""Bad input to every area of the CLI: exactly one ``error: ...`` line on stderr, nothing on
stdout, and the one rule of docs/cli.md ("Errors and exit codes"): exit status 2 when the command
line is wrong, whoever notices it (bad flag, value, combination, input file or output place;
the daemon's own rules checked before anything is sent), 1 at run time (unreachable or unusable
kubeconfig, missing cluster or daemon, a refusal by what the command acts on). Run through the
installed console scripts, as a user runs them, so a traceback anywhere would show; and every
command walked in process, an unknown option to each."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import click
import pytest

pytestmark = pytest.mark.slow  # 40-odd CLI processes

BIN = Path(sys.executable).parent
NODES_CSV = "sn,cpu_milli,memory_mib,gpu,model\nn1,64000,262144,8,A100\n"
PODS_CSV = "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np1,8000,16000,1,1000\np2,4000,8000,1,500\n"
UNREACHABLE_KUBECONFIG = (
    "apiVersion: v1\nkind: Config\n"
    'clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]\n'
    "users: [{name: u, user: {token: x}}]\n"
    "contexts: [{name: c, context: {cluster: c, user: u}}]\ncurrent-context: c\n"
)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    d = tmp_path_factory.mktemp("cli-errors")
    written = {
        "nodes": NODES_CSV,
        "pods": PODS_CSV,
        "bad_number": PODS_CSV.replace("8000,16000", "lots,16000"),
        "no_columns": "name,cpu\np1,1\n",
        "bad_milli": PODS_CSV.replace(",500", ",4000"),
        "unreachable": UNREACHABLE_KUBECONFIG,
        "not_yaml": "settings: [\n",
    }
    out = {}
    for name, text in written.items():
        path = d / name
        path.write_text(text)
        out[name] = str(path)
    out["missing"] = str(d / "missing.csv")
    out["dir"] = str(d)
    (d / "compare-bad").mkdir()
    (d / "compare-bad" / "analysis_allo_discrete.csv").write_text("a,b\n1,2\n")
    out["compare_bad"] = str(d / "compare-bad")
    (d / "open-state").mkdir()
    (d / "open-state").chmod(0o777)  # a state directory anybody may write
    out["open_state"] = str(d / "open-state")
    (d / "home").mkdir()
    out["home"] = str(d / "home")  # no kubeconfig, no daemon in its default state directory
    (d / "not-executable.sh").write_text("echo hi\n")
    out["not_executable"] = str(d / "not-executable.sh")
    return out


def _isolated(files: dict[str, str]) -> dict[str, str]:
    """The environment of a case: a home of its own, so no kubeconfig, no in-cluster configuration
    and no workstation daemon of the user's can answer instead."""
    dropped = ("KUBECONFIG", "NEURONETES_STATE_DIR", "XDG_STATE_HOME", "KUBERNETES_SERVICE_HOST")
    env = {k: v for k, v in os.environ.items() if k not in dropped}
    return {**env, "HOME": files["home"]}


SIM = ["simulate", "--nodes", "{nodes}", "--pods", "{pods}", "--workers", "1", "--seeds", "1"]
GPU = "GPU-00000000-0000-0000-0000-000000000000"

# (id, console script, argv with {file} placeholders, exit status, text the one line must hold)
CASES = [
    ("unknown-command", "neuronetes", ["frobnicate"], 2, "No such command"),
    ("no-command", "neuronetes", [], 2, "a command is needed"),
    ("bad-flag", "neuronetes", ["simulate", "--bogus"], 2, "No such option"),
    ("bad-path", "neuronetes", ["simulate", "--nodes", "{missing}", "--pods", "{pods}"], 2, "missing.csv"),
    ("malformed-csv", "neuronetes", [*SIM[:4], "{bad_number}", *SIM[5:]], 2, "not a number"),
    ("csv-missing-columns", "neuronetes", [*SIM[:4], "{no_columns}", *SIM[5:]], 2, "missing column"),
    ("csv-impossible-share", "neuronetes", [*SIM[:4], "{bad_milli}", *SIM[5:]], 2, "out of range"),
    ("empty-seed-range", "neuronetes", [*SIM[:-1], "9-1"], 2, "seed range '9-1' is empty"),
    ("seeds-not-numbers", "neuronetes", [*SIM[:-1], "a-b"], 2, "--seeds"),
    ("seeds-a-word", "neuronetes", [*SIM[:-1], "abc"], 2, "seed 'abc' is not a whole number"),
    ("compare-missing", "neuronetes", [*SIM, "--compare", "{dir}/none"], 2, "--compare"),
    ("compare-not-the-results", "neuronetes", [*SIM, "--compare", "{compare_bad}"], 2, "not the paper's"),
    ("json-into-a-file", "neuronetes", [*SIM, "--json", "{pods}/out.json"], 2, "is not a folder"),
    ("json-is-a-folder", "neuronetes", [*SIM, "--json", "{dir}"], 2, "is a folder"),
    ("plot-into-a-file", "neuronetes", [*SIM, "--plot", "{pods}/p.png"], 2, "--plot"),
    ("sim-bad-output", "neuronetes", [*SIM, "-o", "xml"], 2, "'xml'"),
    ("negative-tune", "neuronetes", [*SIM, "--tune", "-1"], 2, "--tune"),
    ("unknown-policy", "neuronetes", [*SIM, "--policy", "fgd,nope"], 2, "unknown policy 'nope'"),
    ("negative-workers", "neuronetes", [*SIM[:5], "--workers", "-3"], 2, "--workers"),
    ("only-nodes", "neuronetes", ["simulate", "--nodes", "{nodes}"], 2, "give --nodes and --pods"),
    ("csv-and-cluster", "neuronetes", [*SIM, "--from-cluster"], 2, "--from-cluster replaces"),
    (
        "save-trace-without-cluster",
        "neuronetes",
        [*SIM, "--save-trace", "{dir}"],
        2,
        "go with --from-cluster",
    ),
    (
        # checked before the cluster is read: the unreachable kubeconfig is never tried
        "save-trace-under-a-file",
        "neuronetes",
        ["simulate", "--from-cluster", "--kubeconfig", "{unreachable}", "--save-trace", "{pods}/trace"],
        2,
        "is not a folder",
    ),
    (
        "from-cluster-unreachable",
        "neuronetes",
        ["simulate", "--from-cluster", "--kubeconfig", "{unreachable}"],
        1,
        "cannot reach the API server",
    ),
    ("unknown-node-profile", "neuronetes", ["dev", "cluster", "up", "--nodes", "foo=bar"], 2, "foo"),
    (
        "node-count-not-a-number",
        "neuronetes",
        ["dev", "cluster", "up", "--nodes", "dgx-h100=x"],
        2,
        "dgx-h100",
    ),
    ("bad-feature-gate", "neuronetes", ["dev", "cluster", "up", "--feature-gates", "X=maybe"], 2, "X=maybe"),
    ("zero-schedulers", "neuronetes", ["dev", "cluster", "up", "--schedulers", "0"], 2, "--schedulers"),
    ("bad-cluster-action", "neuronetes", ["dev", "cluster", "explode"], 2, "explode"),
    ("bad-output-format", "neuronetes", ["dev", "cluster", "status", "-o", "xml"], 2, "'xml'"),
    ("bad-cluster-name", "neuronetes", ["dev", "cluster", "status", "--name", "a b"], 2, "--name"),
    (
        "cluster-not-up",
        "neuronetes",
        ["dev", "cluster", "kubeconfig", "--name", "never-started"],
        1,
        "is it up",
    ),
    ("ecc-no-count", "neuronetes", ["dev", "inject-ecc", "--gpu-id", GPU], 2, "--corrected"),
    (
        "ecc-negative",
        "neuronetes",
        ["dev", "inject-ecc", "--gpu-id", GPU, "--corrected", "-1"],
        2,
        "--corrected",
    ),
    ("xid-out-of-range", "neuronetes", ["dev", "inject-xid", "--gpu-id", GPU, "--xid", "0"], 2, "--xid"),
    ("port-out-of-range", "neuronetes", ["extender", "serve", "--port", "70000"], 2, "--port"),
    ("operator-bad-settings", "neuronetes", ["operator", "run", "--config", "{not_yaml}"], 2, "settings"),
    (
        "webhook-no-certs",
        "neuronetes",
        ["webhook", "serve", "--port", "0", "--cert-dir", "{dir}"],
        1,
        "cannot serve",
    ),
    (
        "agent-two-targets",
        "neuronetes",
        ["agent", "run", "--node", "a", "--simulate-nodes", "x=y"],
        2,
        "exactly one",
    ),
    ("drain-without-gpu", "neuronetes", ["drain"], 2, "--gpu-id"),
    ("top-missing-kubeconfig", "kubectl-neuronetes", ["top", "--kubeconfig", "{missing}"], 1, "kubeconfig"),
    ("top-unreachable", "kubectl-neuronetes", ["top", "--kubeconfig", "{unreachable}"], 1, "cannot reach"),
    (
        "status-kubeconfig-not-one",
        "neuronetes",
        ["status", "--kubeconfig", "/etc/passwd"],
        1,
        "kubeconfig /etc/passwd: not a kubeconfig",
    ),
    ("status-kubeconfig-a-folder", "neuronetes", ["status", "--kubeconfig", "{dir}"], 1, "a folder"),
    ("status-bad-output", "kubectl-neuronetes", ["status", "-o", "wide"], 2, "'wide'"),
    (
        "health-unreachable",
        "kubectl-neuronetes",
        ["health", "--gpu-id", GPU, "--kubeconfig", "{unreachable}"],
        1,
        "cannot reach",
    ),
    (
        "offline-unreadable-kubeconfig",
        "kubectl-neuronetes",
        ["offline", "--gpu-id", GPU, "--kubeconfig", "{dir}"],
        1,
        "",
    ),
    ("explain-without-pod", "kubectl-neuronetes", ["explain"], 2, "POD"),
    ("explain-bad-pod-ref", "kubectl-neuronetes", ["explain", "a/b/c"], 2, "NAMESPACE/NAME"),
    ("group-bad-flag", "kubectl-neuronetes", ["dev", "--frobnicate"], 2, "No such option"),
    # workstation mode (docs/workstation.md); the errors that need a live daemon (unknown job, GPU in
    # use) are in tests/e2e/test_workstation_e2e.py
    ("ws-no-daemon", "neuronetes", ["jobs", "list", "--state-dir", "{dir}/none"], 1, "no workstation daemon"),
    (
        "ws-status-no-daemon",
        "neuronetes",
        ["status", "--state-dir", "{dir}/none"],
        1,
        "no workstation daemon",
    ),
    ("ws-cancel-no-daemon", "neuronetes", ["cancel", "j1", "--state-dir", "{dir}/none"], 1, "no workstation"),
    ("ws-bad-priority", "neuronetes", ["submit", "--cmd", "true", "--priority", "5000"], 2, "bad priority"),
    (
        "ws-priority-not-a-number",
        "neuronetes",
        ["submit", "--cmd", "true", "--priority", "high"],
        2,
        "'high'",
    ),
    (
        "ws-bad-size",
        "neuronetes",
        ["submit", "--cmd", "true", "--priority", "1", "--gpu-memory", "lots", "--gpu-compute", "10"],
        2,
        "bad size 'lots'",
    ),
    (
        "ws-share-and-gpus",
        "neuronetes",
        ["submit", "--cmd", "true", "--priority", "1", "--gpus", "2", "--gpu-memory", "8Gi"],
        2,
        "not both",
    ),
    ("ws-bad-interval", "neuronetes", ["watch", "--interval", "soon", "--state-dir", "{dir}"], 2, "soon"),
    ("ws-unknown-command", "neuronetes", ["jobs", "frobnicate"], 2, "No such command"),
    (
        "ws-workstation-and-node",
        "neuronetes",
        ["agent", "run", "--workstation", "--node", "a"],
        2,
        "no --node",
    ),
    # the mode's former flag name, a hidden alias: old command lines and units still start
    ("ws-former-flag-name-and-node", "neuronetes-agent", ["--standalone", "--node", "a"], 2, "no --node"),
    (
        "ws-cap-above-90",
        "neuronetes-agent",
        ["--workstation", "--utilization-cap", "95"],
        2,
        "--utilization-cap",
    ),
    (
        # deeper than a Unix socket path may be (108 bytes): one line, not the bind's AttributeError
        "ws-state-dir-too-deep",
        "neuronetes-agent",
        ["--workstation", "--simulate-gpus", "1", "--state-dir", "{dir}/" + "d" * 120],
        2,
        "choose a shorter state directory",
    ),
    # names and ids are kept apart; sizes are whole mebibytes at least; state directories are private
    (
        "ws-name-like-an-id",
        "neuronetes",
        ["submit", "--cmd", "true", "--priority", "1", "--name", "j2"],
        2,
        "'j2': j<number> is the form of job ids",
    ),
    (
        "ws-size-below-a-mebibyte",
        "neuronetes",
        ["submit", "--cmd", "true", "--priority", "1", "--gpu-memory", "0.5", "--gpu-compute", "10"],
        2,
        "--gpu-memory: bad size '0.5': at least 1Mi",
    ),
    (
        "ws-log-cap-below-a-mebibyte",
        "neuronetes-agent",
        ["--workstation", "--simulate-gpus", "1", "--log-max-size", "1k", "--state-dir", "{dir}/logcap"],
        2,
        "--log-max-size: bad size '1k': at least 1Mi",
    ),
    # the daemon's and the verbs' documented ranges (docs/workstation.md), checked before anything runs
    ("ws-simulate-nine-gpus", "neuronetes-agent", ["--workstation", "--simulate-gpus", "9"], 2, "1<=x<=8"),
    ("ws-max-clients-zero", "neuronetes-agent", ["--workstation", "--max-clients", "0"], 2, "1<=x<=1024"),
    (
        "ws-shim-library-missing",
        "neuronetes-agent",
        [
            "--workstation",
            "--simulate-gpus",
            "1",
            "--shim-library",
            "{dir}/none.so",
            "--state-dir",
            "{dir}/shim",
        ],
        2,
        "--shim-library {dir}/none.so: no such file",
    ),
    ("ws-seventeen-gpus", "neuronetes", ["submit", "--cmd", "true", "--gpus", "17"], 2, "bad GPU count 17"),
    ("ws-name-too-long", "neuronetes", ["submit", "--cmd", "true", "--name", "a" * 64], 2, "(≤ 63)"),
    ("ws-tail-too-long", "neuronetes", ["jobs", "logs", "j1", "--tail", "10001"], 2, "1<=x<=10000"),
    # no daemon and no kubeconfig: the one line says which target was tried and how to start a daemon
    *[
        (
            f"{verb}-no-daemon-no-kubeconfig",
            "neuronetes",
            [verb],
            1,
            "; the target was the cluster: no --state-dir, no $NEURONETES_STATE_DIR and no workstation "
            "daemon answers in {home}/.local/state/neuronetes (start one: neuronetes agent run "
            "--workstation)",
        )
        for verb in ("status", "health")
    ],
    (
        "explain-no-kubeconfig",
        "kubectl-neuronetes",
        ["explain", "p"],
        1,
        "explain reads the cluster (on a workstation: neuronetes jobs describe JOB, once its daemon runs: "
        "neuronetes agent run --workstation)",
    ),
    # fault injection follows the same target rule: a workstation daemon's simulated backend
    (
        "ws-inject-no-daemon",
        "neuronetes",
        ["dev", "inject-temperature", "--gpu-id", "0", "--celsius", "90", "--state-dir", "{dir}/none"],
        1,
        "no workstation daemon",
    ),
    (
        "ws-inject-bad-xid",
        "neuronetes",
        ["dev", "inject-xid", "--gpu-id", "0", "--xid", "1000", "--state-dir", "{dir}/none"],
        2,
        "'--xid': 1000 is not in the range 1<=x<=999",
    ),
    (
        "ws-inject-no-ecc-count",
        "neuronetes",
        ["dev", "inject-ecc", "--gpu-id", "0", "--state-dir", "{dir}/none"],
        2,
        "give --corrected and/or --uncorrected",
    ),
    # submit: zero GPUs refused, commands found before anything is queued, the priority optional
    ("ws-zero-gpus", "neuronetes", ["submit", "--cmd", "true", "--gpus", "0"], 2, "bad GPU count 0: use"),
    (
        "ws-command-not-on-path",
        "neuronetes",
        ["submit", "--cmd", "no-such-program-here --flag"],
        1,
        "command not found: 'no-such-program-here' is not on PATH",
    ),
    (
        "ws-command-path-missing",
        "neuronetes",
        ["submit", "--cmd", "{dir}/missing.sh arg"],
        1,
        "missing.sh' is not an executable file",
    ),
    (
        "ws-command-not-executable",
        "neuronetes",
        ["submit", "--cmd", "{not_executable}"],
        1,
        "not-executable.sh' is not an executable file",
    ),
    (
        "ws-priority-defaults",  # no --priority: the spec passes, only the missing daemon is left
        "neuronetes",
        ["submit", "--cmd", "true", "--gpu-memory", "1Gi", "--state-dir", "{dir}/none"],
        1,
        "no workstation daemon",
    ),
    (
        "ws-state-dir-others-may-write",
        "neuronetes-agent",
        ["--workstation", "--simulate-gpus", "1", "--state-dir", "{open_state}"],
        1,
        "is writable by its group or by others (mode 0777): refusing to use it",
    ),
]


@pytest.mark.parametrize(
    ("script", "argv", "status", "says"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_bad_input_is_one_error_line(
    files: dict[str, str], script: str, argv: list[str], status: int, says: str
) -> None:
    args = [a.format(**files) for a in argv]
    result = subprocess.run(
        [str(BIN / script), *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd="/",
        stdin=subprocess.DEVNULL,
        env=_isolated(files),
    )
    assert result.returncode == status, result.stderr
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1, result.stderr
    assert says.format(**files) in result.stderr and "Traceback" not in result.stderr
    assert result.stdout == ""


def _command_paths(command: click.Command, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out = [path]
    if isinstance(command, click.Group):
        for name, sub in sorted(command.commands.items()):
            if not sub.hidden:
                out += _command_paths(sub, (*path, name))
    return out


def test_every_command_says_an_unknown_option_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    """The rule walked over the whole command tree: whatever a command does, a wrong command line
    is exit 2 and one line, before the command runs."""
    from neuronetes.cli import main
    from neuronetes.cli.root import build_root

    paths = _command_paths(build_root())
    assert len(paths) > 20
    for path in paths:
        assert main([*path, "--no-such-option"]) == 2, path
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1 and "--no-such-option" in err, (path, err)


def test_there_are_enough_cases() -> None:
    assert len(CASES) >= 15 and len({c[0] for c in CASES}) == len(CASES)


@pytest.mark.parametrize(
    "argv",
    [
        ["--version"],
        ["dev", "--version"],
        ["extender", "--version"],
        ["agent", "--version"],
        ["operator", "--version"],
        ["webhook", "--version"],
        ["jobs", "--version"],
    ],
)
def test_version_everywhere(argv: list[str]) -> None:
    for script in ("neuronetes", "kubectl-neuronetes"):
        result = subprocess.run(
            [str(BIN / script), *argv], capture_output=True, text=True, timeout=60, cwd="/"
        )
        assert result.returncode == 0 and result.stdout.strip().endswith("0.1.0"), result.stderr


def test_an_unexpected_error_is_one_line_and_a_traceback_with_v(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from neuronetes.cli import main, simulate

    def boom(spec: str) -> list[str]:
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(simulate, "_policies", boom)
    argv = ["simulate", "--nodes", "x", "--pods", "y"]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err == (
        "error: unexpected ZeroDivisionError: a bug (a bug: rerun with `neuronetes -v ...` for the "
        "traceback and report it)\n"
    )
    assert main(["-v", *argv]) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and err.rstrip().splitlines()[-1].startswith("error: unexpected")


def test_the_agent_script_says_its_version() -> None:
    result = subprocess.run(
        [str(BIN / "neuronetes-agent"), "--version"], capture_output=True, text=True, timeout=60, cwd="/"
    )
    assert result.returncode == 0 and result.stdout.strip() == "neuronetes-agent 0.1.0", result.stderr


def _help(script: str, *argv: str) -> str:
    result = subprocess.run(
        [str(BIN / script), *argv, "--help"], capture_output=True, text=True, timeout=60, cwd="/"
    )
    assert result.returncode == 0 and result.stderr == "", result.stderr
    return " ".join(result.stdout.split())


def test_the_agent_script_has_its_own_usage_and_names_the_workstation_flag() -> None:
    own = _help("neuronetes-agent")
    assert own.startswith("Usage: neuronetes-agent [OPTIONS]"), own
    for text in (own, _help("neuronetes", "agent", "run")):
        assert "or --workstation: no cluster" in text and "--workstation workstation mode" in text
        assert "--standalone" not in text  # the former name stays a hidden alias


def test_submit_says_its_defaults() -> None:
    text = _help("neuronetes", "submit")
    assert "[default: 0]" in text and "default: the share's part of the GPU's memory" in text
    assert "executable path" in text


def test_every_command_takes_dash_h(capsys: pytest.CaptureFixture[str]) -> None:
    """`-h` is `--help` everywhere (docs/cli.md): exit 0 and the command's usage on stdout."""
    from neuronetes.cli import main
    from neuronetes.cli.root import build_root

    for path in _command_paths(build_root()):
        assert main([*path, "-h"]) == 0, path
        out = capsys.readouterr().out
        assert out.startswith(f"Usage: {' '.join(('neuronetes', *path))} "), (path, out[:200])


def test_the_kubectl_plugin_names_itself_kubectl_neuronetes_in_help_and_errors(files: dict[str, str]) -> None:
    def plugin(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(BIN / "kubectl-neuronetes"), *argv],
            capture_output=True,
            text=True,
            timeout=60,
            cwd="/",
            env=_isolated(files),
        )

    assert plugin("--help").stdout.startswith("Usage: kubectl neuronetes [OPTIONS] COMMAND")
    assert plugin("top", "--help").stdout.startswith("Usage: kubectl neuronetes top [OPTIONS]")
    bare = plugin()
    assert (bare.returncode, bare.stdout) == (2, "")
    assert bare.stderr == "error: a command is needed (see kubectl neuronetes --help)\n"
    assert _help("neuronetes").startswith("Usage: neuronetes [OPTIONS] COMMAND")


def test_ctrl_c_is_exit_130_and_one_line(files: dict[str, str]) -> None:
    """Interrupted mid-replay (SIGINT, what Ctrl-C sends): `error: interrupted`, status 130, no
    table. `-v` prints a line per seed, so the interrupt comes once seeds are being replayed."""
    argv = [*(a.format(**files) for a in SIM[:-1]), "1-1000000", "-v"]
    with subprocess.Popen(
        [str(BIN / "neuronetes"), *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd="/",
        stdin=subprocess.DEVNULL,
        env=_isolated(files),
    ) as proc:
        assert proc.stderr is not None
        first = proc.stderr.readline()
        assert " seed 1:" in first, first
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err[-500:]
    assert err.endswith("\nerror: interrupted\n") and "Traceback" not in err, err[-500:]
    assert out == ""
