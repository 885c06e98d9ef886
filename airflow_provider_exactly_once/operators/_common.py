"""What every operator of the package does the same way: map errors, read the write, find the epoch."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from airflow_provider_exactly_once.core.errors import ExactlyOnceError, InvalidSinkConfig
from airflow_provider_exactly_once.upstream_private import executor_safeguard_tracker
from airflow_provider_exactly_once.version_compat import AirflowFailException

if TYPE_CHECKING:
    from airflow.sdk import BaseOperator

    from airflow_provider_exactly_once.core.precommit import PreCommit


@contextmanager
def airflow_errors() -> Iterator[None]:
    """Turn a refusal into a failure Airflow does not retry, and let transient faults be retried.

    ``ExactlyOnceError.retryable`` says whether running the same step again may succeed without
    anyone changing anything; retrying a refusal (a conflict, an aborted epoch, a failed
    checkpoint) only delays the failure a person has to look at.
    """
    try:
        yield
    except ExactlyOnceError as exc:
        if exc.retryable:
            raise
        raise AirflowFailException(f"{type(exc).__name__}: {exc}") from exc


def execute_nested(operator: BaseOperator, context: Any) -> Any:
    """Run another operator's ``execute`` inside this task, as its own task would.

    Airflow's SDK warns whenever an operator's ``execute`` is called by anything but its task runner,
    to catch DAG authors calling operators by hand; here it is the design (the write runs the Spark
    provider's operator, a rewrite runs the write), so the warning would only be noise in every
    epoch's log. Where the SDK keeps its guard in a context variable, the inner operator is marked as
    the one being run (``upstream_private.executor_safeguard_tracker``); elsewhere the call is made
    plainly and the warning stays.
    """
    tracker = executor_safeguard_tracker()
    if tracker is None:  # pragma: no cover - an SDK that guards differently
        return operator.execute(context)
    token = tracker.set(operator)
    try:
        return operator.execute(context)
    finally:
        tracker.reset(token)


def pull_pre_commit(context: Mapping[str, Any], write_task_id: str) -> object | None:
    """The write task's return value in this run (dict, JSON or compressed text), or ``None``."""
    value: object = context["ti"].xcom_pull(task_ids=write_task_id)
    return value


def check_write_matches(pre: PreCommit, sink_id: str, epoch: int, task_id: str) -> None:
    """A write for another sink or epoch than the run's is a wiring bug: persisting it would file
    data under the wrong epoch, which no later step could detect."""
    if pre.sink_id != sink_id:
        raise InvalidSinkConfig(
            f"task {task_id}: the write is for sink {pre.sink_id!r}, this task's sink is {sink_id!r}"
        )
    if pre.epoch != epoch:
        raise InvalidSinkConfig(
            f"task {task_id}: the write is for epoch {pre.epoch}, but this run's epoch is {epoch}; "
            "derive the write's epoch with epoch_for_context so every task of the run agrees"
        )


def try_number(context: Mapping[str, Any]) -> int | None:
    number = getattr(context.get("ti"), "try_number", None)
    return number if isinstance(number, int) else None


def parse_pre_commit(value: Any) -> PreCommit:
    """``PreCommit.parse``, importing the pre-commit models only when a task runs: DAG files import
    the operators at every parse and never need them."""
    from airflow_provider_exactly_once.core.precommit import PreCommit

    return PreCommit.parse(value)
