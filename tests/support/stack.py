"""The object-storage stack of the tests: one SeaweedFS (S3 and an Iceberg REST catalog) and one moto
server (S3 and Glue) per test session, on free ports of 127.0.0.1.

Where a server cannot start here the tests that need it skip with the reason, except under CI
(``CI=true``), where it is a failure: the suite must not go green by skipping the platform.
Each test takes its own namespace (``unique``) and prefix, so the session's servers are shared safely.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from demo.servers import MotoServer, SeaweedFS, ServerUnavailable


def _unavailable(what: str, exc: Exception) -> None:
    reason = f"{what} cannot start here: {exc}"
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI needs {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def seaweed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedFS]:
    server = SeaweedFS(Path(tmp_path_factory.mktemp("seaweedfs")))
    try:
        server.start()
    except ServerUnavailable as exc:
        _unavailable("SeaweedFS (weed mini)", exc)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def moto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoServer]:
    server = MotoServer(Path(tmp_path_factory.mktemp("moto")))
    try:
        server.start()
    except ServerUnavailable as exc:
        _unavailable("moto_server", exc)
    server.create_bucket("eo-lake")
    yield server
    server.stop()
