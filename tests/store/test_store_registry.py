"""The recovery DAG's part of the meta store: the sink registry, the orphan queue, the per-sink lock."""

from __future__ import annotations

import threading
import uuid
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa

from airflow_provider_exactly_once.core.errors import InvalidPreCommit, InvalidSinkConfig, StateConflict
from airflow_provider_exactly_once.core.ports import ORPHAN_EPOCH
from airflow_provider_exactly_once.core.precommit import PreCommit
from airflow_provider_exactly_once.store import SqlSinkStateStore
from airflow_provider_exactly_once.store.database import known_revisions
from tests.support.builders import make_pre_commit

EPOCH = 1_700_000_000_000


def _sink() -> str:
    return f"sink-{uuid.uuid4().hex[:10]}"


def _updated_at(store: SqlSinkStateStore, sink_id: str) -> object:
    with store.engine.connect() as conn:
        return conn.execute(
            sa.text("SELECT updated_at FROM sink_registry WHERE sink_id = :s"), {"s": sink_id}
        ).scalar_one()


# -- registry ------------------------------------------------------------------------------------


def test_register_is_an_idempotent_upsert(store: SqlSinkStateStore) -> None:
    sink_id = _sink()
    config = {"kind": "files", "sink_id": sink_id, "root": "/data/a", "storage_options": {}}
    store.registry.register_sink(sink_id, config, None)
    first = _updated_at(store, sink_id)
    store.registry.register_sink(sink_id, dict(config), None)  # unchanged: nothing is written
    assert _updated_at(store, sink_id) == first
    assert store.registry.registered_sink(sink_id) == (config, None)

    moved = {**config, "root": "/data/b"}
    checkpoint = {"kind": "metastore", "name_template": "{sink_id}"}
    store.registry.register_sink(sink_id, moved, checkpoint)
    assert store.registry.registered_sink(sink_id) == (moved, checkpoint)
    assert [s for s in store.registry.registered_sinks() if s[0] == sink_id] == [(sink_id, moved, checkpoint)]
    # persist knows no checkpoint: its registration keeps the one commit registered
    store.registry.register_sink(sink_id, config, None)
    assert store.registry.registered_sink(sink_id) == (config, checkpoint)


def test_registered_sinks_lists_every_sink_in_order(store: SqlSinkStateStore) -> None:
    ids = sorted(_sink() for _ in range(3))
    for sink_id in reversed(ids):
        store.registry.register_sink(sink_id, {"kind": "files", "sink_id": sink_id, "root": f"/r/{sink_id}"}, None)
    listed = [s[0] for s in store.registry.registered_sinks() if s[0] in ids]
    assert listed == ids
    assert store.registry.registered_sink(_sink()) is None


def test_register_refuses_a_config_of_another_sink(store: SqlSinkStateStore) -> None:
    with pytest.raises(InvalidSinkConfig, match="names sink"):
        store.registry.register_sink(_sink(), {"kind": "files", "sink_id": "other", "root": "/r"}, None)
    with pytest.raises(InvalidSinkConfig, match="JSON"):
        store.registry.register_sink(_sink(), {"kind": "files", "root": object()}, None)


def test_concurrent_registrations_of_one_sink_all_succeed(store: SqlSinkStateStore) -> None:
    sink_id = _sink()
    errors: list[BaseException] = []
    barrier = threading.Barrier(4)

    def register(n: int) -> None:
        try:
            barrier.wait()
            store.registry.register_sink(sink_id, {"kind": "files", "sink_id": sink_id, "root": f"/r/{n}"}, None)
        except BaseException as exc:  # collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=register, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    registered = store.registry.registered_sink(sink_id)
    assert registered is not None and registered[0]["root"] in {f"/r/{n}" for n in range(4)}


# -- orphans -------------------------------------------------------------------------------------


def _orphan(sink_id: str, write_id: str | None = None) -> PreCommit:
    pre = make_pre_commit(sink_id, ORPHAN_EPOCH, write_id=write_id, files=0)
    return pre


def test_known_writes_are_live_rows_and_queued_cleanups(store: SqlSinkStateStore) -> None:
    sink_id = _sink()
    pending = make_pre_commit(sink_id, EPOCH)
    store.insert_pending(pending, run_id=None, try_number=None)
    aborted = make_pre_commit(sink_id, EPOCH + 1)
    store.insert_pending(aborted, run_id=None, try_number=None)
    store.mark_aborted(sink_id, EPOCH + 1, write_id=aborted.write_id, reason="test")  # queues its clean-up
    done = make_pre_commit(sink_id, EPOCH + 2)
    task = store.enqueue_cleanup(done, reason="test")
    store.complete_cleanup(task.id)
    stranger = str(uuid.uuid4())

    asked = [pending.write_id, aborted.write_id, done.write_id, stranger]
    assert store.registry.known_writes(sink_id, asked) == {pending.write_id, aborted.write_id}
    assert store.registry.known_writes(_sink(), asked) == set(), "write ids are per sink"
    (cleanup,) = store.cleanups(sink_id, EPOCH + 1)
    store.complete_cleanup(cleanup.id)
    assert store.registry.known_writes(sink_id, asked) == {pending.write_id}


def test_an_orphan_is_queued_with_its_files_age_and_blocks_a_late_persist(store: SqlSinkStateStore) -> None:
    sink_id = _sink()
    orphan = _orphan(sink_id)
    written = datetime.now(UTC) - timedelta(hours=7)
    task = store.registry.enqueue_orphan_cleanup(orphan, reason="orphan", written_since=written)
    assert task.epoch == ORPHAN_EPOCH
    assert abs(task.created_at - written) < timedelta(seconds=1), "created_at bounds the committer's look-back"
    assert store.registry.known_writes(sink_id, [orphan.write_id]) == {orphan.write_id}
    # The write's real epoch was never known: a late persist of it is refused for any epoch.
    assert store.write_discarded(sink_id, EPOCH, orphan.write_id)
    assert not store.write_discarded(sink_id, EPOCH, str(uuid.uuid4()))

    later = store.registry.enqueue_orphan_cleanup(
        _orphan(sink_id), reason="orphan", written_since=datetime.now(UTC) + timedelta(hours=1)
    )
    assert later.created_at <= store.now(), "never later than the database clock"


def test_a_live_write_is_refused_as_an_orphan(store: SqlSinkStateStore) -> None:
    sink_id = _sink()
    live = make_pre_commit(sink_id, EPOCH)
    store.insert_pending(live, run_id=None, try_number=None)
    with pytest.raises(StateConflict, match="not an orphan"):
        store.registry.enqueue_orphan_cleanup(
            _orphan(sink_id, live.write_id), reason="x", written_since=datetime.now(UTC)
        )
    with pytest.raises(InvalidPreCommit, match="epoch"):
        store.registry.enqueue_orphan_cleanup(
            make_pre_commit(sink_id, EPOCH), reason="x", written_since=datetime.now(UTC)
        )
    assert store.cleanups(sink_id) == []


# -- per-sink lock -------------------------------------------------------------------------------


def test_the_lock_refuses_a_concurrent_holder_until_released_or_expired(store: SqlSinkStateStore) -> None:
    sink_id = _sink()
    ok, holder, until = store.registry.acquire_sink_lock(sink_id, "run-1", ttl=timedelta(minutes=5))
    assert ok and holder == "run-1" and until > store.now()
    ok, holder, until_seen = store.registry.acquire_sink_lock(sink_id, "run-2", ttl=timedelta(minutes=5))
    assert (ok, holder) == (False, "run-1") and until_seen == until
    assert store.registry.acquire_sink_lock(sink_id, "run-1", ttl=timedelta(minutes=5))[0], "the holder may extend it"
    assert store.registry.acquire_sink_lock(_sink(), "run-2", ttl=timedelta(minutes=5))[0], "locks are per sink"

    assert not store.registry.release_sink_lock(sink_id, "run-2"), "only the holder releases"
    assert store.registry.release_sink_lock(sink_id, "run-1")
    assert store.registry.acquire_sink_lock(sink_id, "run-2", ttl=timedelta(milliseconds=50))[0]
    assert not store.registry.acquire_sink_lock(sink_id, "run-3", ttl=timedelta(minutes=5))[0]
    threading.Event().wait(0.2)
    assert store.registry.acquire_sink_lock(sink_id, "run-3", ttl=timedelta(minutes=5))[0], (
        "an expired lock is taken over"
    )
    assert not store.registry.release_sink_lock(sink_id, "run-2"), "the expired holder no longer has it"


def test_one_of_many_concurrent_takers_gets_the_lock(store: SqlSinkStateStore) -> None:
    sink_id = _sink()
    barrier = threading.Barrier(6)
    results: dict[str, bool] = {}

    def take(name: str) -> None:
        barrier.wait()
        results[name] = store.registry.acquire_sink_lock(sink_id, name, ttl=timedelta(minutes=5))[0]

    threads = [threading.Thread(target=take, args=(f"t{n}",)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results.values()) == [False] * 5 + [True]


def test_the_new_tables_come_from_migration_0002() -> None:
    assert "0002" in known_revisions()
