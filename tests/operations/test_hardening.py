"""The service under a caller who may read some DAGs only, a catalog that is down, stored credentials
and control characters: on real stores (SQLite and PostgreSQL), catalogs and files."""

from __future__ import annotations

import json
import uuid

import pytest

from airflow_provider_exactly_once.checkpoints.config import MetaStoreCheckpoint
from airflow_provider_exactly_once.core.errors import SinkUnavailable
from airflow_provider_exactly_once.core.precommit import PreCommit, TableWrite
from airflow_provider_exactly_once.operations import InvalidRequest, SinkNotFound, SinkOperations
from airflow_provider_exactly_once.sinks.config import IcebergSinkConfig
from tests.operations.helpers import coordinator, dead_catalog, write
from tests.recovery.helpers import E1
from tests.support.airflow_world import World
from tests.support.builders import OPEN_RANGE, empty_write, plant_stored_write

EPOCH_MAX = 2**63 - 1


def test_the_dag_filter_is_in_the_query_so_pages_are_full(world: World) -> None:
    """Newest 30 epochs of another DAG, then 25 of ours and 5 without a DAG: every page is full of ours."""
    store, sink_id = world.pipeline.store, world.sink_id
    # DAG ids of this test alone: on PostgreSQL the session's tests share one meta store.
    mine, theirs = f"ours-{sink_id}", f"theirs-{sink_id}"
    location = f"file://{world.tmp}/paged"
    for epoch in range(1, 61):
        dag_id = theirs if epoch > 30 else (mine if epoch > 5 else None)
        store.insert_pending(
            empty_write(sink_id, epoch, world.table, location), run_id=None, try_number=None, dag_id=dag_id
        )
    ops = SinkOperations(store)
    ours = list(range(30, 5, -1))
    pages = [ops.epochs(sink_id=sink_id, limit=10, offset=o, dag_ids={mine}) for o in (0, 10, 20, 30)]
    assert [[v.epoch for v in page] for page in pages] == [ours[:10], ours[10:20], ours[20:], []]
    assert [v.epoch for v in ops.epochs(limit=1000, dag_ids={mine, "elsewhere"})] == ours
    assert ops.epoch_count(sink_id=sink_id, dag_ids={mine}) == len(ours)
    assert ops.epochs(dag_ids=set()) == [] and ops.epoch_count(dag_ids=set()) == 0
    # No restriction: everything, epochs outside any DAG run included.
    assert len(ops.epochs(sink_id=sink_id, limit=1000)) == 60

    # The sinks: counted over the epochs the caller may read; a sink with none of them is not listed.
    [summary] = ops.sinks(dag_ids={mine})
    assert (summary.sink_id, summary.pending, summary.committed) == (sink_id, len(ours), 0)
    assert ops.sink(sink_id, dag_ids={mine}) == summary
    assert ops.sinks(dag_ids={"nobody"}) == []
    with pytest.raises(SinkNotFound):
        ops.sink(sink_id, dag_ids={"nobody"})
    assert sink_id in {s.sink_id for s in ops.sinks()}  # registered, whoever wrote its epochs


def test_clean_ups_are_counted_only_for_epochs_the_caller_may_read(world: World) -> None:
    coord = coordinator(world)
    theirs, ours = write(world, E1), write(world, E1 + 1)
    mine = f"ours-{world.sink_id}"
    coord.persist(theirs, dag_id=f"theirs-{world.sink_id}")
    coord.persist(ours, dag_id=mine)
    store = world.pipeline.store
    for pre in (theirs, ours):
        store.mark_aborted(world.sink_id, pre.epoch, write_id=pre.write_id, reason="crash before clean-up")
    ops = SinkOperations(store)
    assert [(s.sink_id, s.aborted, s.pending_cleanups) for s in ops.sinks(dag_ids={mine})] == [(world.sink_id, 1, 1)]
    assert ops.sink(world.sink_id).pending_cleanups == 2


def test_an_unreachable_catalog_is_sink_unavailable_naming_it_masked(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    conn_id, port = dead_catalog(monkeypatch)
    sink = IcebergSinkConfig(f"{world.sink_id}-down", (world.table,), iceberg_conn_id=conn_id)
    store = world.pipeline.store
    store.registry.register_sink(
        sink.sink_id, sink.model_dump(mode="json"), MetaStoreCheckpoint().model_dump(mode="json")
    )
    store.insert_pending(
        empty_write(sink.sink_id, E1, world.table, f"file://{world.tmp}/down"), run_id=None, try_number=None
    )
    ops = SinkOperations(store)
    for action in (
        lambda: ops.commit(sink.sink_id, E1, dry_run=True),
        lambda: ops.abort(sink.sink_id, E1, reason="down", dry_run=True),
        lambda: ops.cleanup(sink.sink_id, E1),
    ):
        with pytest.raises(SinkUnavailable) as raised:
            action()
        message = str(raised.value)
        assert conn_id in message and f"eo:***@127.0.0.1:{port}/catalog" in message
        assert "Planted-pw" not in message


def test_stored_credentials_are_masked_in_every_view(world: World) -> None:
    store = world.pipeline.store
    root = "s3://AKIAEXAMPLE:Planted-pw@bucket/exports"
    sink_id = f"{world.sink_id}-files"
    store.registry.register_sink(
        sink_id, {"kind": "files", "sink_id": sink_id, "root": root, "storage_options": {}}, None
    )
    pre = PreCommit(
        sink_id=sink_id, epoch=E1, write_id=str(uuid.uuid4()), tables=[TableWrite(table=root, location=f"{root}/_eo/w")]
    )
    store.insert_pending(pre, run_id=None, try_number=None)
    store.record_error(sink_id, E1, write_id=pre.write_id, error=f"cannot reach {root}/_eo/w")
    ops = SinkOperations(store)
    shown = json.dumps(
        [s.model_dump(mode="json") for s in ops.sinks()]
        + [v.model_dump(mode="json") for v in ops.epochs(limit=1000)]
        + [ops.epoch(sink_id, E1).model_dump(mode="json")]
    )
    assert "Planted-pw" not in shown and shown.count("s3://AKIAEXAMPLE:***@bucket/exports") >= 4


@pytest.mark.parametrize("reason", ["\x1b]0;owned\x07", "two\nlines", "tab\tbed", "c1\x9b2J"])
def test_an_abort_reason_with_control_characters_is_refused(world: World, reason: str) -> None:
    pre = write(world, E1)
    coordinator(world).persist(pre, dag_id="hourly")
    ops = SinkOperations(world.pipeline.store)
    for dry_run in (True, False):
        with pytest.raises(InvalidRequest, match="control character U\\+00"):
            ops.abort(world.sink_id, E1, reason=reason, dry_run=dry_run)
    assert world.pipeline.store.get(world.sink_id, E1).status.value == "Pending"  # type: ignore[union-attr]


def test_an_offset_past_64_bits_is_refused(world: World) -> None:
    ops = SinkOperations(world.pipeline.store)
    assert ops.epochs(offset=EPOCH_MAX) == []
    with pytest.raises(InvalidRequest, match="offset"):
        ops.epochs(offset=EPOCH_MAX + 1)


def test_a_stored_write_that_does_not_parse_is_shown_unreadable_and_the_rest_listed(world: World) -> None:
    """Issue 54: a row persisted with positions that are no range (no end), and one whose stored write
    does not parse at all (as persist refuses such positions now, a hand edit could still leave one):
    each is listed and shown as unreadable with why, naming the field, and the rows around them are
    listed as ever; whoever reads, all DAGs or some."""
    store, sink_id = world.pipeline.store, world.sink_id
    coord = coordinator(world)
    good, open_range, damaged, newest = (write(world, E1 + n) for n in range(4))
    for pre in (good, open_range, damaged, newest):
        coord.persist(pre, dag_id="hourly", run_id=f"scheduled__{pre.epoch}", try_number=1)
    plant_stored_write(store.engine, open_range, source_positions=OPEN_RANGE)
    plant_stored_write(store.engine, damaged, source_positions="no positions at all")
    ops = SinkOperations(store)

    for dag_ids in (None, {"hourly"}):
        listed = {v.epoch: v for v in ops.epochs(sink_id=sink_id, dag_ids=dag_ids)}
        assert sorted(listed) == [E1, E1 + 1, E1 + 2, E1 + 3]
        for readable in (good, newest):
            assert listed[readable.epoch].unreadable is None and listed[readable.epoch].files == 1
        assert "source_positions" in (listed[E1 + 1].unreadable or "")
        assert "source_positions" in (listed[E1 + 2].unreadable or "")
        for pre in (open_range, damaged):
            view = listed[pre.epoch]
            assert (view.status, view.write_id, view.dag_id, view.tables) == ("Pending", pre.write_id, "hourly", ())
            assert json.loads(json.dumps(view.model_dump(mode="json")))["unreadable"] == view.unreadable

    # One epoch, as its page and eo-sink show read it (from the write's head, not its whole metadata).
    for pre in (open_range, damaged):
        shown = ops.epoch(sink_id, pre.epoch)
        assert shown.unreadable and "source_positions" in shown.unreadable and pre.write_id in shown.unreadable
        assert (shown.run_id, shown.try_number, shown.revisions) == (f"scheduled__{pre.epoch}", 1, ())
        assert ops.epoch(sink_id, pre.epoch, dag_ids={"hourly"}).unreadable == shown.unreadable
        assert [e.event for e in ops.history(sink_id, pre.epoch, dag_ids={"hourly"})] == ["persisted"]
    assert ops.epoch(sink_id, E1).unreadable is None and ops.epoch(sink_id, E1).consumed is None
    [summary] = [s for s in ops.sinks() if s.sink_id == sink_id]
    assert summary.pending == 4
