"""Meta-store checkpoints, against the real ``SqlSinkStateStore`` (SQLite, and PostgreSQL when up)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from airflow_provider_exactly_once.checkpoints import CheckpointTable, MetaStoreCheckpointSource
from airflow_provider_exactly_once.core.epochs import CheckpointStatus
from airflow_provider_exactly_once.core.errors import InvalidSinkConfig, StateConflict
from airflow_provider_exactly_once.core.ports import CheckpointSource
from airflow_provider_exactly_once.store.sql import SqlSinkStateStore

EPOCH = 1_700_000_000_000


@pytest.fixture
def store(meta_url: str) -> Iterator[SqlSinkStateStore]:
    store = SqlSinkStateStore(meta_url)
    yield store
    store.dispose()


def both(source: MetaStoreCheckpointSource, sink_id: str, epoch: int) -> CheckpointStatus:
    sync = source.status(sink_id, epoch)
    assert asyncio.run(source.astatus(sink_id, epoch)) is sync
    return sync


def test_the_sql_store_is_a_checkpoint_table(store: SqlSinkStateStore) -> None:
    assert isinstance(store.checkpoints, CheckpointTable)
    assert isinstance(MetaStoreCheckpointSource(store.checkpoints), CheckpointSource)


def test_status_follows_what_the_upstream_recorded(store: SqlSinkStateStore, sink_id: str) -> None:
    source = MetaStoreCheckpointSource(store.checkpoints)
    assert both(source, sink_id, EPOCH) is CheckpointStatus.PENDING  # never recorded
    store.checkpoints.set_checkpoint(sink_id, EPOCH, CheckpointStatus.PENDING)
    assert both(source, sink_id, EPOCH) is CheckpointStatus.PENDING
    source.mark(sink_id, EPOCH, CheckpointStatus.COMPLETED, "upstream run 42")
    assert both(source, sink_id, EPOCH) is CheckpointStatus.COMPLETED
    assert both(source, sink_id, EPOCH + 1) is CheckpointStatus.PENDING
    source.mark(sink_id, EPOCH + 1, CheckpointStatus.FAILED)
    assert both(source, sink_id, EPOCH + 1) is CheckpointStatus.FAILED


def test_final_statuses_stay_final(store: SqlSinkStateStore, sink_id: str) -> None:
    source = MetaStoreCheckpointSource(store.checkpoints)
    source.mark(sink_id, EPOCH, CheckpointStatus.FAILED)
    with pytest.raises(StateConflict, match="final"):
        source.mark(sink_id, EPOCH, CheckpointStatus.COMPLETED)
    assert both(source, sink_id, EPOCH) is CheckpointStatus.FAILED


def test_name_template(store: SqlSinkStateStore, sink_id: str) -> None:
    per_sink = MetaStoreCheckpointSource(store.checkpoints, name_template="ingest-{sink_id}")
    assert per_sink.name(sink_id) == f"ingest-{sink_id}"
    store.checkpoints.set_checkpoint(f"ingest-{sink_id}", EPOCH, CheckpointStatus.COMPLETED)
    assert both(per_sink, sink_id, EPOCH) is CheckpointStatus.COMPLETED
    assert both(MetaStoreCheckpointSource(store.checkpoints), sink_id, EPOCH) is CheckpointStatus.PENDING

    shared = MetaStoreCheckpointSource(store.checkpoints, name_template=f"upstream-{sink_id}")
    store.checkpoints.set_checkpoint(f"upstream-{sink_id}", EPOCH, CheckpointStatus.COMPLETED)
    assert both(shared, "orders", EPOCH) is CheckpointStatus.COMPLETED
    assert both(shared, "customers", EPOCH) is CheckpointStatus.COMPLETED


@pytest.mark.parametrize(
    ("template", "match"),
    [
        ("{sink_id}-{epoch}", r"unknown field \{epoch\}"),
        ("{sink}", r"unknown field \{sink\}"),
        ("", "non-empty"),
    ],
)
def test_name_template_validation(template: str, match: str) -> None:
    with pytest.raises(InvalidSinkConfig, match=match):
        MetaStoreCheckpointSource(_DictTable(), name_template=template)


def test_a_table_without_the_methods_is_refused() -> None:
    with pytest.raises(InvalidSinkConfig, match="get_checkpoint"):
        MetaStoreCheckpointSource(object())  # type: ignore[arg-type]


def test_a_table_answering_nonsense_is_an_error() -> None:
    class Sloppy(_DictTable):
        def get_checkpoint(self, name: str, epoch: int) -> CheckpointStatus:
            return "COMPLETED"  # type: ignore[return-value]

    with pytest.raises(TypeError, match="not a CheckpointStatus"):
        MetaStoreCheckpointSource(Sloppy()).status("s", EPOCH)


class _DictTable:
    """A user-supplied table: anything with the two methods qualifies."""

    def __init__(self) -> None:
        self.rows: dict[tuple[str, int], CheckpointStatus] = {}

    def get_checkpoint(self, name: str, epoch: int) -> CheckpointStatus:
        return self.rows.get((name, epoch), CheckpointStatus.PENDING)

    def set_checkpoint(self, name: str, epoch: int, status: CheckpointStatus, detail: str | None = None) -> None:
        self.rows[(name, epoch)] = status


def test_a_user_supplied_table() -> None:
    table = _DictTable()
    source = MetaStoreCheckpointSource(table)
    source.mark("s", EPOCH, CheckpointStatus.COMPLETED)
    assert table.rows == {("s", EPOCH): CheckpointStatus.COMPLETED}
    assert both(source, "s", EPOCH) is CheckpointStatus.COMPLETED
