"""The rules of core/decisions.py, case by case: every row state against every input.

These are pure functions, so the table below is the whole of each rule; the coordinator's tests show
the same rules carried out against real stores and sinks.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from datetime import UTC, datetime

import pytest

from airflow_provider_exactly_once.core.decisions import (
    Action,
    Decision,
    EpochLookups,
    WriteLookups,
    abort_decision,
    commit_decision,
    commits_in_batch,
    files_lost_refusal,
    persist_decision,
    recovery_decision,
    recreated_tables,
)
from airflow_provider_exactly_once.core.epochs import AbortCause, CheckpointStatus, EpochStatus
from airflow_provider_exactly_once.core.errors import (
    AbortRefused,
    CheckpointFailed,
    CheckpointNotReady,
    EpochAborted,
    RevisionInProgress,
    SinkReused,
)
from airflow_provider_exactly_once.core.ports import EpochRecord, ReplacedWrite
from airflow_provider_exactly_once.core.precommit import PreCommit, TableWrite
from airflow_provider_exactly_once.core.upserts import ChangeCounts

SINK, EPOCH = "orders", 1_717_200_000_000
AT = datetime(2024, 6, 1, tzinfo=UTC)
DECIDED = datetime(2024, 6, 1, 1, tzinfo=UTC)


def write(*tables: str) -> PreCommit:
    write_id = str(uuid.uuid4())
    return PreCommit(
        sink_id=SINK,
        epoch=EPOCH,
        write_id=write_id,
        tables=[TableWrite(table=t, location=f"/lake/{t}/_eo/{write_id}") for t in tables or ("db.t",)],
    )


def row(
    status: EpochStatus, pre: PreCommit | None = None, *, decided: bool = False, uuids: dict[str, str] | None = None
) -> EpochRecord:
    pre = pre or write()
    return EpochRecord(
        sink_id=SINK,
        epoch=EPOCH,
        status=status,
        write_id=pre.write_id,
        pre_commit=pre,
        run_id="scheduled__2024-06-01",
        try_number=1,
        created_at=AT,
        updated_at=AT,
        commit_decided_at=DECIDED if decided else None,
        committed=None,
        error=None,
        dag_id="orders_hourly",
        table_uuids=uuids,
    )


def checkpoint(status: CheckpointStatus | None) -> Callable[[], CheckpointStatus]:
    """A checkpoint lookup; ``None`` means the rule must not ask it (a decided or settled epoch)."""

    def ask() -> CheckpointStatus:
        if status is None:
            raise AssertionError("the rule asked the checkpoint, which it must not for this row")
        return status

    return ask


def answer(name: str, value: object) -> Callable[[], object]:
    """A lookup answering ``value``; ``None`` means the rule must not ask it for this row."""

    def ask() -> object:
        if value is None:
            raise AssertionError(f"the rule asked {name}, which it must not for this row")
        return value

    return ask


#: ``abort_decision``'s question whether a revision replaced the write, for rows it must not be asked of.
never = answer("whether a revision replaced the write", None)


def asks(
    *,
    identities: Mapping[str, str] | None = None,
    discarded: bool | None = None,
    replaced: bool | None = None,
    committed: Iterable[EpochRecord] | None = None,
) -> WriteLookups:
    """Persist's lookups; one left ``None`` must not be asked for this row."""
    return WriteLookups(
        identities=answer("the tables' identities", identities),  # type: ignore[arg-type]
        discarded=answer("whether the write was discarded", discarded),  # type: ignore[arg-type]
        replaced=answer("whether a revision replaced the write", replaced),  # type: ignore[arg-type]
        committed=answer("the sink's Committed epochs", committed),  # type: ignore[arg-type]
    )


def lookups(
    status: CheckpointStatus | None,
    *,
    pending: Iterable[int] | None = None,
    committed: Iterable[EpochRecord] | None = None,
) -> EpochLookups:
    """The commit's lookups; one left ``None`` must not be asked for this row."""
    return EpochLookups(
        checkpoint=checkpoint(status),
        pending=answer("the sink's Pending epochs", pending),  # type: ignore[arg-type]
        committed=answer("the sink's Committed epochs", committed),  # type: ignore[arg-type]
    )


PENDING, COMMITTED, ABORTED = EpochStatus.PENDING, EpochStatus.COMMITTED, EpochStatus.ABORTED
DONE, WAITING, FAILED = CheckpointStatus.COMPLETED, CheckpointStatus.PENDING, CheckpointStatus.FAILED


# -- persist ----------------------------------------------------------------------------------------


def test_persist_of_a_new_epoch_inserts_and_a_repeat_keeps() -> None:
    pre = write()
    assert persist_decision(None, pre, asks()).action is Action.INSERT
    assert persist_decision(row(PENDING, pre), pre, asks()).action is Action.KEEP
    assert persist_decision(row(COMMITTED, pre), pre, asks()).action is Action.ALREADY_COMMITTED


def test_persist_of_an_aborted_write_again_is_refused() -> None:
    pre = write()
    decision = persist_decision(row(ABORTED, pre), pre, asks())
    assert decision.action is Action.REFUSE and isinstance(decision.error, EpochAborted)
    with pytest.raises(EpochAborted, match="run the write again"):
        decision.raise_if_refused()


@pytest.mark.parametrize(
    ("status", "decided", "expected"),
    [
        (PENDING, False, Action.REPLACE),
        (ABORTED, False, Action.REPLACE),  # an aborted epoch is re-opened by a new write
        (PENDING, True, Action.DISCARD_UNDER_COMMIT),  # a decided commit is never overtaken
    ],
)
def test_persist_of_another_write(status: EpochStatus, decided: bool, expected: Action) -> None:
    decision = persist_decision(row(status, decided=decided), write(), asks(discarded=False))
    assert decision.action is expected and decision.error is None


def test_persist_of_another_write_for_a_committed_epoch() -> None:
    committed = row(COMMITTED, write("db.t"), uuids={"db.t": "uuid-1"})
    same_table = persist_decision(committed, write("db.t"), asks(identities={"db.t": "uuid-1"}))
    assert same_table.action is Action.DISCARD_LATE

    recreated = persist_decision(committed, write("db.t"), asks(identities={"db.t": "uuid-2"}, discarded=False))
    assert recreated.action is Action.REOPEN and "uuid-1" in recreated.why and "uuid-2" in recreated.why

    other_tables = persist_decision(committed, write("db.other"), asks())
    assert other_tables.action is Action.DISCARD_OTHER_TABLES
    assert isinstance(other_tables.error, SinkReused) and "db.other" in str(other_tables.error)
    # the files are removed first, so the refusal is raised by the coordinator afterwards, not here
    assert other_tables.raise_if_refused() is other_tables


def test_a_commit_from_before_identities_were_recorded_stands() -> None:
    assert recreated_tables(row(COMMITTED, uuids=None), {"db.t": "anything"}) is None
    assert recreated_tables(row(COMMITTED, uuids={"db.t": "a"}), {}) is None


# -- commit -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "decided", "checkpoint_status", "expected", "error"),
    [
        (COMMITTED, False, None, Action.ALREADY_COMMITTED, None),
        (ABORTED, False, None, Action.REFUSE, EpochAborted),
        (PENDING, True, None, Action.COMMIT_DECIDED, None),
        (PENDING, False, DONE, Action.DECIDE_AND_COMMIT, None),
        (PENDING, False, WAITING, Action.REFUSE, CheckpointNotReady),
        (PENDING, False, FAILED, Action.REFUSE, CheckpointFailed),
    ],
)
def test_commit(
    status: EpochStatus,
    decided: bool,
    checkpoint_status: CheckpointStatus | None,
    expected: Action,
    error: type[Exception] | None,
) -> None:
    decision = commit_decision(row(status, decided=decided), lookups(checkpoint_status))
    assert decision.action is expected
    assert (type(decision.error) if decision.error else None) is error


# -- abort ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "decided", "force", "files_lost", "checkpoint_status", "expected", "refusal", "cause"),
    [
        (COMMITTED, False, False, False, None, Action.ALREADY_COMMITTED, None, None),
        (COMMITTED, False, True, True, None, Action.ALREADY_COMMITTED, None, None),  # nothing overrides a commit
        (ABORTED, False, False, False, None, Action.ALREADY_ABORTED, None, None),
        (PENDING, True, False, False, None, Action.REFUSE, "was decided", None),
        (PENDING, True, True, False, None, Action.REFUSE, "files-lost", None),  # force does not beat a decision
        (PENDING, True, False, True, None, Action.GIVE_UP_LOST_FILES, None, AbortCause.FILES_LOST),
        (PENDING, False, False, False, DONE, Action.REFUSE, "must be committed", None),
        (PENDING, False, True, False, None, Action.ABORT, None, AbortCause.FORCED),
        (PENDING, False, False, False, FAILED, Action.ABORT, None, AbortCause.CHECKPOINT_FAILED),
        (PENDING, False, False, False, WAITING, Action.ABORT, None, AbortCause.GIVEN_UP),
    ],
)
def test_abort_of_the_epochs_write(
    status: EpochStatus,
    decided: bool,
    force: bool,
    files_lost: bool,
    checkpoint_status: CheckpointStatus | None,
    expected: Action,
    refusal: str | None,
    cause: AbortCause | None,
) -> None:
    decision = abort_decision(
        row(status, decided=decided),
        None,
        checkpoint(checkpoint_status),
        replaced=never,
        force=force,
        files_lost=files_lost,
    )
    assert decision.action is expected and decision.cause is cause
    if refusal is None:
        assert decision.error is None
    else:
        assert isinstance(decision.error, AbortRefused) and refusal in str(decision.error)


def test_abort_of_a_write_that_is_not_the_epochs() -> None:
    own = write()
    assert abort_decision(None, None, checkpoint(None), replaced=never).action is Action.RECORD_NO_WRITE
    assert abort_decision(None, own, checkpoint(None), replaced=never).action is Action.TOMBSTONE
    for status in (PENDING, COMMITTED, ABORTED):
        for decided in (False, True):
            decision = abort_decision(row(status, decided=decided), own, checkpoint(None), replaced=never)
            assert decision.action is Action.REMOVE_OTHER_WRITE


def test_giving_up_lost_files_is_refused_while_partly_visible_or_nothing_is_lost() -> None:
    pending = row(PENDING, write("db.a", "db.b"), decided=True)
    partly = files_lost_refusal(pending, ["db.a"], [])
    assert isinstance(partly, AbortRefused) and "partly visible" in str(partly)
    whole = files_lost_refusal(pending, [], [])
    assert isinstance(whole, AbortRefused) and "nothing is lost" in str(whole)
    assert files_lost_refusal(pending, [], ["/lake/db.a/_eo/x/part-0.parquet"]) is None


# -- recovery ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("decided", "checkpoint_status", "expected"),
    [
        (True, None, Action.COMMIT_DECIDED),
        (False, DONE, Action.DECIDE_AND_COMMIT),
        (False, FAILED, Action.ABORT),
        (False, WAITING, Action.WAIT),
    ],
)
def test_recovery(decided: bool, checkpoint_status: CheckpointStatus | None, expected: Action) -> None:
    assert recovery_decision(row(PENDING, decided=decided), lookups(checkpoint_status)).action is expected


def test_a_decision_is_a_value() -> None:
    decided = row(PENDING, decided=True)
    first = commit_decision(decided, lookups(None))
    assert first == commit_decision(replace(decided), lookups(None))
    assert first == Decision(Action.COMMIT_DECIDED, why=f"commit decided at {DECIDED.isoformat()}")


# -- generations and revisions ----------------------------------------------------------------------

OLD, NEW = "2024-06-01T01:00:00.000000Z/0000000000", "2024-06-02T09:30:00.000000Z/0000000001"


def of_generation(generation: str | None, *tables: str) -> PreCommit:
    return write(*tables).model_copy(update={"generation": generation})


@pytest.mark.parametrize(
    ("row_generation", "write_generation", "on_reprocess", "expected"),
    [
        (OLD, NEW, "replace", Action.REVISE),
        (None, NEW, "replace", Action.REVISE),  # a row from before generations were recorded
        (OLD, NEW, "keep", Action.DISCARD_KEPT),
        (OLD, OLD, "replace", Action.DISCARD_LATE),  # a retry inside the generation
        (NEW, OLD, "replace", Action.DISCARD_LATE),  # a zombie of a run since cleared
        (OLD, None, "replace", Action.DISCARD_LATE),  # outside Airflow a write never replaces one
    ],
)
def test_a_write_for_a_committed_epoch(
    row_generation: str | None, write_generation: str | None, on_reprocess: str, expected: Action
) -> None:
    committed = row(COMMITTED, of_generation(row_generation), uuids={"db.t": "u"})
    decision = persist_decision(
        committed,
        of_generation(write_generation),
        asks(identities={"db.t": "u"}, discarded=False),
        on_reprocess=on_reprocess,  # type: ignore[arg-type]
    )
    assert decision.action is expected and decision.error is None


@pytest.mark.parametrize(
    ("status", "decided", "row_generation", "write_generation", "expected"),
    [
        (PENDING, False, NEW, OLD, Action.DISCARD_OLDER),  # a zombie never takes a newer generation's epoch
        (ABORTED, False, NEW, OLD, Action.DISCARD_OLDER),
        (PENDING, False, OLD, NEW, Action.REPLACE),
        (PENDING, False, OLD, OLD, Action.REPLACE),  # a retry inside the generation, as before
        (PENDING, True, OLD, OLD, Action.DISCARD_UNDER_COMMIT),
    ],
)
def test_a_write_for_an_open_epoch(
    status: EpochStatus, decided: bool, row_generation: str, write_generation: str, expected: Action
) -> None:
    decision = persist_decision(
        row(status, of_generation(row_generation), decided=decided),
        of_generation(write_generation),
        asks(discarded=False),
    )
    assert decision.action is expected


def test_a_newer_generation_waits_for_a_decided_commit_then_replaces_it() -> None:
    decision = persist_decision(row(PENDING, of_generation(OLD), decided=True), of_generation(NEW), asks())
    assert decision.action is Action.REFUSE and isinstance(decision.error, RevisionInProgress)
    assert decision.error.retryable


def test_a_revision_is_given_up_by_restoring_what_it_replaces() -> None:
    committed = row(COMMITTED, of_generation(OLD))
    revision = replace(
        row(PENDING, of_generation(NEW)),
        revision=1,
        replaces=ReplacedWrite(
            write_id=committed.write_id,
            pre_commit=committed.pre_commit,
            committed={"db.t": "1"},
            table_uuids=None,
            revision=0,
            committed_at=AT,
        ),
    )
    assert abort_decision(revision, None, checkpoint(FAILED), replaced=never).action is Action.ABORT_REVISION
    assert abort_decision(revision, None, checkpoint(None), replaced=never, force=True).action is Action.ABORT_REVISION
    assert recovery_decision(revision, lookups(FAILED)).action is Action.ABORT_REVISION
    assert recovery_decision(revision, lookups(DONE)).action is Action.DECIDE_AND_COMMIT


# -- recovery's batches -------------------------------------------------------------------------------


def test_only_plain_appends_to_commit_join_a_batch() -> None:
    plain = row(PENDING)
    assert commits_in_batch(plain, recovery_decision(plain, lookups(DONE)))
    decided = row(PENDING, decided=True)
    assert commits_in_batch(decided, recovery_decision(decided, lookups(None)))
    assert not commits_in_batch(plain, recovery_decision(plain, lookups(WAITING)))
    assert not commits_in_batch(plain, recovery_decision(plain, lookups(FAILED)))

    upsert_write = write()
    upsert_write = upsert_write.model_copy(
        update={"tables": [upsert_write.tables[0].model_copy(update={"changes": ChangeCounts(inserted=1)})]}
    )
    upsert = row(PENDING, upsert_write)
    assert not commits_in_batch(upsert, recovery_decision(upsert, lookups(DONE, pending=[])))

    committed = row(COMMITTED, of_generation(OLD))
    replaced = ReplacedWrite(committed.write_id, committed.pre_commit, {"db.t": "1"}, None, 0, AT)
    revision = replace(row(PENDING, of_generation(NEW)), revision=1, replaces=replaced)
    assert not commits_in_batch(revision, recovery_decision(revision, lookups(DONE)))


# -- a write a revision replaced (issue 31) ---------------------------------------------------------


def revised(pending: bool) -> tuple[EpochRecord, PreCommit]:
    """Epoch revised once: its row (the revision Pending, or Committed) and the write it replaced."""
    first = of_generation(OLD)
    replaced = ReplacedWrite(first.write_id, first, {"db.t": "1"}, None, 0, AT)
    if pending:
        return replace(row(PENDING, of_generation(NEW)), revision=1, replaces=replaced), first
    return replace(row(COMMITTED, of_generation(NEW)), revision=1), first


@pytest.mark.parametrize("pending", [True, False])
def test_a_late_persist_of_a_replaced_write_is_settled_and_queues_nothing(pending: bool) -> None:
    epoch, first = revised(pending)
    # the Pending revision's row names what it replaces; a committed one is in the store's record
    decision = persist_decision(epoch, first, asks() if pending else asks(replaced=True), on_reprocess="replace")
    assert decision == Decision(Action.ALREADY_REPLACED, why=decision.why) and epoch.write_id in decision.why
    # so is its run's late abort: its files wait for snapshot expiry, not for this abort
    replaced = never if pending else answer("whether a revision replaced the write", True)
    aborted = abort_decision(epoch, first, checkpoint(None), replaced=replaced)  # type: ignore[arg-type]
    assert aborted.action is Action.ALREADY_REPLACED and aborted.error is None


def test_a_write_the_store_does_not_hold_as_replaced_is_late_as_before() -> None:
    epoch, _ = revised(pending=False)
    late = persist_decision(epoch, of_generation(OLD), asks(identities={}, replaced=False), on_reprocess="replace")
    assert late.action is Action.DISCARD_LATE
    never_revised = row(COMMITTED, of_generation(NEW))  # revision 0: the store is not asked
    assert persist_decision(never_revised, of_generation(OLD), asks(identities={})).action is Action.DISCARD_LATE
    not_replaced = answer("whether a revision replaced the write", False)
    other = abort_decision(epoch, of_generation(OLD), checkpoint(None), replaced=not_replaced)  # type: ignore[arg-type]
    assert other.action is Action.REMOVE_OTHER_WRITE


@pytest.mark.parametrize(
    ("epoch", "on_reprocess", "identities"),
    [
        (row(PENDING, of_generation(OLD)), "keep", None),  # would replace the undecided write
        (row(ABORTED, of_generation(OLD)), "keep", None),  # would re-open the aborted epoch
        (row(COMMITTED, of_generation(OLD), uuids={"db.t": "a"}), "keep", {"db.t": "b"}),  # would re-open
        (row(COMMITTED, of_generation(OLD)), "replace", {}),  # would open a revision
    ],
)
def test_a_discarded_write_never_becomes_the_epochs(
    epoch: EpochRecord, on_reprocess: str, identities: dict[str, str] | None
) -> None:
    decision = persist_decision(
        epoch,
        of_generation(NEW),
        asks(identities=identities, discarded=True),
        on_reprocess=on_reprocess,  # type: ignore[arg-type]
    )
    assert decision.action is Action.REFUSE and isinstance(decision.error, EpochAborted)
    assert "was discarded" in str(decision.error)
