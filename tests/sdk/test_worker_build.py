"""Worker(build_id=...): checked when the worker is made, taken from CYCLONE_BUILD_ID
when not given."""

from __future__ import annotations

import pytest

from pyclient import Worker
from pyclient.errors import InvalidArgument


@pytest.mark.parametrize("build", ["", "x" * 201, "a\nb", "tab\there"])
def test_an_invalid_build_id_is_refused_when_the_worker_is_made(build: str) -> None:
    with pytest.raises(InvalidArgument, match="build id"):
        Worker("127.0.0.1:1", build_id=build)


def test_the_build_id_comes_from_the_environment_unless_given(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CYCLONE_BUILD_ID", "release-7 (abc123)")
    assert Worker("127.0.0.1:1").build_id == "release-7 (abc123)"
    assert Worker("127.0.0.1:1", build_id="v8").build_id == "v8"
    monkeypatch.delenv("CYCLONE_BUILD_ID")
    assert Worker("127.0.0.1:1").build_id is None
