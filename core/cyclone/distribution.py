"""Cyclone's distribution is ``cyclone-workflows``: the name ``cyclone`` on PyPI belongs
to another project (a Twisted web server) whose top-level package is also ``cyclone``.
Installed in one environment, the two would overwrite each other's files; the SDK and
the server refuse to start there with a message that says so, rather than fail later
in some import: importing this module checks (``pyclient`` and ``service`` import it
first).
"""

from __future__ import annotations

import importlib.metadata

NAME = "cyclone-workflows"


class ForeignCyclone(ImportError):
    """The other ``cyclone`` distribution is installed in this environment."""


def check() -> None:
    """Raise :class:`ForeignCyclone` when the PyPI project ``cyclone`` is installed."""
    try:
        other = importlib.metadata.distribution("cyclone")
    except importlib.metadata.PackageNotFoundError:
        return
    # An older checkout of this project was itself named "cyclone": it ships no web.py.
    if not any(str(f).replace("\\", "/") == "cyclone/web.py" for f in other.files or ()):
        return
    raise ForeignCyclone(
        f"the package 'cyclone' {other.version} (a Twisted web server, not Cyclone "
        f"workflows) is installed in this environment, and both use the top-level "
        f"package name 'cyclone'. Install {NAME} in an environment without it "
        f"(python -m venv), or remove it: pip uninstall cyclone, then pip install "
        f"--force-reinstall {NAME}"
    )


check()
