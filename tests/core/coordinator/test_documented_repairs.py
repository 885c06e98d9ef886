"""The repair docs/operations.md prints for the one stuck epoch no command can settle: an epoch a
snapshot since expired already committed. The SQL is read from the document itself, so the page and
this test cannot drift apart; it runs on SQLite and PostgreSQL."""

from __future__ import annotations

import re
from pathlib import Path

from airflow_provider_exactly_once.core.epochs import CheckpointStatus, EpochStatus
from airflow_provider_exactly_once.core.outcomes import PersistOutcome
from airflow_provider_exactly_once.core.ports import CommitPlan
from airflow_provider_exactly_once.operations import SinkOperations
from tests.support.pipeline import Pipeline, as_tuples, expected_rows

OPERATIONS_MD = Path(__file__).resolve().parents[3] / "docs" / "operations.md"


def _documented_sql() -> str:
    blocks = re.findall(r"```sql\n(.*?)```", OPERATIONS_MD.read_text(), flags=re.DOTALL)
    [statement] = [b for b in blocks if "SET status = 'Committed'" in b]
    return statement


def test_the_documented_repair_records_an_epoch_an_expired_snapshot_committed(pipeline: Pipeline, sink_id: str) -> None:
    pipeline.create_table("t")
    committer = pipeline.iceberg_committer()
    coordinator = pipeline.coordinator(sink_id, committer)
    pre = pipeline.write_iceberg(sink_id, 5, ["t"])
    coordinator.persist(pre)
    pipeline.checkpoint(sink_id, 5, CheckpointStatus.COMPLETED)
    pipeline.store.decide_commit(sink_id, 5, write_id=pre.write_id)
    committed = committer.commit(CommitPlan(pre), pipeline.store.now())  # the crash came after this, before the record
    table = f"{pipeline.namespace}.t"

    statement = (
        _documented_sql()
        .replace('{"NAMESPACE.TABLE": "SNAPSHOT_ID"}', '{"' + table + '": "' + committed[table] + '"}')
        .replace("'SINK'", f"'{sink_id}'")
        .replace("EPOCH", "5")
        .replace("'WRITE_ID'", f"'{pre.write_id}'")
    )
    with pipeline.store.engine.begin() as conn:
        assert conn.exec_driver_sql(statement).rowcount == 1

    row = pipeline.store.get(sink_id, 5)
    assert row is not None and row.status is EpochStatus.COMMITTED and row.committed == {table: committed[table]}
    assert SinkOperations(pipeline.store).epoch(sink_id, 5).tables[0].snapshot == committed[table]
    rerun = pipeline.write_iceberg(sink_id, 5, ["t"])
    assert coordinator.persist(rerun).outcome is PersistOutcome.ALREADY_COMMITTED
    assert coordinator.recover(sink_id).ok
    assert as_tuples(pipeline.rows("t")) == expected_rows([pre], table)
