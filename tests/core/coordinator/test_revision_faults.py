"""Revisions that must commit although something about the table or the sink's history looks odd:
the replaced write's files moved into another manifest by a manifest merge, and deletes of keys the
table never held made by the revised epoch itself or by an earlier one (only a *later* epoch's such
delete makes an upsert revision ill defined).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from airflow_provider_exactly_once.core.epochs import CheckpointStatus
from airflow_provider_exactly_once.core.outcomes import CommitOutcome, PersistOutcome
from tests.core.coordinator.test_reprocessing import G1, G2, commit, generation, replacing
from tests.core.coordinator.test_upsert_revisions import AFTER, G0, SINK, Epochs, P
from tests.core.coordinator.test_upsert_revisions import G1 as REVISED
from tests.support.faults import FaultSwitch
from tests.support.independent_reader import read_rows
from tests.support.pipeline import ARROW_SCHEMA, Pipeline, expected_rows
from tests.support.upsert_writer import keyed_pipeline


def test_a_revision_finds_the_replaced_files_after_a_manifest_merge_moved_them(
    pipeline: Pipeline, sink_id: str
) -> None:
    """Another writer's pyiceberg append, with manifest merging on, rewrites every manifest into one
    added by its own snapshot: the replaced write's files are no longer in the manifest its snapshot
    added, but they are in the table, so the revision replaces them."""
    table = pipeline.create_table("orders")
    with table.transaction() as tx:
        tx.set_properties({"commit.manifest-merge.enabled": "true", "commit.manifest.min-count-to-merge": "2"})
    coordinator = replacing(pipeline, sink_id)
    first = generation(pipeline.write_iceberg(sink_id, 1, ["orders"], rows=4, files=2), G1)
    commit(pipeline, coordinator, first)
    table = pipeline.catalog.load_table(f"{pipeline.namespace}.orders")
    others = pa.table({"id": [900, 901], "epoch": [None, None], "write_id": [None, None]}, schema=ARROW_SCHEMA)
    table.append(others)
    table = table.refresh()
    head = table.current_snapshot()
    assert head is not None
    (merged,) = head.manifests(table.io)
    assert merged.added_snapshot_id == head.snapshot_id  # the first write's manifest is gone from the head

    second = generation(pipeline.write_iceberg(sink_id, 1, ["orders"], rows=3), G2)
    assert coordinator.persist(second).outcome is PersistOutcome.REVISED
    result = coordinator.commit(sink_id, 1)

    assert result.outcome is CommitOutcome.COMMITTED and result.record.revision == 1
    shown = read_rows(pipeline.catalog.load_table(f"{pipeline.namespace}.orders"), "id, epoch, write_id")
    by_id = sorted(shown, key=lambda row: row[0])
    assert by_id == [(900, None, None), (901, None, None), *expected_rows([second], f"{pipeline.namespace}.orders")]


@pytest.fixture
def epochs(tmp_path: Path, faults: FaultSwitch) -> Iterator[Epochs]:
    pipeline = keyed_pipeline(tmp_path, faults)
    yield Epochs(pipeline)
    pipeline.dispose()


def test_deletes_of_absent_keys_by_the_revised_epoch_or_an_earlier_one_do_not_refuse_its_revision(
    epochs: Epochs,
) -> None:
    """Epoch 0 deletes key 40 and the revised epoch 1 deletes key 21, neither ever in the table; the
    revision of epoch 1 replaces epoch 1's changes whole, so neither delete can collide with it."""
    earlier = epochs.write(0, {**P, 40: None}, G0)
    epochs.commit(earlier)
    first = epochs.write(1, {1: "e", 2: None, 20: "e", 21: None}, G0)
    epochs.commit(first)
    epochs.commit(epochs.write(2, {30: "f"}, G0))
    for write in (earlier, first):
        changes = write.tables[0].changes
        assert changes is not None and changes.deletes_of_absent_keys == 1
    revision = epochs.write(1, {3: "r", 21: "r"}, REVISED, revise=True)

    assert epochs.coordinator.persist(revision).outcome is PersistOutcome.REVISED
    epochs.pipeline.checkpoint(SINK, 1, CheckpointStatus.COMPLETED)
    assert epochs.coordinator.commit(SINK, 1).outcome is CommitOutcome.COMMITTED
    assert epochs.shown() == AFTER
