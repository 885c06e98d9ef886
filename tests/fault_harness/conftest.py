"""The local-stack cluster of a fault-harness test file (docs/faults.md): one per module, so the named
scenarios and the fixed-seed random run, each in a file of its own, can run on two test workers."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from fault_harness.cluster import Cluster, cluster


@pytest.fixture(scope="module")
def fault_cluster(pg_url: str) -> Iterator[Cluster]:  # pg_url: skips (fails under CI) without PostgreSQL
    with cluster(parallelism=3, keep_root=bool(os.environ.get("EO_FAULTS_KEEP"))) as c:
        yield c
