"""Upsert settings and the rules about upsert epochs, without Spark or a catalog."""

from __future__ import annotations

import datetime as dt

import pytest

from airflow_provider_exactly_once.core.decisions import Action, persist_decision, upsert_order_refusal
from airflow_provider_exactly_once.core.errors import EarlierEpochUndecided, InvalidSinkConfig, ReprocessRefused
from airflow_provider_exactly_once.core.generations import generation_of
from airflow_provider_exactly_once.core.precommit import PreCommit
from airflow_provider_exactly_once.core.status import EpochStatus
from airflow_provider_exactly_once.core.upserts import ChangeCounts, UpsertSpec
from airflow_provider_exactly_once.sinks.config import IcebergSinkConfig, sink_config_from_dict
from tests.core.test_decisions import EPOCH, row, write


def upsert_write(*, generation: str | None = None, upsert: bool = True) -> PreCommit:
    base = write("ns.t")
    (table,) = base.tables
    changes = {
        "changes": ChangeCounts(inserted=1),
        "key_lower_bounds": {"id": "AQ=="},
        "key_upper_bounds": {"id": "AQ=="},
    }
    return base.model_copy(
        update={"generation": generation, "tables": [table.model_copy(update=changes if upsert else {})]}
    )


def test_the_spec_refuses_what_cannot_mean_one_thing() -> None:
    with pytest.raises(ValueError, match="key names a column twice"):
        UpsertSpec(key=("id", "id"))
    with pytest.raises(ValueError, match="'x' is in both insert_values and delete_values"):
        UpsertSpec(key=("id",), insert_values=("x",), delete_values=("x",))
    with pytest.raises(ValueError, match="cannot be both a key column and op_column"):
        UpsertSpec(key=("id",), op_column="id")
    spec = UpsertSpec(key=("id",), op_column="op")
    assert (spec.operation("D"), spec.operation("U"), spec.operation("I"), spec.operation("?")) == (
        "delete",
        "upsert",
        "upsert",
        None,
    )


def test_change_counts_add_up_and_read_as_a_sentence() -> None:
    total = ChangeCounts(inserted=1, updated=2) + ChangeCounts(deleted=3, deletes_of_absent_keys=1)
    assert total.describe() == "1 inserted, 2 updated, 3 deleted (1 deletes of absent keys)"


def test_an_upsert_sink_is_validated_once_and_survives_its_dict_form() -> None:
    sink = IcebergSinkConfig(
        "cdc",
        tables=("ns.t",),
        mode="upsert",
        key=("id",),
        op_column="op",
        order_by="lsn",
        op_values={"delete": ("X",)},
    )
    assert sink.upsert == UpsertSpec(key=("id",), op_column="op", order_by="lsn", delete_values=("X",))
    again = sink_config_from_dict(sink.to_dict())
    assert again == sink and isinstance(again, IcebergSinkConfig) and again.upsert == sink.upsert
    assert "mode" not in IcebergSinkConfig("plain", tables=("ns.t",)).to_dict()  # an append sink's form is unchanged


@pytest.mark.parametrize(
    ("settings", "refusal"),
    [
        ({"mode": "upsert"}, r"sink 'cdc': mode='upsert' needs key=\(column, ...\)"),
        (
            {"key": ("id",)},
            r"sink 'cdc': key, op_column, op_values and order_by are for mode='upsert' \(given: \['key'\]\)",
        ),
        ({"mode": "merge", "key": ("id",)}, "mode must be 'append' or 'upsert', got 'merge'"),
        (
            {"mode": "upsert", "key": ("id",), "op_values": {"remove": ("r",)}},
            r"op_values keys are insert, update and delete, not \['remove'\]",
        ),
    ],
)
def test_a_bad_upsert_sink_is_refused_naming_it(settings: dict[str, object], refusal: str) -> None:
    with pytest.raises(InvalidSinkConfig, match=refusal):
        IcebergSinkConfig("cdc", tables=("ns.t",), **settings)  # type: ignore[arg-type]


def test_upsert_epochs_commit_in_epoch_order_and_appends_do_not_wait() -> None:
    pending = row(EpochStatus.PENDING, upsert_write())
    refusal = upsert_order_refusal(pending, [EPOCH - 2, EPOCH, EPOCH + 1])
    assert isinstance(refusal, EarlierEpochUndecided) and refusal.retryable
    assert f"1 earlier epoch(s) of the sink are still undecided (Pending): {EPOCH - 2}" in str(refusal)
    assert upsert_order_refusal(pending, [EPOCH, EPOCH + 1]) is None
    assert upsert_order_refusal(row(EpochStatus.PENDING, upsert_write(upsert=False)), [EPOCH - 2]) is None


def test_a_newer_generation_of_a_committed_upsert_epoch_is_discarded_and_refused() -> None:
    first = generation_of(dt.datetime(2024, 1, 1, tzinfo=dt.UTC), 0)
    committed = row(EpochStatus.COMMITTED, upsert_write(generation=first))
    again = upsert_write(generation=generation_of(dt.datetime(2024, 1, 1, tzinfo=dt.UTC), 1))
    decision = persist_decision(committed, again, lambda: {}, on_reprocess="replace")
    assert decision.action is Action.DISCARD_REFUSED and isinstance(decision.error, ReprocessRefused)
    assert "committed as changes by key" in str(decision.error)
