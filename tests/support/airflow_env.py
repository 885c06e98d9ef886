"""Real Airflow for the operator tests: a private AIRFLOW_HOME, an initialised SQLite metadata DB,
DAGs run with ``dag.test()``, connections as ``AIRFLOW_CONN_<ID>`` JSON environment variables.

Airflow reads its configuration when first imported, so the environment is set when this module is
imported: the root ``tests/conftest.py`` imports it (and its fixtures) before any test module, so
no suite, however it is selected, touches ``~/airflow``.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

_HOME = Path(tempfile.mkdtemp(prefix="eo-airflow-home-"))
(_HOME / "dags").mkdir()
_ENV = {
    "AIRFLOW_HOME": str(_HOME),
    "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
    "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
}
# The DAGs folder and the metadata DB are Airflow's defaults under AIRFLOW_HOME ($AIRFLOW_HOME/dags,
# sqlite:///$AIRFLOW_HOME/airflow.db); not setting them keeps other suites' child processes, which
# inherit this environment and set their own AIRFLOW_HOME, from pointing at ours.
if "airflow.configuration" in sys.modules and os.environ.get("AIRFLOW_HOME") != str(_HOME):
    # Another suite imported Airflow first, with its own configuration: these tests would then
    # write into that home's database. Refuse rather than touch it.
    raise RuntimeError("tests.support.airflow_env must be imported before anything imports Airflow")
os.environ.update(_ENV)

import shutil  # noqa: E402
import uuid  # noqa: E402
from collections.abc import Iterator  # noqa: E402
from typing import TYPE_CHECKING  # noqa: E402

import pytest  # noqa: E402

if TYPE_CHECKING:
    from tests.support.airflow_world import World


@pytest.fixture(scope="session")
def airflow_home() -> Iterator[Path]:
    """Airflow's metadata DB, created once per session from the ORM (faster than replaying migrations)."""
    from airflow.dag_processing.bundles.manager import DagBundlesManager
    from airflow.utils import db

    db.initdb()
    DagBundlesManager().sync_bundles_to_db()
    yield _HOME
    shutil.rmtree(_HOME, ignore_errors=True)


@pytest.fixture
def world(airflow_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    """A sink's world on SQLite: meta store, Iceberg SQL catalog, connections for both."""
    from tests.support.airflow_world import World

    w = World.create(tmp_path, monkeypatch, meta_url=f"sqlite:///{tmp_path / 'meta.db'}")
    yield w
    w.dispose()


@pytest.fixture
def unique() -> str:
    return uuid.uuid4().hex[:8]
