"""The view's app in this process, where what it calls can be watched: the plugin's own FastAPI app
over a real SQLite meta store, Airflow's metadata DB holding the DAGs, and the per-DAG auth manager
of the API-server suite (``auth_manager.PerDagAuthManager``) deciding access. Only the caller's
identity is given directly (``current_user`` overridden): the bearer-token check is the API
server's, and ``test_hardening.py`` runs it on a real one.
"""

from __future__ import annotations

import json
import socket
import uuid
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from airflow_provider_exactly_once.checkpoints.config import MetaStoreCheckpoint
from airflow_provider_exactly_once.core.epochs import ABORT_REASON_MAX_LENGTH
from airflow_provider_exactly_once.operations import EpochView, SinkOperations
from airflow_provider_exactly_once.sinks.config import IcebergSinkConfig
from airflow_provider_exactly_once.store import SqlSinkStateStore
from tests.support.builders import empty_write

if TYPE_CHECKING:
    from fastapi.testclient import TestClient

# The limited user may read and edit the DAG of MINE, not that of THEIRS; MISSING has no row.
MINE, THEIRS, MISSING = 1_767_225_600_000, 1_767_229_200_000, 1_767_232_800_000


class Watched(SinkOperations):
    """The service, recording which of its lookups the view makes, in order."""

    calls: list[tuple[str, int]]

    def dag_of(self, sink_id: str, epoch: int) -> str | None:
        self.calls.append(("dag_of", epoch))
        return super().dag_of(sink_id, epoch)

    def epoch(self, sink_id: str, epoch: int, *, dag_ids: Collection[str] | None = None) -> EpochView:
        self.calls.append(("epoch", epoch))
        return super().epoch(sink_id, epoch, dag_ids=dag_ids)


@dataclass
class View:
    ops: Watched
    sink_id: str
    secret: str
    conn_id: str
    clients: dict[str, TestClient] = field(default_factory=dict)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def view(airflow_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[View]:
    """Two Pending epochs of one sink, of two DAGs; the sink's REST catalog is down and its URI
    carries a token, as a careless connection would."""
    from airflow.api_fastapi.app import _AuthManagerState, create_auth_manager
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser
    from airflow.models.dag import DagModel
    from airflow.utils.session import create_session
    from fastapi.testclient import TestClient

    from airflow_provider_exactly_once.plugins.ui.app import create_app
    from airflow_provider_exactly_once.plugins.ui.security import current_user

    suffix = uuid.uuid4().hex[:8]
    mine_dag, theirs_dag, sink_id = f"eo_mine_{suffix}", f"eo_theirs_{suffix}", f"view-{suffix}"
    with create_session() as session:
        for dag_id in (mine_dag, theirs_dag):
            session.add(DagModel(dag_id=dag_id, bundle_name="dags-folder", fileloc=f"/dags/{dag_id}.py"))
    monkeypatch.setenv("EO_TEST_DAGS_BY_USER", json.dumps({"limited": [mine_dag]}))
    monkeypatch.setenv("AIRFLOW__CORE__AUTH_MANAGER", "tests.plugins.ui.auth_manager.PerDagAuthManager")
    monkeypatch.setattr(_AuthManagerState, "instance", None)
    create_auth_manager().init()

    secret = f"Planted-{uuid.uuid4().hex}"
    conn_id = f"eo_rest_{suffix}"
    uri = f"http://127.0.0.1:{_closed_port()}/catalog?token={secret}&sig={secret}"
    monkeypatch.setenv(
        f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps({"conn_type": "iceberg", "extra": {"type": "rest", "uri": uri}})
    )
    store = SqlSinkStateStore(f"sqlite:///{tmp_path / 'meta.db'}")
    config = IcebergSinkConfig(sink_id, ("db.events",), iceberg_conn_id=conn_id)
    store.registry.register_sink(sink_id, config.model_dump(mode="json"), MetaStoreCheckpoint().model_dump(mode="json"))
    for epoch, dag_id in ((MINE, mine_dag), (THEIRS, theirs_dag)):
        pre = empty_write(sink_id, epoch, "db.events", f"file://{tmp_path}/w")
        store.insert_pending(pre, run_id=f"scheduled__{epoch}", try_number=1, dag_id=dag_id)
    ops = Watched(store)
    ops.calls = []
    found = View(ops, sink_id, secret, conn_id)
    for name, role in (("limited", "user"), ("admin", "admin")):
        app = create_app(lambda: ops)
        app.dependency_overrides[current_user] = lambda name=name, role=role: SimpleAuthManagerUser(
            username=name, role=role
        )
        found.clients[name] = TestClient(app)
    try:
        yield found
    finally:
        store.dispose()


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("GET", "/api/sinks/{sink}/epochs/{epoch}", None),
        ("GET", "/sinks/{sink}/epochs/{epoch}", None),
        ("POST", "/api/sinks/{sink}/epochs/{epoch}/abort", {"reason": "probe", "dry_run": True}),
        ("POST", "/api/sinks/{sink}/epochs/{epoch}/commit", {"dry_run": True}),
        ("POST", "/api/sinks/{sink}/epochs/{epoch}/cleanup", {"dry_run": True}),
    ],
)
def test_a_hidden_epoch_is_decided_on_its_dag_alone_before_anything_else_is_loaded(
    view: View, method: str, path: str, body: dict[str, object] | None
) -> None:
    """Loading the whole epoch before asking whether the user may see it made a hidden epoch answer
    measurably slower than a missing one: its existence showed in the time of the 404."""
    client = view.clients["limited"]
    answers = {}
    for epoch in (THEIRS, MISSING):
        view.ops.calls.clear()
        answers[epoch] = client.request(method, path.format(sink=view.sink_id, epoch=epoch), json=body)
        assert answers[epoch].status_code == 404, answers[epoch].text
        assert view.ops.calls == [("dag_of", epoch)]
    assert answers[THEIRS].text.replace(str(THEIRS), "N") == answers[MISSING].text.replace(str(MISSING), "N")

    view.ops.calls.clear()
    mine = client.request(method, path.format(sink=view.sink_id, epoch=MINE), json=body)
    assert mine.status_code != 404, mine.text
    assert view.ops.calls[0] == ("dag_of", MINE)


def test_a_catalog_uri_token_is_masked_in_the_503_of_a_dry_run(view: View) -> None:
    client = view.clients["admin"]
    for action, body in (("commit", {"dry_run": True}), ("abort", {"reason": "down", "dry_run": True})):
        answer = client.post(f"/api/sinks/{view.sink_id}/epochs/{MINE}/{action}", json=body)
        assert answer.status_code == 503, answer.text
        detail = answer.json()["detail"]
        assert view.secret not in answer.text
        assert "?token=***&sig=***" in detail, detail
        page = client.get(f"/sinks/{view.sink_id}/epochs/{MINE}")
        assert page.status_code == 200 and view.secret not in page.text


def test_an_abort_reason_past_the_cap_is_refused_by_name(view: View) -> None:
    client = view.clients["admin"]
    url = f"/api/sinks/{view.sink_id}/epochs/{MINE}/abort"
    answer = client.post(url, json={"reason": "x" * (ABORT_REASON_MAX_LENGTH + 1), "dry_run": True})
    assert answer.status_code == 422, answer.text
    assert f"at most {ABORT_REASON_MAX_LENGTH} characters" in answer.text


def test_the_epoch_page_says_how_epochs_reach_the_tables_and_degrades_when_the_catalog_is_down(view: View) -> None:
    client = view.clients["admin"]
    single = client.get(f"/api/sinks/{view.sink_id}/epochs/{MINE}").json()["delivery"]
    assert (single["how"], single["tables"]) == ("one table", 1)  # answered without the catalog that is down

    fan_out = IcebergSinkConfig(f"{view.sink_id}-fan", ("db.events", "db.clicks"), iceberg_conn_id=view.conn_id)
    store = view.ops.store
    store.registry.register_sink(
        fan_out.sink_id, fan_out.model_dump(mode="json"), MetaStoreCheckpoint().model_dump(mode="json")
    )
    store.insert_pending(empty_write(fan_out.sink_id, MINE, "db.events", "file:///tmp/w"), run_id=None, try_number=None)
    answer = client.get(f"/api/sinks/{fan_out.sink_id}/epochs/{MINE}")
    assert answer.status_code == 200, answer.text
    delivery = answer.json()["delivery"]
    assert (delivery["how"], delivery["tables"]) == ("unknown", 2)
    assert delivery["why"].startswith("SinkUnavailable: ") and view.conn_id in delivery["why"]
    assert "?token=***&sig=***" in delivery["why"] and view.secret not in answer.text
    page = client.get(f"/sinks/{fan_out.sink_id}/epochs/{MINE}")
    assert page.status_code == 200 and view.secret not in page.text
    assert 'id="delivery" data-how="unknown"' in page.text and "unknown: SinkUnavailable: " in page.text


def test_the_epoch_page_and_its_api_show_the_epochs_history(view: View) -> None:
    from airflow_provider_exactly_once.core.epochs import Actor, ActorKind, acting

    with acting(Actor(ActorKind.UI, name="admin")):
        view.ops.store.record_warning(view.sink_id, MINE, warning="checked by hand")
    client = view.clients["admin"]
    history = client.get(f"/api/sinks/{view.sink_id}/epochs/{MINE}").json()["history"]
    assert [(e["event"], e["actor"], e["actor_name"], e["run_id"], e["try_number"]) for e in history] == [
        ("persisted", "unknown", None, f"scheduled__{MINE}", 1),
        ("warning", "ui", "admin", None, None),
    ]
    page = client.get(f"/sinks/{view.sink_id}/epochs/{MINE}").text
    timeline = page.split('id="history"', 1)[1].split("</section>", 1)[0]
    assert [part.split('"', 1)[0] for part in timeline.split('data-event="')[1:]] == ["persisted", "warning"]
    assert "by ui admin" in timeline and "checked by hand" in timeline and f"scheduled__{MINE}" in timeline


def test_the_epoch_page_and_its_api_show_the_range_an_incremental_epoch_consumed(view: View) -> None:
    from airflow_provider_exactly_once.core.input_ranges import SnapshotRange

    consumed = SnapshotRange(table="bronze.events", after_snapshot_id=11, to_snapshot_id=42)
    sink_id = f"{view.sink_id}-inc"
    write = empty_write(sink_id, MINE, "db.events", "file:///tmp/w").model_copy(
        update={"source_positions": consumed.positions(snapshots=3, files=0, records=0)}
    )
    view.ops.store.insert_pending(write, run_id=None, try_number=None)
    client = view.clients["admin"]
    shown = client.get(f"/api/sinks/{sink_id}/epochs/{MINE}").json()
    assert shown["epoch"]["consumed"] == "bronze.events: after snapshot 11 to snapshot 42", shown
    page = client.get(f"/sinks/{sink_id}/epochs/{MINE}").text
    assert 'id="consumed"' in page and "bronze.events: after snapshot 11 to snapshot 42" in page
    plain = client.get(f"/sinks/{view.sink_id}/epochs/{MINE}").text
    assert 'id="consumed"' not in plain  # an epoch that read no upstream table shows no such line


def test_a_sinks_page_draws_its_newest_epochs(view: View) -> None:
    """One column per epoch, by outcome, in epoch order; a revised epoch numbered; only for one
    sink's first page of every status; and more epochs than a page of the table under it."""
    store = view.ops.store
    committed, revised, aborted = MISSING, MISSING + 3_600_000, MISSING + 7_200_000
    for epoch in (committed, revised, aborted):
        pre = empty_write(view.sink_id, epoch, "db.events", f"file:///tmp/w/{epoch}")
        store.insert_pending(pre, run_id=f"scheduled__{epoch}", try_number=1)
        if epoch == aborted:
            store.mark_aborted(view.sink_id, epoch, write_id=pre.write_id, reason="checkpoint FAILED")
            continue
        store.decide_commit(view.sink_id, epoch, write_id=pre.write_id)
        store.mark_committed(view.sink_id, epoch, write_id=pre.write_id, committed={"db.events": "empty"})
        if epoch == revised:
            again = empty_write(view.sink_id, epoch, "db.events", f"file:///tmp/w/{epoch}-2")
            store.revisions.open_revision(again, expected_write_id=pre.write_id, run_id="r2", try_number=1)
            store.decide_commit(view.sink_id, epoch, write_id=again.write_id)
            store.mark_committed(view.sink_id, epoch, write_id=again.write_id, committed={"db.events": "empty"})
    client = view.clients["admin"]
    page = client.get(f"/?sink={view.sink_id}").text
    chart = page.split('id="epoch-chart"', 1)[1].split("</figure>", 1)[0]
    marks = [
        (int(part.split('"', 1)[0]), part.split('data-status="', 1)[1].split('"', 1)[0])
        for part in chart.split('data-epoch="')[1:]
    ]
    assert marks == [
        (MINE, "Pending"),
        (THEIRS, "Pending"),
        (committed, "Committed"),
        (revised, "Committed"),
        (aborted, "Aborted"),
    ]
    assert chart.count('class="revised"') == 1 and 'class="lane-text">1</text>' in chart
    assert "why: checkpoint FAILED" in chart  # the cause, on hover
    assert 'id="epoch-chart"' not in client.get(f"/?sink={view.sink_id}&status=Pending").text
    assert 'id="epoch-chart"' not in client.get("/").text  # every sink's epochs: no one picture

    for n in range(1, 120):  # a page of the table is 100 epochs; the picture draws up to 500
        store.insert_pending(
            empty_write(view.sink_id, MINE - n * 60_000, "db.events", "file:///tmp/w"), run_id=None, try_number=None
        )
    page = client.get(f"/?sink={view.sink_id}").text
    chart, table = page.split('id="epoch-chart"', 1)[1].split("</figure>", 1)
    assert chart.count('class="mark"') == 124 and table.count("<tr data-epoch=") == 100


def test_the_epochs_table_dates_each_epoch_and_gives_its_cause_in_a_row_of_its_own(view: View) -> None:
    """An epoch is its interval's start with its id beside, and its cause is not an 80-character cut
    in a last column: the abort reason, the last error and the warning, whole, under the epoch."""
    store = view.ops.store
    cause = "write failed on try 2: SparkArithmeticException: [CAST_OVERFLOW] " + "x" * 300 + " <b>end</b>"
    pre = empty_write(view.sink_id, MISSING, "db.events", "file:///tmp/w")
    store.insert_pending(pre, run_id="scheduled__x", try_number=2)
    store.mark_aborted(view.sink_id, MISSING, write_id=pre.write_id, reason=cause)
    store.record_warning(view.sink_id, MISSING, warning="refused: a reprocess kept out")
    page = view.clients["admin"].get(f"/?sink={view.sink_id}").text
    row = page.split(f'<tr data-epoch="{MISSING}"', 1)[1].split("</tbody>", 1)[0]
    assert '<a href="/exactly-once/sinks/' in row and ">2026-01-01T02:00Z</a>" in row
    assert f'<span class="epoch-id mono small muted" title="epoch id">{MISSING}</span>' in row
    detail = row.split(f'<tr class="detail" data-detail-of="{MISSING}">', 1)[1]
    assert "<b>Why aborted:</b> write failed on try 2: SparkArithmeticException: [CAST_OVERFLOW] " + "x" * 300 in detail
    assert "&lt;b&gt;end&lt;/b&gt;" in detail and "<b>end</b>" not in page
    assert "<b>Warning:</b> refused: a reprocess kept out" in detail
    mine = page.split(f'<tr data-epoch="{MINE}"', 1)[1].split("</tbody>", 1)[0]
    assert "detail" not in mine  # nothing to say: no row under it
