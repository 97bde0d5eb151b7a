"""Cyclone installs as `cyclone-workflows`; PyPI's `cyclone` (a Twisted web server)
shares the top-level package name, so the SDK and the server refuse to import beside
it, with a message that says what to do."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT


def _import(module: str, path: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if path is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(path), env.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, "-c", f"import {module}"],
        capture_output=True,
        text=True,
        env=env,
        cwd=path or ROOT,  # not the checkout, whose *.egg-info would be found first
        timeout=60,
    )


def _foreign_cyclone(where: Path) -> Path:
    """The metadata of PyPI's cyclone 1.3, as pip would leave it."""
    info = where / "cyclone-1.3.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: cyclone\nVersion: 1.3\n")
    (info / "RECORD").write_text("cyclone/__init__.py,,\ncyclone/web.py,,\n")
    return where


def test_the_sdk_and_the_server_refuse_an_environment_with_the_other_cyclone(tmp_path):
    foreign = _foreign_cyclone(tmp_path)
    for module in ("pyclient", "service.main"):
        refused = _import(module, foreign)
        assert refused.returncode != 0
        assert "ForeignCyclone" in refused.stderr and "pip uninstall cyclone" in refused.stderr
        assert "cyclone-workflows" in refused.stderr


def test_the_distribution_is_cyclone_workflows():
    import importlib.metadata

    assert importlib.metadata.distribution("cyclone-workflows").metadata["Name"] == (
        "cyclone-workflows"
    )
    assert _import("pyclient").returncode == 0
