"""What an epoch says of a failed task (design.md D22): its error bounded and masked, the step
named with its try, and our own refusals read as refusals."""

from __future__ import annotations

from datetime import UTC, datetime

from airflow_provider_exactly_once.core.epochs import (
    CAUSE_CHARS,
    Actor,
    ActorKind,
    EpochEvent,
    HistoryEntry,
    failed_step,
    failure_reason,
    run_failure,
)

AT = datetime(2026, 1, 1, tzinfo=UTC)


def entry(event: EpochEvent, task: str, try_number: int, reason: str, run_id: str = "scheduled__1") -> HistoryEntry:
    actor = Actor(ActorKind.TASK, name=f"d.{task}", dag_id="d", run_id=run_id, try_number=try_number)
    return HistoryEntry(1, "s", 1, event, "w", None, None, AT, actor, reason)


def test_a_failure_keeps_its_first_lines_masked_and_bounded() -> None:
    message = "connect to postgresql://eo:s3cret@db/meta failed\n\n  at line 2\nline 3\nline 4\nline 5\nline 6\x1b[2J"
    reason = failure_reason("OperationalError", message)
    assert (
        reason == "OperationalError: connect to postgresql://eo:***@db/meta failed\n  at line 2\nline 3\nline 4\nline 5"
    )
    assert len(failure_reason("ValueError", "x" * 10_000)) == CAUSE_CHARS
    assert "\x1b" not in failure_reason("ValueError", "a\x1b]0;pwned\x07")


def test_a_failed_step_names_the_task_its_try_and_whether_it_was_refused() -> None:
    cast = "SparkArithmeticException: [CAST_OVERFLOW] The value 1.0E32D cannot be cast to BIGINT"
    assert failed_step(entry(EpochEvent.ERROR, "eo.write", 2, cast)) == f"write failed on try 2: {cast}"
    assert failed_step(entry(EpochEvent.TRY_FAILED, "eo.write", 1, cast)) == f"write failed on try 1, retried: {cast}"
    refused = "InputRangeRefused: its range went to epoch 5; leave this epoch aborted"
    assert failed_step(entry(EpochEvent.ERROR, "eo.write", 1, refused)) == f"write was refused on try 1: {refused}"
    waits = "EarlierEpochUndecided: epoch 4 is not committed or aborted yet"
    assert failed_step(entry(EpochEvent.ERROR, "eo.write", 3, waits)) == f"write must wait on try 3: {waits}"
    assert failed_step(entry(EpochEvent.ABORTED, "eo.abort", 1, "given up")) is None


def test_an_abort_names_the_newest_failure_for_good_of_its_own_run() -> None:
    events = [
        entry(EpochEvent.ERROR, "eo.write", 1, "ValueError: yesterday's", run_id="scheduled__0"),
        entry(EpochEvent.TRY_FAILED, "eo.write", 1, "ValueError: first try"),
        entry(EpochEvent.ERROR, "eo.write", 2, "ValueError: second try"),
        entry(EpochEvent.ERROR, "eo.commit", 1, "SinkUnavailable: down"),
    ]
    assert run_failure(events, "scheduled__1", {"eo.write"}) == "write failed on try 2: ValueError: second try"
    assert run_failure(events, "scheduled__1") == "commit failed on try 1: SinkUnavailable: down"
    assert run_failure(events[:2], "scheduled__1", {"eo.write"}) is None  # the last try has not said why yet
