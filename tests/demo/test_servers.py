"""Which server binary the demo and the tests start."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from demo import servers


def _executable(directory: Path, name: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


def test_the_binary_next_to_the_interpreter_wins_over_one_earlier_on_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A global pyenv's ``moto_server`` (moto 5.2.1 on this machine) came first on ``PATH`` and
    answered pyarrow's multipart uploads in a form pyarrow refuses: the environment's own is used."""
    ours = _executable(tmp_path / "venv" / "bin", "some_server")
    _executable(tmp_path / "global" / "bin", "some_server")
    monkeypatch.setattr(sys, "executable", str(tmp_path / "venv" / "bin" / "python"))
    monkeypatch.setenv("PATH", str(tmp_path / "global" / "bin"))
    assert servers._binary("some_server", "some-package") == str(ours)


def test_a_binary_only_on_path_is_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    elsewhere = _executable(tmp_path / "global" / "bin", "some_server")
    monkeypatch.setattr(sys, "executable", str(tmp_path / "venv" / "bin" / "python"))
    monkeypatch.setenv("PATH", str(tmp_path / "global" / "bin"))
    assert servers._binary("some_server", "some-package") == str(elsewhere)


def test_a_missing_binary_names_the_package_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "executable", str(tmp_path / "venv" / "bin" / "python"))
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    with pytest.raises(servers.ServerUnavailable, match="some-package"):
        servers._binary("some_server", "some-package")
