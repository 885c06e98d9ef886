"""Fixtures shared by every suite: the two meta-store/catalog backends and unique names.

PostgreSQL is the one at 127.0.0.1:5432 (override with ``EO_TEST_PG_URL``). Each test session gets a
fresh database on it, dropped at the end, so runs never see each other's rows. Where PostgreSQL
cannot be reached the ``postgres`` parameter is skipped with the reason, except under CI
(``CI=true``), where a missing PostgreSQL is a failure: the suite must not go green by skipping.

Hypothesis draws its examples from a fixed seed under CI (profile ``ci``: ``derandomize``, and the
reproduction blob of a failure printed), so that a red CI run is about the commit under test, not
about a new draw that happened upon an old bug; a run by hand keeps drawing new examples and saves
the failing ones in ``.hypothesis/``. ``HYPOTHESIS_PROFILE=ci`` or ``=default`` chooses either anywhere.
"""

from __future__ import annotations

import os
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import sqlalchemy as sa

# First of all: a private AIRFLOW_HOME for every suite, and the Airflow fixtures (airflow_home, world,
# unique) for the suites that run DAGs; a suite's own conftest may override ``world``.
from tests.support.airflow_env import airflow_home, unique, world  # noqa: F401
from tests.support.stack import moto, seaweed  # noqa: F401


def _hypothesis_profile() -> None:
    try:
        from hypothesis import settings
    except ImportError:  # a compatibility cell (scripts/compat) installs pytest alone: no property tests there
        return
    settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "default"))


_hypothesis_profile()

#: The files of one or two tests that each take minutes (a cluster, a fresh environment): handed out
#: first. pytest-xdist's own order for ``--dist loadfile`` hands out the files with the most tests
#: first, which left these last, each ending the run on one worker while the others idled (CI's
#: suite of 2026-12-02: its last 7 minutes on them). scripts/test passes ``--no-loadscope-reorder``;
#: this hook orders the files as pytest-xdist would, these first.
LONG_FILES_FIRST = (
    "tests/test_distribution.py",
    "tests/fault_harness/test_fault_harness_production.py",
    "tests/fault_harness/test_fault_harness_random.py",
    "tests/fault_harness/test_fault_harness.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    per_file = Counter(item.nodeid.split("::", 1)[0] for item in items)
    rank = {path: i for i, path in enumerate(LONG_FILES_FIRST)}

    def order(item: pytest.Item) -> tuple[int, int]:
        path = item.nodeid.split("::", 1)[0]
        return (rank[path], 0) if path in rank else (len(rank), -per_file[path])

    items.sort(key=order)  # stable: a file's tests keep their order


PG_ADMIN_URL = os.environ.get("EO_TEST_PG_URL", "postgresql+psycopg2://postgres@127.0.0.1:5432/test")
BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


def _pg_unreachable_reason() -> str | None:
    try:
        import psycopg2  # noqa: F401
    except ImportError:
        # A compatibility cell without the extra (scripts/compat): nothing of PostgreSQL to test there.
        return "the [postgres] extra is not installed (psycopg2 missing)"
    try:
        engine = sa.create_engine(PG_ADMIN_URL, connect_args={"connect_timeout": 3})
        with engine.connect() as conn:
            conn.execute(sa.text("select 1"))
        engine.dispose()
    except Exception as exc:  # any failure to connect means "not here"
        return f"PostgreSQL not reachable at {PG_ADMIN_URL}: {type(exc).__name__}: {str(exc).splitlines()[0]}"
    return None


@contextmanager
def _fresh_pg_database() -> Iterator[str]:
    reason = _pg_unreachable_reason()
    if reason:
        if os.environ.get("CI") == "true" and "extra" not in reason:
            pytest.fail(f"CI needs PostgreSQL: {reason}")
        pytest.skip(reason)
    name = f"eo_test_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    try:
        yield PG_ADMIN_URL.rsplit("/", 1)[0] + "/" + name
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    """URL of a fresh PostgreSQL database for this test session."""
    with _fresh_pg_database() as url:
        yield url


@pytest.fixture
def pg_database_url() -> Iterator[str]:
    """URL of a PostgreSQL database of this test alone (for a schema that is not ours, as Airflow's)."""
    with _fresh_pg_database() as url:
        yield url


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def meta_url(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """SQLAlchemy URL of the meta store for this test (a SQLite file, or the session's PG database)."""
    if backend == "postgres":
        return str(request.getfixturevalue("pg_url"))
    return f"sqlite:///{tmp_path / 'meta.db'}"


@pytest.fixture
def catalog_url(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """URL for a pyiceberg SQL catalog on the same backend as the meta store."""
    if backend == "postgres":
        return str(request.getfixturevalue("pg_url"))
    return f"sqlite:///{tmp_path / 'catalog.db'}"


@pytest.fixture
def warehouse(tmp_path: Path) -> Path:
    path = tmp_path / "warehouse"
    path.mkdir()
    return path


@pytest.fixture
def sink_id() -> str:
    """Unique per test, so tests sharing the session's PostgreSQL database never meet."""
    return f"sink-{uuid.uuid4().hex[:10]}"
