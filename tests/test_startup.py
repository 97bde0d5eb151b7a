"""Start-up misconfigurations: each one ends the process with one line that names the
setting and what is wrong with it, and no traceback."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from service import loop
from tests.conftest import ROOT, RunningServer
from tests.test_tls import make_cert

SERVER = [sys.executable, "-m", "service", "--listen", "127.0.0.1:0", "--metrics-listen", "off"]


def start(database_url: str, *flags: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    """Start cyclone-server with ``flags``; its exit status and output. A server that
    starts serving instead of exiting is stopped, and its status is 0."""
    proc = subprocess.Popen(
        [*SERVER, *flags],
        env={**os.environ, "CYCLONE_DATABASE_URL": database_url, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=ROOT,
    )
    assert proc.stdout is not None
    output = []
    with proc.stdout:
        for line in proc.stdout:
            output.append(line)
            if "Cyclone is serving on" in line:
                proc.terminate()
                proc.wait(30)
                return 0, "".join(output)
    return proc.wait(30), "".join(output)


@pytest.fixture
def files(tmp_path: Path) -> dict[str, str]:
    pem = make_cert("localhost")
    paths = {
        "cert": tmp_path / "server.crt",
        "key": tmp_path / "server.key",
        "garbage": tmp_path / "garbage.pem",
        "dir": tmp_path,
        "tokens": tmp_path / "tokens.txt",
    }
    paths["cert"].write_bytes(pem.cert)
    paths["key"].write_bytes(pem.key)
    paths["garbage"].write_text("not a PEM file\n")
    paths["other_key"] = tmp_path / "other.key"
    paths["other_key"].write_bytes(make_cert("other").key)
    paths["tokens"].write_text("this is not a token line\n")
    return {name: str(path) for name, path in paths.items()}


def cases(files: dict[str, str], busy_port: int) -> list[tuple[list[str], dict, str]]:
    cert, key = files["cert"], files["key"]
    return [
        (["--tls-cert", cert, "--tls-key", cert], {}, "--tls-key"),
        (["--tls-cert", key, "--tls-key", key], {}, "--tls-cert"),
        (["--tls-cert", cert, "--tls-key", files["garbage"]], {}, "--tls-key"),
        (["--tls-cert", cert, "--tls-key", files["other_key"]], {}, "does not go with"),
        (["--tls-cert", cert, "--tls-key", key, "--tls-client-ca", key], {}, "--tls-client-ca"),
        (["--tls-cert", files["dir"], "--tls-key", key], {}, "--tls-cert"),
        (["--token-file", files["tokens"]], {}, "--token-file"),
        (["--listen", "127.0.0.1:99999"], {}, "--listen"),
        (["--listen", "no port here"], {}, "--listen"),
        (["--listen", f"127.0.0.1:{busy_port}"], {}, "--listen"),
        (["--metrics-listen", "nonsense"], {}, "--metrics-listen"),
        (["--database-url", "postgresql://127.0.0.1:1/nothing"], {}, "database"),
        (["--database-url", "not a url"], {}, "database"),
        ([], {"CYCLONE_LEASE": "long"}, "CYCLONE_LEASE"),
        (["--lease", "long"], {}, "--lease"),
        (["--claim-recheck", "0"], {}, "--claim-recheck"),
        (["--event-loop", "tokio"], {}, "--event-loop"),
    ]


# A server process per case: make test-all (the uvloop test starts one in make test).
@pytest.mark.slow
def test_every_misconfiguration_is_one_line_without_a_traceback(
    database_url: str, files: dict[str, str]
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        failures = []
        for flags, env, word in cases(files, port):
            status, output = start(database_url, *flags, env=env)
            lines = [line for line in output.splitlines() if line.strip()]
            ok = (
                status not in (0, None)
                and "Traceback" not in output
                and len(lines) <= 2
                and word in lines[-1]
            )
            if not ok:
                failures.append((flags, env, status, output[-600:]))
    assert not failures, "\n\n".join(map(str, failures))


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        pytest.param(
            ["--metrics-listen", "127.0.0.1:70000"],
            ("--metrics-listen '127.0.0.1:70000'", "65535"),
            id="metrics",
        ),
        pytest.param(
            # auto: the port of --listen plus 2.
            ["--listen", "127.0.0.1:65535", "--metrics-listen", "auto"],
            ("--metrics-listen auto", "65537", "set --metrics-listen"),
            id="auto",
        ),
        pytest.param(
            ["--listen", "127.0.0.1:65534"], ("--metrics-listen auto", "65536"), id="default"
        ),
        pytest.param(
            ["--listen", "127.0.0.1:70000"], ("--listen '127.0.0.1:70000'", "65535"), id="listen"
        ),
        pytest.param(
            # Digits that int() reads, but not ASCII ones.
            ["--metrics-listen", "127.0.0.1:\u0665\u0660"],
            ("--metrics-listen",),
            id="arabic-indic-digits",
        ),
    ],
)
def test_a_port_past_65535_is_one_line_on_stderr_naming_the_setting(
    database_url: str, flags: list[str], words: tuple[str, ...]
) -> None:
    env = {**os.environ, "CYCLONE_DATABASE_URL": database_url}
    env.pop("CYCLONE_METRICS_LISTEN", None)
    argv = [*SERVER, *flags]
    if "--metrics-listen" not in flags:
        argv.remove("--metrics-listen")
        argv.remove("off")  # the default, auto
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr + done.stdout
    [line] = done.stderr.splitlines()
    assert line.startswith("cyclone-server: ")
    for word in words:
        assert word in line, line


def test_the_server_runs_on_uvloop_unless_told_otherwise(
    database_url: str, cyclone_server: RunningServer
) -> None:
    """The server extra installs uvloop, and auto picks it (service/loop.py); asyncio's
    own loop stays one flag away. The in-process test servers run on the same choice."""
    seen = {}
    for flags in ((), ("--event-loop", "uvloop"), ("--event-loop", "asyncio")):
        status, output = start(database_url, *flags)
        assert status == 0, output
        match = re.search(r"\(event loop: (\w+)\)", output)
        assert match, output
        seen[flags] = match.group(1)
    assert seen == {
        (): "uvloop",
        ("--event-loop", "uvloop"): "uvloop",
        ("--event-loop", "asyncio"): "asyncio",
    }
    assert cyclone_server._loop is not None
    assert loop.name(cyclone_server._loop) == "uvloop"


def _banner(proc: subprocess.Popen[str]) -> list[str]:
    """The lines the server prints up to its grpcurl advice (it serves by then)."""
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:
        lines.append(line.rstrip("\n"))
        if line.startswith("Try ("):
            return lines
    raise AssertionError(f"no banner in {lines}")


def test_the_banner_names_every_address_the_server_answers_on(database_url: str) -> None:
    argv = [
        *SERVER[:-1],
        "auto",
        "--console-url",
        "http://127.0.0.1:8080/",
        "--http-listen",
        "127.0.0.1:0",
    ]
    proc = subprocess.Popen(
        argv,
        env={**os.environ, "CYCLONE_DATABASE_URL": database_url},
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=ROOT,
    )
    try:
        lines = _banner(proc)
    finally:
        proc.terminate()
        proc.communicate(timeout=30)
    address = re.search(r"Cyclone is serving on (\S+)\.", "\n".join(lines))
    assert address, lines
    rows = {line.split()[0]: line.split()[1] for line in lines if line.startswith("  ")}
    assert rows["gRPC"] == address.group(1)
    assert rows["console"] == "http://127.0.0.1:8080/"
    assert re.fullmatch(r"http://127\.0\.0\.1:\d+/metrics", rows["metrics"]), rows
    assert re.fullmatch(r"http://127\.0\.0\.1:\d+", rows["http"]), rows


MAKE_RUN = ["make", "--no-print-directory", "-o", ".venv/.serve-stamp", "run"]


def _make_run(database_url: str, addr: str, console: str) -> subprocess.Popen[str]:
    # -o: never reinstall the packages here; the test runs what is installed.
    return subprocess.Popen(
        [*MAKE_RUN, f"ADDR={addr}", f"CONSOLE={console}"],
        env={**os.environ, "CYCLONE_DATABASE_URL": database_url},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        start_new_session=True,
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_make_run_prints_the_console_url_in_the_servers_banner(database_url: str) -> None:
    port = _free_port()
    addr, console = f"127.0.0.1:{port}", f"127.0.0.1:{_free_port()}"
    proc = _make_run(database_url, addr, console)
    try:
        lines = _banner(proc)
        rows = {line.split()[0]: line.split()[1] for line in lines if line.startswith("  ")}
        assert rows["gRPC"] == addr
        assert rows["console"] == f"http://{console}/"
        with urllib.request.urlopen(rows["console"], timeout=30) as page:
            assert page.status == 200
        assert rows["metrics"].startswith("http://127.0.0.1:")
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.communicate(timeout=60)


def test_make_run_with_the_console_port_taken_is_one_line_and_serves_nothing(
    database_url: str,
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        console = f"127.0.0.1:{taken.getsockname()[1]}"
        port = _free_port()
        proc = _make_run(database_url, f"127.0.0.1:{port}", console)
        out, err = proc.communicate(timeout=120)
    assert proc.returncode != 0
    assert "Traceback" not in out + err
    # make adds its own line ("make: *** [run] Error 1") after the command's.
    [line] = [line for line in err.splitlines() if not line.startswith("make")]
    assert line.startswith(f"cyclone: error: cannot serve the console on {console}: ")
    assert "set CONSOLE to a free host:port" in line
    assert "Cyclone is serving" not in out  # no server without its console
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", port)) != 0


def test_an_http_listen_address_in_use_is_one_line_that_names_the_setting(
    database_url: str,
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, err = start(database_url, "--http-listen", f"127.0.0.1:{port}")
    assert code != 0
    assert f"cyclone-server: cannot serve --http-listen 127.0.0.1:{port}" in err, err
    assert "Traceback" not in err
    code, err = start(database_url, "--http-listen", "nowhere")
    assert code == 2 and "--http-listen must be host:port or off" in err, err
