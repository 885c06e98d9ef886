"""Each write's metadata stored deflated (migration 0007): what the rows hold, the migration up and
down with rows of both forms, and what a damaged or foreign row says when it is read."""

from __future__ import annotations

import zlib
from typing import Any

import pytest
import sqlalchemy as sa
from alembic import command

from airflow_provider_exactly_once.core.epochs import EpochStatus
from airflow_provider_exactly_once.core.errors import InvalidPreCommit
from airflow_provider_exactly_once.store import SqlSinkStateStore
from airflow_provider_exactly_once.store.database import alembic_config, forget_applied
from tests.store.store_helpers import another_process
from tests.support.builders import make_pre_commit

EPOCH = 1_700_000_000_000


def _stored(engine: sa.Engine, sink_id: str, epoch: int) -> Any:
    with engine.connect() as connection:
        return connection.execute(
            sa.text(
                "SELECT write_id, metadata_bytes, metadata, metadata_zlib FROM epoch_metadata "
                "WHERE sink_id = :s AND epoch = :e"
            ),
            {"s": sink_id, "e": epoch},
        ).one()


def _set_deflated(engine: sa.Engine, sink_id: str, epoch: int, packed: bytes) -> None:
    with engine.begin() as connection:
        connection.execute(
            sa.text("UPDATE epoch_metadata SET metadata_zlib = :z WHERE sink_id = :s AND epoch = :e"),
            {"z": packed, "s": sink_id, "e": epoch},
        )


def test_a_write_is_stored_deflated_with_the_size_of_its_json_and_read_back_whole(
    fresh_url: str, engine: sa.Engine, sink_id: str
) -> None:
    store = SqlSinkStateStore(fresh_url)
    try:
        pre = make_pre_commit(sink_id, EPOCH, files=200)
        store.insert_pending(pre, run_id="r", try_number=1)
        write_id, size, text, packed = _stored(engine, sink_id, EPOCH)
        assert (write_id, text) == (pre.write_id, None)
        json_text = zlib.decompress(bytes(packed)).decode()
        assert json_text == pre.to_json() and size == len(json_text.encode())
        assert len(packed) * 10 < size  # 200 descriptors alike but for their names

        with another_process(fresh_url) as committing:  # as in a commit task's own process
            row = committing.get(sink_id, EPOCH)
            assert row is not None and row.pre_commit == pre and row.pre_commit is not pre
            assert committing.epochs_with_status(sink_id, EpochStatus.PENDING)[0].pre_commit == pre

        second = make_pre_commit(sink_id, EPOCH, files=3)
        store.replace_write(
            second, expected_status=EpochStatus.PENDING, expected_write_id=pre.write_id, run_id="r", try_number=2
        )
        write_id, size, text, packed = _stored(engine, sink_id, EPOCH)
        assert (write_id, text, size) == (second.write_id, None, len(second.to_json().encode()))
        [queued] = store.cleanups(sink_id)
        assert queued.pre_commit == pre  # the clean-up keeps the replaced write's JSON text
    finally:
        store.dispose()


def test_the_migration_keeps_text_rows_readable_and_its_downgrade_inflates_the_deflated(
    fresh_url: str, engine: sa.Engine, sink_id: str
) -> None:
    older = make_pre_commit(sink_id, EPOCH, files=3)
    with engine.begin() as connection:
        command.upgrade(alembic_config(connection), "0006")
    forget_applied()
    with engine.begin() as connection:
        connection.execute(
            sa.text(
                "INSERT INTO pending_sink_state (sink_id, epoch, status, write_id, created_at, updated_at) "
                "VALUES (:s, :e, 'Committed', :w, '2025-01-01 00:00:00', '2025-01-01 00:00:00')"
            ),
            {"s": sink_id, "e": EPOCH, "w": older.write_id},
        )
        connection.execute(
            sa.text(
                "INSERT INTO epoch_metadata (sink_id, epoch, write_id, metadata_bytes, metadata) "
                "VALUES (:s, :e, :w, :n, :m)"
            ),
            {"s": sink_id, "e": EPOCH, "w": older.write_id, "n": len(older.to_json()), "m": older.to_json()},
        )

    store = SqlSinkStateStore(fresh_url)  # upgrades to the head on first use
    newer = make_pre_commit(sink_id, EPOCH + 1, files=4)
    try:
        assert _stored(engine, sink_id, EPOCH)[2:] == (older.to_json(), None)  # not rewritten
        store.insert_pending(newer, run_id="r", try_number=1)
        assert _stored(engine, sink_id, EPOCH + 1)[2] is None
        with another_process(fresh_url) as reading:
            for pre in (older, newer):
                row = reading.get(sink_id, pre.epoch)
                assert row is not None and row.pre_commit == pre
    finally:
        store.dispose()

    with engine.begin() as connection:
        command.downgrade(alembic_config(connection), "0006")
    forget_applied()
    assert "metadata_zlib" not in {c["name"] for c in sa.inspect(engine).get_columns("epoch_metadata")}
    with engine.connect() as connection:
        back = connection.execute(sa.text("SELECT epoch, metadata FROM epoch_metadata ORDER BY epoch")).all()
    assert back == [(EPOCH, older.to_json()), (EPOCH + 1, newer.to_json())]
    with pytest.raises(sa.exc.IntegrityError), engine.begin() as connection:
        connection.execute(  # NOT NULL again, as 0006 made it
            sa.text("INSERT INTO epoch_metadata (sink_id, epoch, write_id, metadata_bytes) VALUES ('s', 1, 'w', 0)")
        )


@pytest.mark.parametrize(
    ("damage", "said"),
    [
        (lambda packed, other: packed[:-9], "cut short"),
        (lambda packed, other: packed[:20] + bytes(b ^ 0x55 for b in packed[20:40]) + packed[40:], "does not inflate"),
        (lambda packed, other: b"not zlib at all", "does not inflate"),
        (lambda packed, other: zlib.compress(b'{"version": 1, "sink_id": 5}'), "invalid pre-commit metadata"),
        (lambda packed, other: other, "it describes sink"),
    ],
    ids=["truncated", "flipped", "garbage", "not-a-pre-commit", "another-write"],
)
def test_a_damaged_or_foreign_row_names_the_epoch_and_what_to_do(
    fresh_url: str, engine: sa.Engine, sink_id: str, damage: Any, said: str
) -> None:
    store = SqlSinkStateStore(fresh_url)
    try:
        pre = make_pre_commit(sink_id, EPOCH, files=50)
        store.insert_pending(pre, run_id="r", try_number=1)
        packed = bytes(_stored(engine, sink_id, EPOCH)[3])
        other = zlib.compress(make_pre_commit(sink_id, EPOCH + 1).to_json().encode())
        _set_deflated(engine, sink_id, EPOCH, damage(packed, other))
        with another_process(fresh_url) as reading, pytest.raises(InvalidPreCommit) as raised:
            row = reading.get(sink_id, EPOCH)  # read by its head: the metadata is read with a descriptor
            assert row is not None
            list(row.pre_commit.tables[0].data_files)
        message = str(raised.value)
        assert message.startswith(f"sink {sink_id!r} epoch {EPOCH}: the meta store's metadata of write {pre.write_id}")
        assert said in message and "restore that row from a backup" in message
    finally:
        store.dispose()
