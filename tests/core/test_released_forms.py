"""What the previous release registered, put in XCom and printed, held as literals: the models of
this one read each and write the same bytes (``json.dumps`` of ``model_dump(mode="json")``, the form
the registry, XCom, ``eo-sink --json`` and the UI's /api carry)."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

import pytest

from airflow_provider_exactly_once.checkpoints.config import checkpoint_config_from_dict
from airflow_provider_exactly_once.core.delivery import FILE_SINK, SINGLE_TABLE, Delivery, EpochDelivery
from airflow_provider_exactly_once.core.outcomes import SinkRecoveryReport
from airflow_provider_exactly_once.core.precommit import PreCommit
from airflow_provider_exactly_once.core.upserts import UpsertSpec
from airflow_provider_exactly_once.observability.run_origin import RunOrigin
from airflow_provider_exactly_once.sinks.config import IcebergSinkConfig, sink_config_from_dict

#: Registered sink configs (``sink_registry.config``), in the key order the release wrote them.
SINKS = [
    '{"kind": "iceberg", "sink_id": "orders", "tables": ["shop.orders", "shop.big_orders", "shop.totals"], '
    '"iceberg_conn_id": "lake", "branch": "audit", "allow_schema_evolution": true, "clock_skew_s": 90.0, '
    '"max_commit_attempts": 5, "select": {"shop.big_orders": {"where": "amount > 100"}, "shop.totals": '
    '{"query": "SELECT user_id, sum(amount) AS total FROM epoch_input GROUP BY user_id"}}, "on_reprocess": '
    '"keep", "upsert": {"key": ["order_id"], "op_column": "op", "insert_values": ["insert", "I", "c", "r"], '
    '"update_values": ["update", "U", "u"], "delete_values": ["delete", "D", "d"], "order_by": "ts"}}',
    '{"kind": "iceberg", "sink_id": "events", "tables": ["db.events"], "iceberg_conn_id": "iceberg_default", '
    '"branch": "main", "allow_schema_evolution": false, "clock_skew_s": 600.0, "max_commit_attempts": 8}',
    '{"kind": "files", "sink_id": "exports", "root": "s3://bucket/exports", "storage_options": {"auto_mkdir": true}}',
    '{"kind": "files", "sink_id": "exports", "root": "s3://bucket/exports", "storage_options": {}, '
    '"storage_conn_id": "aws_lake"}',
]

#: Registered checkpoint configs (``sink_registry.checkpoint``) and the trigger's ``checkpoint`` argument.
CHECKPOINTS = [
    '{"kind": "metastore", "name_template": "{sink_id}"}',
    '{"kind": "metastore", "name_template": "orders-{sink_id}"}',
    '{"kind": "snapshot_range"}',
    '{"kind": "markers", "path_template": "/landing/{sink_id}/{start:%Y/%m/%d/%H}", "success_marker": "_SUCCESS", '
    '"failed_marker": "_FAILED", "storage_options": {}, "storage_conn_id": "aws_lake"}',
    '{"kind": "markers", "path_template": "/landing/{sink_id}/{epoch}", "success_marker": "_DONE", '
    '"failed_marker": "_FAILED", "storage_options": {"anon": false}}',
    '{"kind": "streaming", "checkpoint_location": "/chk/{sink_id}", "storage_options": {}}',
]


def _same_bytes(text: str, read: Callable[[Mapping[str, Any]], Any]) -> None:
    model = read(json.loads(text))
    assert json.dumps(model.model_dump(mode="json")) == text
    # The registry writes it with sorted keys: the same row.
    assert json.dumps(model.model_dump(mode="json"), sort_keys=True) == json.dumps(json.loads(text), sort_keys=True)
    assert read(model.model_dump(mode="json")) == model


@pytest.mark.parametrize("text", SINKS)
def test_a_registered_sink_config_is_read_and_written_byte_for_byte(text: str) -> None:
    _same_bytes(text, sink_config_from_dict)


@pytest.mark.parametrize("text", CHECKPOINTS)
def test_a_registered_checkpoint_config_is_read_and_written_byte_for_byte(text: str) -> None:
    _same_bytes(text, checkpoint_config_from_dict)


def test_a_sink_registered_with_the_flat_upsert_settings_is_read_as_its_spec() -> None:
    row = (
        '{"branch": "main", "clock_skew_s": 600.0, "iceberg_conn_id": "lake", "key": ["id"], "kind": "iceberg", '
        '"max_commit_attempts": 8, "mode": "upsert", "op_column": "op", "order_by": "lsn", "sink_id": "cdc", '
        '"tables": ["ns.t"]}'
    )
    sink = sink_config_from_dict(json.loads(row))
    assert sink == IcebergSinkConfig(
        "cdc", ("ns.t",), iceberg_conn_id="lake", upsert=UpsertSpec(key=("id",), op_column="op", order_by="lsn")
    )


#: A pre-commit as the write task pushes it to XCom (``to_compressed``) and the store keeps it (``to_json``).
PRE_COMMIT_JSON = (
    '{"version":1,"sink_id":"orders","epoch":1700000000000,"write_id":"0b7c5c1e-0000-4000-8000-0000000000'
    '01","tables":[{"table":"db.events","location":"file:///warehouse/db.events/_staging/1700000000000/0b'
    '7c5c1e-0000-4000-8000-000000000001","data_files":[{"path":"file:///warehouse/db.events/_staging/1700'
    '000000000/0b7c5c1e-0000-4000-8000-000000000001/part-00000.parquet","format":"parquet","record_count"'
    ':10,"file_size_in_bytes":1000,"partition":{"day":19000},"column_sizes":{},"value_counts":{"id":10},"'
    'null_value_counts":{},"nan_value_counts":{},"lower_bounds":{"id":"AQAAAAAAAAA="},"upper_bounds":{"id'
    '":"ZAAAAAAAAAA="},"split_offsets":null,"writer":"task-0"}],"schema_written":[],"added_columns":[],"s'
    'pec_id":null,"rewritten":[],"read_snapshot_id":null,"key_lower_bounds":{},"key_upper_bounds":{},"cha'
    'nges":null,"revises":null,"prepared":null}],"source_positions":null,"generation":null}'
)
PRE_COMMIT_XCOM = (
    "eo-precommit+zlib+b64:eJy1UcFqwzAM/RedkzqBjW6BHfIJvW4M4zhaYxrszFYautB/n1SzbmWXXSaDEHrP0uNpheT8QbseGg"
    "ixx5igAJyCHaCpt9V3FLBER5iZVbe197bGUpDyTtKDpB/8mueQ6UZM0LysueSffbfBI3qSNWOwhlzw3H5zIzZKqcVEHMKcUF2JSi"
    "cye+f36kaP+qOG3pDRMj7rmAwN/7dPTSZS7my4fJ+RWEJEy9ZqG2ZP7CpbKet1ch9sp9fdiURcfTFZBrhsysraT9x/ZOBcwNGMM+"
    "YhSUA5RC3AGBaMumOgvwLQ7tqveAImzdP0m/Tc3pIuF44MkEmHsoLzK79PY56iWQ=="
    ""
)


def test_a_pre_commit_of_the_previous_release_is_read_and_written_byte_for_byte() -> None:
    pre = PreCommit.parse(PRE_COMMIT_JSON)
    assert pre.to_json() == PRE_COMMIT_JSON
    assert PreCommit.parse(PRE_COMMIT_XCOM) == pre and pre.to_compressed() == PRE_COMMIT_XCOM
    assert json.dumps(pre.model_dump(mode="json"), separators=(",", ":")) == PRE_COMMIT_JSON


def test_the_delivery_report_and_run_origin_carry_the_keys_and_values_they_did() -> None:
    """``eo-sink show --json``'s ``delivery``, recovery's XCom report and the asset events' ``run``."""
    printed = {
        '{"how": "one table", "tables": 1, "atomic": true, "why": "each epoch is one snapshot of its one table", '
        '"text": "one table: each epoch is one snapshot of its one table"}': SINGLE_TABLE,
        '{"how": "one catalog transaction", "tables": 3, "atomic": true, "why": "the REST catalog commits a '
        'transaction", "text": "atomic across its 3 tables, one catalog transaction (the REST catalog commits a '
        'transaction)"}': EpochDelivery(
            how=Delivery.ONE_TRANSACTION, tables=3, why="the REST catalog commits a transaction"
        ),
        '{"sink_id": "orders", "committed": [3], "aborted": [4], "waiting": [], "failed": {"epoch 5": "boom"}, '
        '"files_deleted": 2, "orphans_removed": ["w1"], "orphans_kept": ["w2"], "stray_removed": [], "ok": false}': (
            SinkRecoveryReport(
                sink_id="orders",
                committed=[3],
                aborted=[4],
                failed={"epoch 5": "boom"},
                files_deleted=2,
                orphans_removed=["w1"],
                orphans_kept=["w2"],
            )
        ),
        '{"committed_by": "commit task", "run_type": "backfill", "clear_number": 2, "triggering_user": "ana", '
        '"try_number": 3}': RunOrigin(
            committed_by="commit task", run_type="backfill", clear_number=2, triggering_user="ana", try_number=3
        ),
        '{"committed_by": "recovery", "run_type": null, "clear_number": 0, "triggering_user": null, '
        '"try_number": null}': RunOrigin(committed_by="recovery"),
    }
    for text, value in printed.items():
        assert json.dumps(value.model_dump(mode="json")) == text
    assert FILE_SINK.model_dump(mode="json")["atomic"] is False
