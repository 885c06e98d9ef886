"""The checkpoint table: the store's ``checkpoints`` companion (design.md section 7).

The upstream, or an operator at the end of the upstream's DAG, writes an epoch's final word here;
``checkpoints.metastore.MetaStoreCheckpointSource`` reads it. Apart from the port because the
coordinator never writes checkpoints: only the marking operator and the tests do.
"""

from __future__ import annotations

import functools

from sqlalchemy import Select, bindparam, insert, select, update
from sqlalchemy.exc import IntegrityError

from airflow_provider_exactly_once.core.errors import StateConflict
from airflow_provider_exactly_once.core.identifiers import check_epoch
from airflow_provider_exactly_once.core.status import CheckpointStatus
from airflow_provider_exactly_once.store import arguments, rows
from airflow_provider_exactly_once.store.database import MetaStoreDatabase
from airflow_provider_exactly_once.store.models import CheckpointState, InputRange, db_now

_CHECKPOINT_ATTEMPTS = 5


class SqlCheckpointTable:
    """``checkpoints.metastore.CheckpointTable`` on the meta store's ``checkpoint_state`` table."""

    def __init__(self, db: MetaStoreDatabase) -> None:
        self._db = db

    def __repr__(self) -> str:
        return f"SqlCheckpointTable({self._db.url_for_display!r})"

    def range_reserved(self, sink_id: str, epoch: int) -> bool:
        """Whether the epoch's snapshot range is reserved: an incremental input's checkpoint
        (``checkpoints.snapshot_ranges``), kept in ``input_range``."""
        with self._db.transaction(f"reading the input range of sink {sink_id!r} epoch {epoch}", write=False) as session:
            return session.get(InputRange, (sink_id, epoch)) is not None

    def set_checkpoint(self, name: str, epoch: int, status: CheckpointStatus, detail: str | None = None) -> None:
        """Record the upstream's word; COMPLETED and FAILED are final (see ``CheckpointStatus``)."""
        name, epoch = arguments.checkpoint_name(name), check_epoch(epoch)
        status = arguments.checkpoint_status(status)
        if detail is not None:
            detail = arguments.text(detail, "checkpoint detail")
        action = f"setting checkpoint {name!r} epoch {epoch} to {status}"
        for attempt in range(_CHECKPOINT_ATTEMPTS):
            try:
                with self._db.transaction(action, write=True) as session:
                    statement = (
                        update(CheckpointState)
                        .where(
                            CheckpointState.name == name,
                            CheckpointState.epoch == epoch,
                            CheckpointState.status == CheckpointStatus.PENDING.value,
                        )
                        .values(status=status.value, detail=detail, updated_at=db_now())
                        .execution_options(synchronize_session=False)
                    )
                    if rows.rowcount(session, statement) == 1:
                        return
                    current = session.scalar(
                        select(CheckpointState.status).where(
                            CheckpointState.name == name, CheckpointState.epoch == epoch
                        )
                    )
                    if current is None:
                        session.execute(
                            insert(CheckpointState).values(
                                name=name,
                                epoch=epoch,
                                status=status.value,
                                detail=detail,
                                updated_at=db_now(),
                            )
                        )
                        return
                    if current == status.value:
                        return  # the same final word again
                    raise StateConflict(
                        f"checkpoint {name!r} epoch {epoch} is {current}, which is final: cannot set it to {status}"
                    )
            except IntegrityError:
                # Another writer inserted the row first: look again at what it says.
                if attempt == _CHECKPOINT_ATTEMPTS - 1:
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    def get_checkpoint(self, name: str, epoch: int) -> CheckpointStatus:
        name, epoch = arguments.checkpoint_name(name), check_epoch(epoch)
        with self._db.transaction(f"reading checkpoint {name!r} epoch {epoch}", write=False) as session:
            status = session.scalar(_status_query(), {"c_name": name, "c_epoch": epoch})
        return CheckpointStatus.PENDING if status is None else CheckpointStatus(status)


@functools.cache
def _status_query() -> Select[str]:
    """``get_checkpoint``'s query, built once: a sensor asks it at every poke, a commit once."""
    return select(CheckpointState.status).where(
        CheckpointState.name == bindparam("c_name"), CheckpointState.epoch == bindparam("c_epoch")
    )
