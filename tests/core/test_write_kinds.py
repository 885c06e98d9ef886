"""A write's kind (``core.ports``): derived from the pre-commit and the epoch's row, and the
one place that answers what depends on the kind alone."""

from __future__ import annotations

import dataclasses

import pytest

from airflow_provider_exactly_once.core.epochs import EpochStatus
from airflow_provider_exactly_once.core.ports import CommitPlan, EpochRecord, Kind, ReplacedWrite, WriteKind
from airflow_provider_exactly_once.core.precommit import PreCommit
from tests.core.test_decisions import AT, EPOCH, SINK, row, write
from tests.core.test_upserts import upsert_write


def _revision(pre: PreCommit, replaced: PreCommit) -> EpochRecord:
    was = ReplacedWrite(replaced.write_id, replaced, {"ns.t": "42"}, None, 0, AT)
    return dataclasses.replace(row(EpochStatus.PENDING, pre), revision=1, replaces=was)


def test_each_kind_is_derived_from_the_write_and_what_the_row_says_it_replaces() -> None:
    append, upsert = write("ns.t"), upsert_write()
    assert row(EpochStatus.PENDING, append).kind == WriteKind(Kind.APPEND)
    assert row(EpochStatus.PENDING, upsert).kind == WriteKind(Kind.UPSERT)
    revision = _revision(write("ns.t"), append)
    assert revision.kind.kind is Kind.REVISION and revision.kind.replaced_write_id == append.write_id
    upsert_revision = _revision(upsert_write(), upsert)
    assert (
        upsert_revision.kind.kind is Kind.UPSERT_REVISION and upsert_revision.kind.replaces == upsert_revision.replaces
    )
    assert WriteKind.of(PreCommit.nothing_written(SINK, EPOCH)).kind is Kind.NOTHING
    # a plan asks the same model, of the same two things
    assert CommitPlan(upsert_revision.pre_commit, upsert_revision.replaces).kind == upsert_revision.kind


@pytest.mark.parametrize(
    ("kind", "by_key", "revises", "batches", "in_epoch_order", "rewritable", "lost_beyond_files"),
    [
        (Kind.NOTHING, False, False, False, False, False, False),
        (Kind.APPEND, False, False, True, False, False, False),
        (Kind.REVISION, False, True, False, False, False, True),
        (Kind.UPSERT, True, False, False, True, True, True),
        (Kind.UPSERT_REVISION, True, True, False, True, False, True),
    ],
)
def test_what_depends_on_the_kind_is_answered_by_it(
    kind: Kind,
    by_key: bool,
    revises: bool,
    batches: bool,
    in_epoch_order: bool,
    rewritable: bool,
    lost_beyond_files: bool,
) -> None:
    value = WriteKind(kind)
    answers = (value.by_key, value.revises, value.batches, value.in_epoch_order, value.rewritable)
    assert answers == (by_key, revises, batches, in_epoch_order, rewritable)
    assert value.lost_beyond_files is lost_beyond_files
    assert value.stages_manifests is (kind is not Kind.UPSERT_REVISION and kind is not Kind.NOTHING)  # D16


def test_a_table_is_changes_by_key_when_it_carries_their_counts() -> None:
    (rows,) = write("ns.t").tables
    (changes,) = upsert_write().tables
    assert Kind.of_table(rows) is Kind.APPEND and Kind.of_table(changes) is Kind.UPSERT


def test_a_revision_shows_the_write_it_replaces_only_where_that_write_made_a_snapshot() -> None:
    replaced = ReplacedWrite(
        write_id="w0",
        pre_commit=write(),
        committed={"ns.a": "123", "ns.b": "empty"},
        table_uuids=None,
        revision=0,
        committed_at=AT,
    )
    kind = WriteKind(Kind.REVISION, replaced)
    assert (kind.shows_replaced("ns.a"), kind.shows_replaced("ns.b"), kind.shows_replaced("ns.c")) == (
        True,
        False,
        False,
    )
    assert not WriteKind(Kind.APPEND).shows_replaced("ns.a")
