"""How the run that committed an epoch came about, for what a downstream consumer reads of a commit.

A downstream DAG or lineage consumer wants to know why an epoch was written (scheduled, manual,
backfill, cleared again, by whom) without querying Airflow's database: the asset events and the
OpenLineage run facet carry this one record, read once from the task's context; recovery names
itself as the committer. It also names the acting task in the epochs' history (``task_actor``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict

from airflow_provider_exactly_once.core.epochs import Actor, ActorKind

#: Who made a commit visible: the epoch's own commit task, or the recovery DAG.
COMMIT_TASK = "commit task"
RECOVERY = "recovery"


class RunOrigin(BaseModel):
    """The committing run as Airflow recorded it (``None`` where this Airflow version has no field);
    the asset events and the lineage facet carry it as ``model_dump(mode="json")``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    committed_by: str
    #: Airflow's ``DagRunType``: ``scheduled``, ``manual``, ``backfill``, ``asset_triggered``...
    run_type: str | None = None
    #: How often the run was cleared before this try (0: never).
    clear_number: int = 0
    triggering_user: str | None = None
    try_number: int | None = None

    @classmethod
    def of(cls, context: Mapping[str, Any], *, committed_by: str = COMMIT_TASK) -> RunOrigin:
        if committed_by == RECOVERY:
            return cls(committed_by=RECOVERY)
        dag_run = context.get("dag_run")
        run_type = getattr(dag_run, "run_type", None)
        ti = context.get("ti")
        try_number = getattr(ti, "try_number", None)
        return cls(
            committed_by=committed_by,
            run_type=None if run_type is None else str(getattr(run_type, "value", run_type)),
            clear_number=int(getattr(dag_run, "clear_number", 0) or 0),
            triggering_user=getattr(dag_run, "triggering_user_name", None),
            try_number=None if try_number is None else int(try_number),
        )


def task_actor(context: Mapping[str, Any], kind: ActorKind = ActorKind.TASK) -> Actor:
    """The task instance of ``context`` as the history names it: ``dag_id.task_id``, its run, try,
    and how the run was started."""
    ti = context.get("ti")
    origin = RunOrigin.of(context)
    dag_id, task_id = getattr(ti, "dag_id", None), getattr(ti, "task_id", None)
    return Actor(
        kind,
        name=None if task_id is None else f"{dag_id}.{task_id}",
        dag_id=dag_id,
        run_id=getattr(ti, "run_id", None),
        try_number=origin.try_number,
        run_type=origin.run_type,
        clear_number=origin.clear_number,
    )
