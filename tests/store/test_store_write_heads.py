"""A write read back by its head (migration 0011): another process reads the files' number, rows,
bytes and paths without parsing the descriptors, and the descriptors, when first read, from wherever
the write's metadata is by then; a damaged head, and rows written before 0011."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from airflow_provider_exactly_once.core.errors import InvalidPreCommit
from airflow_provider_exactly_once.core.ports import EpochRecord
from airflow_provider_exactly_once.core.precommit import PreCommit
from airflow_provider_exactly_once.store import SqlSinkStateStore
from tests.store.store_helpers import another_process
from tests.support.builders import make_pre_commit

EPOCH = 1_700_000_000_000
G1 = "2024-06-01T01:00:00.000000Z/0000000000"
G2 = "2024-06-02T09:30:00.000000Z/0000000001"


def _write(sink_id: str, generation: str | None = None, files: int = 40) -> PreCommit:
    return make_pre_commit(sink_id, EPOCH, files=files).model_copy(update={"generation": generation})


@pytest.fixture
def pre(fresh_store: SqlSinkStateStore, sink_id: str) -> PreCommit:
    """A Pending write of 40 files, stored by the test's store."""
    written = _write(sink_id)
    fresh_store.insert_pending(written, run_id="r", try_number=1)
    return written


def _read(url: str, sink_id: str) -> Iterator[EpochRecord]:
    with another_process(url) as reading:
        row = reading.get(sink_id, EPOCH)
        assert row is not None
        yield row


def test_another_process_reads_the_head_and_the_descriptors_only_when_one_is_read(
    fresh_url: str, sink_id: str, pre: PreCommit
) -> None:
    with another_process(fresh_url) as reading:
        row = reading.get(sink_id, EPOCH)
        assert row is not None
        files, written = row.pre_commit.tables[0].data_files, pre.tables[0].data_files
        assert not files.read
        assert len(files) == 40 and list(files.paths()) == [f.path for f in written]
        assert files.record_count() == written.record_count()
        assert files.size_in_bytes() == sum(f.file_size_in_bytes for f in written)
        assert not files.read  # none of the above parsed a descriptor
        assert files[3] == written[3] and files.read
        assert row.pre_commit == pre and row.pre_commit.to_json() == pre.to_json()
        again = reading.get(sink_id, EPOCH)  # the store's parsed write: the same files, read once
        assert again is not None and again.pre_commit.tables[0].data_files is files


def test_the_descriptors_are_read_from_where_the_metadata_moved_since(
    fresh_url: str, fresh_store: SqlSinkStateStore, sink_id: str
) -> None:
    """A commit task read the epoch by its head; a revision then opened (the metadata moved to
    ``replaced_metadata``) and committed (on to the clean-up queue): the files are still read."""
    store = fresh_store
    first, second = _write(sink_id, G1), _write(sink_id, G2, files=2)
    store.insert_pending(first, run_id="r", try_number=1)
    store.mark_committed(sink_id, EPOCH, write_id=first.write_id, committed={"db.events": "101"})
    with another_process(fresh_url) as reading, another_process(fresh_url) as later:
        row = reading.get(sink_id, EPOCH)
        assert row is not None and not row.pre_commit.tables[0].data_files.read
        store.revisions.open_revision(second, expected_write_id=first.write_id, run_id="r", try_number=2)
        revision = later.get(sink_id, EPOCH)
        assert revision is not None and revision.replaces is not None
        assert not revision.replaces.pre_commit.tables[0].data_files.read
        store.decide_commit(sink_id, EPOCH, write_id=second.write_id)
        store.mark_committed(sink_id, EPOCH, write_id=second.write_id, committed={"db.events": "102"})
        assert row.pre_commit == first  # read from the clean-up queue
        assert revision.replaces.pre_commit == first


def test_a_write_whose_metadata_is_gone_says_the_attempt_is_stale(
    fresh_url: str, engine: sa.Engine, sink_id: str, pre: PreCommit
) -> None:
    for row in _read(fresh_url, sink_id):
        with engine.begin() as connection:
            connection.execute(sa.text("DELETE FROM epoch_metadata"))
        with pytest.raises(InvalidPreCommit, match=f"no longer holds the metadata of write {pre.write_id}"):
            list(row.pre_commit.tables[0].data_files)


@pytest.mark.parametrize("head", [b"not zlib", b"x\x01" + b"\x00" * 8], ids=["garbage", "cut-short"])
def test_a_damaged_head_names_the_row_and_what_to_do(
    fresh_url: str, engine: sa.Engine, sink_id: str, pre: PreCommit, head: bytes
) -> None:
    with engine.begin() as connection:
        connection.execute(sa.text("UPDATE epoch_metadata SET head_zlib = :h"), {"h": head})
    with pytest.raises(InvalidPreCommit) as raised:
        list(_read(fresh_url, sink_id))
    message = str(raised.value)
    assert message.startswith(f"sink {sink_id!r} epoch {EPOCH} write {pre.write_id}: the meta store's head")
    assert "set the column to NULL for the row" in message
    with engine.begin() as connection:  # what the message says to do
        connection.execute(sa.text("UPDATE epoch_metadata SET head_zlib = NULL"))
    for row in _read(fresh_url, sink_id):
        assert row.pre_commit.tables[0].data_files.read and row.pre_commit == pre
