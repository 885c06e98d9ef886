"""The view names each epoch's day (data interval and its run's logical date) and links a run only
while Airflow still has it: a ``dags test`` of the same date deletes the earlier run, and a revision
written by it keeps its run id, shown as text. In this process, over Airflow's own metadata DB."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from airflow_provider_exactly_once.checkpoints.config import MetaStoreCheckpoint
from airflow_provider_exactly_once.operations import SinkOperations
from airflow_provider_exactly_once.plugins.ui import render
from airflow_provider_exactly_once.sinks.config import IcebergSinkConfig
from airflow_provider_exactly_once.store import SqlSinkStateStore
from airflow_provider_exactly_once.store.registry import RunDates
from tests.support.builders import empty_write

if TYPE_CHECKING:
    from fastapi.testclient import TestClient

DAY = datetime(2024, 6, 1, tzinfo=UTC)
EPOCH = int(DAY.timestamp() * 1000)
GONE_DAY = DAY - timedelta(days=1)
GONE_EPOCH = int(GONE_DAY.timestamp() * 1000)


@dataclass
class Page:
    client: TestClient
    sink_id: str
    dag_id: str
    live_run: str
    gone_run: str


@pytest.fixture
def page(airflow_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Page]:
    """Two epochs: the day 2024-06-01 written by a run Airflow has, the day before by a run it deleted."""
    from airflow.api_fastapi.app import _AuthManagerState, create_auth_manager
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser
    from airflow.models.dag import DagModel
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session
    from airflow.utils.state import DagRunState
    from airflow.utils.types import DagRunType
    from fastapi.testclient import TestClient

    from airflow_provider_exactly_once.plugins.ui.app import create_app
    from airflow_provider_exactly_once.plugins.ui.security import current_user

    suffix = uuid.uuid4().hex[:8]
    dag_id, sink_id = f"eo_orders_{suffix}", f"orders-{suffix}"
    live_run, gone_run = f"manual__live_{suffix}", f"manual__gone_{suffix}"
    with create_session() as session:
        session.add(DagModel(dag_id=dag_id, bundle_name="dags-folder", fileloc=f"/dags/{dag_id}.py"))
        session.flush()
        session.add(
            DagRun(
                dag_id=dag_id,
                run_id=live_run,
                logical_date=DAY + timedelta(days=1),
                data_interval=(DAY, DAY + timedelta(days=1)),
                run_after=DAY + timedelta(days=1),
                run_type=DagRunType.MANUAL,
                state=DagRunState.SUCCESS,
            )
        )
    monkeypatch.setenv("EO_TEST_DAGS_BY_USER", json.dumps({}))
    monkeypatch.setenv("AIRFLOW__CORE__AUTH_MANAGER", "tests.plugins.ui.auth_manager.PerDagAuthManager")
    monkeypatch.setattr(_AuthManagerState, "instance", None)
    create_auth_manager().init()

    store = SqlSinkStateStore(f"sqlite:///{tmp_path / 'meta.db'}")
    config = IcebergSinkConfig(sink_id, ("db.events",), iceberg_conn_id="unused")
    store.registry.register_sink(sink_id, config.model_dump(mode="json"), MetaStoreCheckpoint().model_dump(mode="json"))
    for epoch, run_id, start in ((EPOCH, live_run, DAY), (GONE_EPOCH, gone_run, GONE_DAY)):
        end = start + timedelta(days=1)
        store.runs.record(dag_id, run_id, RunDates(end, start, end))  # ``dags test`` runs: logical date = end
        pre = empty_write(sink_id, epoch, "db.events", f"file://{tmp_path}/w")
        store.insert_pending(pre, run_id=run_id, try_number=1, dag_id=dag_id)
    app = create_app(lambda: SinkOperations(store))
    app.dependency_overrides[current_user] = lambda: SimpleAuthManagerUser(username="admin", role="admin")
    try:
        yield Page(TestClient(app), sink_id, dag_id, live_run, gone_run)
    finally:
        store.dispose()


def test_the_epoch_page_names_the_day_and_links_a_run_that_exists(page: Page) -> None:
    html = page.client.get(f"/sinks/{page.sink_id}/epochs/{EPOCH}").text
    assert 'id="run-link"' in html and f"/runs/{page.live_run}" in html
    assert "[2024-06-01T00:00Z, 2024-06-02T00:00Z)" in html
    assert '<dd class="mono" id="logical-date"' in html and "2024-06-02T00:00Z" in html


def test_a_run_airflow_deleted_is_shown_by_its_id_without_a_link(page: Page) -> None:
    html = page.client.get(f"/sinks/{page.sink_id}/epochs/{GONE_EPOCH}").text
    assert 'id="run-link"' not in html and "/runs/" not in html
    assert 'id="run-id"' in html and page.gone_run in html and "no longer in Airflow" in html
    assert "[2024-05-31T00:00Z, 2024-06-01T00:00Z)" in html


def test_the_epoch_list_links_only_the_runs_that_exist_and_shows_each_interval(page: Page) -> None:
    html = page.client.get("/", params={"sink": page.sink_id}).text
    assert html.count('class="run-link"') == 1 and f"/runs/{page.live_run}" in html
    assert page.gone_run in html and f"/runs/{page.gone_run}" not in html
    assert "[2024-06-01T00:00Z, 2024-06-02T00:00Z)" in html and "logical date 2024-06-02T00:00Z" in html


def test_when_airflow_cannot_be_asked_no_run_is_linked(monkeypatch: pytest.MonkeyPatch) -> None:
    import airflow.utils.session

    def unavailable() -> None:
        raise RuntimeError("metadata database down")

    monkeypatch.setattr(airflow.utils.session, "create_session", unavailable)
    assert render.existing_runs([("dag", "run")]) == frozenset()
    assert render.existing_runs([(None, "run"), ("dag", None)]) == frozenset()
