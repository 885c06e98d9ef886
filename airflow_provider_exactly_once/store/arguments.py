"""Checks of what callers hand the store, before any of it reaches SQL.

The columns have lengths and the statuses are enums: a bad argument is refused with the domain's
error (``InvalidPreCommit``, ``InvalidSinkConfig``) naming it, never left to surface as a driver error
that would read as an unavailable database.
"""

from __future__ import annotations

from airflow_provider_exactly_once.core.errors import InvalidPreCommit, InvalidSinkConfig
from airflow_provider_exactly_once.core.status import CheckpointStatus, EpochStatus
from airflow_provider_exactly_once.store.models import (
    CHECKPOINT_NAME_LENGTH,
    DAG_ID_LENGTH,
    LOCK_HOLDER_LENGTH,
    RUN_ID_LENGTH,
)


def epoch_status(status: object) -> EpochStatus:
    try:
        return EpochStatus(str(status))
    except ValueError:
        raise InvalidPreCommit(f"epoch status {status!r} is not one of {[s.value for s in EpochStatus]}") from None


def checkpoint_status(status: object) -> CheckpointStatus:
    try:
        return CheckpointStatus(str(status))
    except ValueError:
        raise InvalidPreCommit(
            f"checkpoint status {status!r} is not one of {[s.value for s in CheckpointStatus]}"
        ) from None


def checkpoint_name(name: object) -> str:
    if not isinstance(name, str) or not name or len(name) > CHECKPOINT_NAME_LENGTH:
        raise InvalidPreCommit(
            f"checkpoint name must be a non-empty string of at most {CHECKPOINT_NAME_LENGTH} characters, got {name!r}"
        )
    return name


def run_id(run_id: object) -> str:
    if not isinstance(run_id, str) or not run_id or len(run_id) > RUN_ID_LENGTH:
        raise InvalidPreCommit(
            f"run_id must be a non-empty string of at most {RUN_ID_LENGTH} characters, got {run_id!r}"
        )
    return run_id


def dag_id(dag_id: object) -> str | None:
    if dag_id is not None and (not isinstance(dag_id, str) or not dag_id or len(dag_id) > DAG_ID_LENGTH):
        raise InvalidPreCommit(
            f"dag_id must be None or a non-empty string of at most {DAG_ID_LENGTH} characters, got {dag_id!r}"
        )
    return dag_id


def check_run(run: object, try_number: object) -> None:
    if run is not None:
        run_id(run)
    if try_number is not None and (isinstance(try_number, bool) or not isinstance(try_number, int) or try_number < 0):
        raise InvalidPreCommit(f"try_number must be a non-negative integer or None, got {try_number!r}")


def lock_holder(holder: object) -> str:
    if not isinstance(holder, str) or not holder or len(holder) > LOCK_HOLDER_LENGTH:
        raise InvalidSinkConfig(
            f"lock holder must be a non-empty string of at most {LOCK_HOLDER_LENGTH} characters, got {holder!r}"
        )
    return holder


def text(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise InvalidPreCommit(f"{what} must be a string, got {type(value).__name__}")
    return value
