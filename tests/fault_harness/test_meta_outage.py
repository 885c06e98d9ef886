"""The harness's meta store outages: pipelines act in threads on one server, so outages overlap.

A 200-epoch run once lost four actions to it: two outages overlapped, the first restart succeeded
and the second ``pg_ctl start`` of a running server failed. Overlapping outages now merge.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fault_harness.cluster import PostgresServer

pytestmark = pytest.mark.postgres


@pytest.fixture
def server() -> Iterator[PostgresServer]:
    if not list(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl")):
        reason = "no PostgreSQL server binaries under /usr/lib/postgresql (Debian package postgresql)"
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    # Not pytest's tmp_path: its root is private to this user, and the server runs as postgres.
    root = Path(tempfile.mkdtemp(prefix="eo-meta-outage-"))
    os.chmod(root, 0o755)
    server = PostgresServer(root / "pg")
    try:
        server.init()
        yield server
    finally:
        server.stop("fast")
        shutil.rmtree(root, ignore_errors=True)


def test_overlapping_outages_merge_and_the_last_one_starts_the_server(server: PostgresServer) -> None:
    first_in = threading.Event()
    second_out = threading.Event()
    stopped: dict[str, bool] = {}
    down_inside: dict[str, bool] = {}

    def first() -> None:
        with server.outage() as stopped_here:
            stopped["first"] = stopped_here
            first_in.set()
            second_out.wait(timeout=60)
            down_inside["first, after the second ended"] = not server.running()

    def second() -> None:
        first_in.wait(timeout=60)
        with server.outage() as stopped_here:
            stopped["second"] = stopped_here
            down_inside["second"] = not server.running()
            time.sleep(0.5)
        second_out.set()

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)

    assert stopped == {"first": True, "second": False}
    assert down_inside == {"second": True, "first, after the second ended": True}
    assert server.running()
