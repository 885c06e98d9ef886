from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.faults import FaultSwitch
from tests.support.pipeline import Pipeline

#: Every commit path runs on ``main`` and on a named branch, as Flink's committer tests do: a marker
#: walk or an append that reads ``main`` instead of the configured branch must fail a test.
BRANCHES = ["main", "audit"]


@pytest.fixture(params=BRANCHES)
def branch(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def faults() -> FaultSwitch:
    return FaultSwitch()


@pytest.fixture
def pipeline(meta_url: str, catalog_url: str, warehouse: Path, faults: FaultSwitch) -> Iterator[Pipeline]:
    p = Pipeline(
        meta_url=meta_url,
        catalog_url=catalog_url,
        warehouse=warehouse,
        catalog_name=f"cat_{uuid.uuid4().hex[:8]}",
        namespace=f"ns_{uuid.uuid4().hex[:8]}",
        fault=faults,
    )
    yield p
    p.dispose()
