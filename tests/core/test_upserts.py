"""Upsert settings and the rules about upsert epochs, without Spark or a catalog."""

from __future__ import annotations

import dataclasses
import datetime as dt
import warnings

import pytest

from airflow_provider_exactly_once.core.decisions import (
    Action,
    commit_decision,
    persist_decision,
    recovery_decision,
    revision_basis,
    upsert_order_refusal,
)
from airflow_provider_exactly_once.core.epochs import EpochStatus, generation_of
from airflow_provider_exactly_once.core.errors import EarlierEpochUndecided, InvalidSinkConfig, ReprocessRefused
from airflow_provider_exactly_once.core.ports import EpochRecord, ReplacedWrite
from airflow_provider_exactly_once.core.precommit import PreCommit, TableWrite
from airflow_provider_exactly_once.core.upserts import ChangeCounts, RewrittenFile, UpsertSpec
from airflow_provider_exactly_once.sinks.config import IcebergSinkConfig, sink_config_from_dict
from tests.core.test_decisions import AT, DONE, EPOCH, WAITING, asks, lookups, row, write


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


SPEC = UpsertSpec(key=("id",), op_column="op", order_by="lsn", delete_values=("X",))
#: The earlier, flat spelling of ``SPEC``: the registered form of a sink from before ``upsert``.
FLAT = {"mode": "upsert", "key": ("id",), "op_column": "op", "order_by": "lsn", "op_values": {"delete": ("X",)}}


def test_an_upsert_sink_survives_its_registered_form() -> None:
    sink = IcebergSinkConfig("cdc", tables=("ns.t",), upsert=SPEC)
    again = sink_config_from_dict(sink.model_dump(mode="json"))
    assert again == sink and isinstance(again, IcebergSinkConfig) and again.upsert == SPEC
    # An append sink's registered form is unchanged.
    assert "upsert" not in IcebergSinkConfig("plain", tables=("ns.t",)).model_dump(mode="json")


def test_the_removed_flat_spelling_is_refused_naming_the_new_one_and_still_read_when_registered() -> None:
    with pytest.raises(
        InvalidSinkConfig,
        match=r"IcebergSinkConfig\(mode=, key=, op_column=, op_values=, order_by=\) was removed; write upsert=UpsertSpec\(key=\.\.\.",
    ):
        IcebergSinkConfig("cdc", tables=("ns.t",), **FLAT)
    registered = {"kind": "iceberg", "sink_id": "cdc", "tables": ["ns.t"], **FLAT}  # recorded by an earlier release
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # not the DAG author's to fix: no warning
        assert sink_config_from_dict(registered) == IcebergSinkConfig("cdc", tables=("ns.t",), upsert=SPEC)


@pytest.mark.parametrize(
    ("settings", "refusal"),
    [
        ({"mode": "upsert"}, r"sink 'cdc': an upsert sink needs UpsertSpec\(key=\(column, ...\)\)"),
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
def test_a_bad_registered_upsert_sink_is_refused_naming_it(settings: dict[str, object], refusal: str) -> None:
    with pytest.raises(InvalidSinkConfig, match=refusal):
        sink_config_from_dict({"kind": "iceberg", "sink_id": "cdc", "tables": ["ns.t"], **settings})


def test_upsert_epochs_commit_in_epoch_order_and_appends_do_not_wait() -> None:
    pending = row(EpochStatus.PENDING, upsert_write())
    refusal = upsert_order_refusal(pending, lambda: [EPOCH - 2, EPOCH, EPOCH + 1])
    assert isinstance(refusal, EarlierEpochUndecided) and refusal.retryable
    assert f"1 earlier epoch(s) of the sink are still undecided (Pending): {EPOCH - 2}" in str(refusal)
    assert upsert_order_refusal(pending, lambda: [EPOCH, EPOCH + 1]) is None
    assert upsert_order_refusal(row(EpochStatus.PENDING, upsert_write(upsert=False)), pytest.fail) is None


G0 = generation_of(dt.datetime(2024, 1, 1, tzinfo=dt.UTC), 0)
G1 = generation_of(dt.datetime(2024, 1, 1, tzinfo=dt.UTC), 1)


def committed_row(pre: PreCommit, committed: str = "42") -> EpochRecord:
    return dataclasses.replace(row(EpochStatus.COMMITTED, pre), committed={"ns.t": committed})


def revising(committed: EpochRecord, **basis: object) -> PreCommit:
    """A newer generation's upsert write planned as a revision of ``committed`` (as the Spark job records it)."""
    (revised,) = revision_basis(committed, G1, "replace").values()  # type: ignore[union-attr]
    pre = upsert_write(generation=G1)
    (table,) = pre.tables
    revises = revised.revised().model_copy(update=basis)
    rewritten = [RewrittenFile(path=p, record_count=1) for p in revises.rewritten]
    return pre.model_copy(update={"tables": [table.model_copy(update={"revises": revises, "rewritten": rewritten})]})


def test_a_newer_generation_revises_a_committed_upsert_epoch_only_when_planned_against_it() -> None:
    first = upsert_write(generation=G0)
    committed = committed_row(first)
    planned = revising(committed)
    decision = persist_decision(
        committed, planned, asks(identities={}, discarded=False, committed=[]), on_reprocess="replace"
    )
    assert decision.action is Action.REVISE and f"will replace write {first.write_id}" in decision.why

    unplanned = upsert_write(generation=G1)  # written against the table as it is now
    decision = persist_decision(
        committed, unplanned, asks(identities={}, discarded=False, committed=[]), on_reprocess="replace"
    )
    assert decision.action is Action.DISCARD_REFUSED and isinstance(decision.error, ReprocessRefused)
    assert "planned against the table as it is now, not as it was before write" in str(decision.error)
    assert "Reprocessing an upsert epoch" in str(decision.error)

    other = revising(committed, write_id="0b6f5c1e-8d0a-4d35-9a8e-4f0b7f1d2c3e")  # another write, since replaced
    decision = persist_decision(
        committed, other, asks(identities={}, discarded=False, committed=[]), on_reprocess="replace"
    )
    assert decision.action is Action.DISCARD_REFUSED
    assert "planned as a revision of write 0b6f5c1e-8d0a-4d35-9a8e-4f0b7f1d2c3e" in str(decision.error)

    rows = upsert_write(generation=G1, upsert=False)  # the sink's mode changed
    decision = persist_decision(
        committed, rows, asks(identities={}, discarded=False, committed=[]), on_reprocess="replace"
    )
    assert decision.action is Action.DISCARD_REFUSED and "the sink's mode changed" in str(decision.error)

    kept = persist_decision(
        committed, unplanned, asks(identities={}, discarded=False, committed=[]), on_reprocess="keep"
    )
    assert kept.action is Action.DISCARD_KEPT and kept.error is None


def test_a_revision_is_planned_before_the_write_it_revises() -> None:
    first = upsert_write(generation=G0)
    (table,) = first.tables
    first = first.model_copy(
        update={
            "tables": [
                table.model_copy(update={"rewritten": [RewrittenFile(path="/lake/old.parquet", record_count=3)]})
            ]
        }
    )
    committed = committed_row(first, "42")
    (basis,) = revision_basis(committed, G1, "replace").values()  # type: ignore[union-attr]
    assert (basis.write_id, basis.parent_of, basis.snapshot_id) == (first.write_id, 42, None)
    assert basis.rewritten == ["/lake/old.parquet"] and basis.key_lower_bounds == {"id": "AQ=="}
    assert basis.added == [f.path for f in first.tables[0].data_files]
    # the table it went into: a table re-created since gets an ordinary write (persist re-opens the epoch)
    identified = revision_basis(dataclasses.replace(committed, table_uuids={"ns.t": "u-1"}), G1, "replace")
    assert identified is not None and identified["ns.t"].table_uuid == "u-1"

    # a revision's own revision is planned at the same state: the one the first revision read
    second = revising(committed).model_copy(update={"generation": G1})
    (table,) = second.tables
    second = second.model_copy(update={"tables": [table.model_copy(update={"read_snapshot_id": 7})]})
    (again,) = revision_basis(
        committed_row(second, "43"), generation_of(dt.datetime(2024, 1, 2, tzinfo=dt.UTC), 0), "replace"
    ).values()  # type: ignore[union-attr]
    assert (again.write_id, again.parent_of, again.snapshot_id) == (second.write_id, None, 7)

    # a write that committed nothing: planned at the table it read
    (table,) = first.tables
    empty = first.model_copy(update={"tables": [table.model_copy(update={"read_snapshot_id": 5, "rewritten": []})]})
    (at_read,) = revision_basis(committed_row(empty, "empty"), G1, "replace").values()  # type: ignore[union-attr]
    assert (at_read.parent_of, at_read.snapshot_id) == (None, 5)

    # not a revision: keep, a retry of the committed generation, an append epoch
    assert revision_basis(committed, G1, "keep") is None
    assert revision_basis(committed, G0, "replace") is None
    assert revision_basis(committed_row(upsert_write(generation=G0, upsert=False)), G1, "replace") is None
    # a revision in flight is written again (a retry, a rewrite) against the write it replaces
    replaced = ReplacedWrite(first.write_id, first, {"ns.t": "42"}, None, 0, AT)
    pending = dataclasses.replace(row(EpochStatus.PENDING, upsert_write(generation=G1)), replaces=replaced)
    (in_flight,) = revision_basis(pending, G1, "replace").values()  # type: ignore[union-attr]
    assert (in_flight.write_id, in_flight.parent_of) == (first.write_id, 42)
    assert revision_basis(pending, G0, "replace") is None  # a zombie of an older generation


def test_a_revision_rewrites_every_file_the_revised_write_rewrote() -> None:
    committed = committed_row(upsert_write(generation=G0))
    (table,) = revising(committed, rewritten=["/lake/old.parquet"]).tables
    assert [r.path for r in table.rewritten] == ["/lake/old.parquet"]
    with pytest.raises(ValueError, match="rewrites every file the write it revises rewrote"):
        TableWrite.model_validate({**table.model_dump(), "rewritten": []})


# -- the rules the commit, recovery and their dry runs share (issue 31) ------------------------------


@pytest.mark.parametrize("decide", [commit_decision, recovery_decision])
def test_an_upsert_epoch_behind_an_undecided_one_is_refused_by_the_commits_decision(decide: object) -> None:
    pending = row(EpochStatus.PENDING, upsert_write())
    refused = decide(pending, lookups(DONE, pending=[EPOCH - 1, EPOCH]))  # type: ignore[operator]
    assert refused.action is Action.REFUSE and isinstance(refused.error, EarlierEpochUndecided)
    assert decide(pending, lookups(DONE, pending=[EPOCH, EPOCH + 1])).action is Action.DECIDE_AND_COMMIT  # type: ignore[operator]
    decided = dataclasses.replace(pending, commit_decided_at=AT)  # decided under the rule: it goes on
    assert decide(decided, lookups(None)).action is Action.COMMIT_DECIDED  # type: ignore[operator]
    waiting = decide(pending, lookups(WAITING))  # type: ignore[operator]
    assert waiting.action in (Action.WAIT, Action.REFUSE) and not isinstance(waiting.error, EarlierEpochUndecided)


@pytest.mark.parametrize("decide", [commit_decision, recovery_decision])
def test_a_revision_after_a_later_delete_of_an_absent_key_is_refused_by_the_commits_decision(decide: object) -> None:
    committed = committed_row(upsert_write(generation=G0))
    revision = dataclasses.replace(
        row(EpochStatus.PENDING, revising(committed)),
        revision=1,
        replaces=ReplacedWrite(committed.write_id, committed.pre_commit, {"ns.t": "42"}, None, 0, AT),
    )
    later = upsert_write(generation=G0)
    (table,) = later.tables
    later = later.model_copy(
        update={"tables": [table.model_copy(update={"changes": ChangeCounts(deletes_of_absent_keys=2)})]}
    )
    deleted_later = dataclasses.replace(committed_row(later), epoch=EPOCH + 1)
    refused = decide(revision, lookups(DONE, pending=[EPOCH], committed=[deleted_later]))  # type: ignore[operator]
    assert refused.action is Action.REFUSE and isinstance(refused.error, ReprocessRefused)
    assert f"later epoch(s) {EPOCH + 1} deleted keys the table did not hold" in str(refused.error)
    earlier = dataclasses.replace(deleted_later, epoch=EPOCH - 1)
    fine = decide(revision, lookups(DONE, pending=[EPOCH], committed=[earlier]))  # type: ignore[operator]
    assert fine.action is Action.DECIDE_AND_COMMIT
