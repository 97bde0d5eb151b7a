"""A local server's life as `make run` lives it: the embedded Postgres it started stops
with it (or is said to keep running while others use it), `cyclone-server embedded
stop` stops it, and the metrics port follows --listen."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from service import config
from tests.conftest import ROOT
from tests.helpers import PATIENCE

SERVER = [sys.executable, "-m", "service"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Local:
    """A cyclone-server on the embedded Postgres under ``data_dir``."""

    def __init__(self, data_dir: Path, *flags: str):
        env = {k: v for k, v in os.environ.items() if k != "CYCLONE_DATABASE_URL"}
        self.proc = subprocess.Popen(
            [*SERVER, "--data-dir", str(data_dir), *flags],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=ROOT,
        )
        assert self.proc.stdout is not None
        self.output: list[str] = []
        for line in self.proc.stdout:
            self.output.append(line)
            if "Cyclone is serving on" in line:
                return
        self.proc.stdout.close()
        raise AssertionError("the server did not start:\n" + "".join(self.output))

    def interrupt(self) -> str:
        """Ctrl-C, as in a terminal running `make run`; its output until it exits."""
        self.proc.send_signal(signal.SIGINT)
        assert self.proc.stdout is not None
        with self.proc.stdout:
            rest = self.proc.stdout.read()
        assert self.proc.wait(PATIENCE) == 0
        return "".join(self.output) + rest

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(PATIENCE)
        assert self.proc.stdout is not None
        self.proc.stdout.close()


def embedded(data_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*SERVER, "embedded", *args, "--data-dir", str(data_dir)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=PATIENCE,
    )


def postgres_runs(data_dir: Path) -> bool:
    return embedded(data_dir, "status").returncode == 0


@pytest.fixture(scope="module")
def tmp_path() -> Iterator[Path]:
    """A data directory under the project (as root, the embedded Postgres runs as its
    own user, which cannot enter pytest's private temporary directories), made once:
    each test starts and stops the database in it."""
    path = ROOT / ".cyclone" / f"lifecycle-{uuid.uuid4().hex[:8]}"
    path.mkdir(parents=True)
    try:
        yield path
    finally:
        embedded(path, "stop")
        shutil.rmtree(path, ignore_errors=True)


def test_stopping_the_server_stops_the_embedded_postgres_it_started(tmp_path):
    server = Local(tmp_path, "--listen", "127.0.0.1:0")
    assert postgres_runs(tmp_path)
    output = server.interrupt()
    assert "stopping the embedded Postgres" in output
    assert not postgres_runs(tmp_path)


# Two servers and their embedded Postgres: make test-all (make test starts and stops one).
@pytest.mark.slow
def test_the_embedded_postgres_keeps_running_while_another_server_uses_it(tmp_path):
    first = Local(tmp_path, "--listen", "127.0.0.1:0")
    second = Local(tmp_path, "--listen", "127.0.0.1:0")
    output = first.interrupt()
    assert "keeps running for 1 other process(es)" in output and "make stop" in output
    assert postgres_runs(tmp_path)
    second.interrupt()
    assert not postgres_runs(tmp_path)


@pytest.mark.slow
def test_embedded_stop_stops_it_whoever_started_it(tmp_path):
    server = Local(tmp_path, "--listen", "127.0.0.1:0")
    try:
        stopped = embedded(tmp_path, "stop")
        assert stopped.returncode == 0 and "stopped the embedded Postgres" in stopped.stdout
        assert not postgres_runs(tmp_path)
        again = embedded(tmp_path, "stop")
        assert again.returncode == 0 and "is not running" in again.stdout
    finally:
        server.kill()


def test_the_metrics_port_follows_the_grpc_port(tmp_path):
    port = free_port()
    while True:  # its port + 2 must be free too
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 2))
                break
            except OSError:
                port = free_port()
    server = Local(tmp_path, "--listen", f"127.0.0.1:{port}")
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port + 2}/metrics", timeout=10) as r:
            assert b"cyclone_rpcs_total" in r.read() or r.status == 200
    finally:
        server.interrupt()


@pytest.mark.parametrize(
    ("listen", "metrics", "expected"),
    [
        ("127.0.0.1:50061", "auto", "127.0.0.1:50063"),
        ("[::1]:7000", "auto", "[::1]:7002"),
        ("127.0.0.1:0", "auto", "127.0.0.1:0"),
        ("127.0.0.1:50061", "127.0.0.1:9464", "127.0.0.1:9464"),
        ("127.0.0.1:50061", "off", "off"),
    ],
)
def test_auto_metrics_listen_is_the_port_of_listen_plus_two(listen, metrics, expected):
    settings = config.Settings(listen=listen, metrics_listen=metrics)
    assert config.metrics_listen(settings) == expected
