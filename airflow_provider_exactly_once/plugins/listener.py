"""``on_starting``: queue a run of the recovery DAG when a scheduler starts, never crash it.

The trap: Airflow 3.3 calls ``on_starting`` from ``Job.__init__``, before the runner sets
``job.job_type``, so the scheduler, triggerer and DAG processor all pass an untyped ``Job``; an
untyped one counts as a scheduler only when the scheduler's own code is constructing it (on the call
stack). The run is created with ``trigger_dag``, never while one is queued or running, with a run id
fixed per minute, so two schedulers starting together create one. Why: docs/deployment.md.
"""

from __future__ import annotations

import logging
import sys
from datetime import UTC, datetime
from typing import Any

from airflow.listeners import hookimpl

log = logging.getLogger(__name__)

SCHEDULER_JOB_TYPE = "SchedulerJob"
#: Modules whose frames on the stack mean "the scheduler is constructing this Job".
_SCHEDULER_MODULES = frozenset({"airflow.cli.commands.scheduler_command", "airflow.jobs.scheduler_job_runner"})
_STACK_DEPTH = 40
RUN_ID_PREFIX = "scheduler_start__"


def is_scheduler(component: object) -> bool:
    """Whether ``component`` (what ``on_starting`` receives) is a starting scheduler."""
    if getattr(component, "job_type", None) == SCHEDULER_JOB_TYPE:
        return True  # a SchedulerJobRunner, or its Job once typed
    cls = type(component)
    if cls.__name__ == "Job" and cls.__module__ == "airflow.jobs.job" and getattr(component, "job_type", None) is None:
        return _scheduler_on_stack()
    return False


def _scheduler_on_stack() -> bool:
    frame = sys._getframe(1)
    for _ in range(_STACK_DEPTH):
        if frame.f_globals.get("__name__") in _SCHEDULER_MODULES:
            return True
        if frame.f_back is None:
            return False
        frame = frame.f_back
    return False


def trigger_recovery(dag_id: str, *, now: datetime | None = None) -> str | None:
    """Queue a run of ``dag_id`` unless one is queued or running; the new run's id, or ``None``."""
    from airflow.api.common.trigger_dag import trigger_dag
    from airflow.exceptions import DagNotFound, DagRunAlreadyExists
    from airflow.models.dag import DagModel
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session
    from airflow.utils.state import DagRunState
    from airflow.utils.types import DagRunTriggeredByType
    from sqlalchemy import func, select

    from airflow_provider_exactly_once.version_compat import AIRFLOW_V_3_2_PLUS

    with create_session() as session:
        active = session.scalar(
            select(func.count())
            .select_from(DagRun)
            .where(DagRun.dag_id == dag_id, DagRun.state.in_([DagRunState.QUEUED, DagRunState.RUNNING]))
        )
        if active:
            log.info("Recovery DAG %r already has %d queued or running run(s): none added", dag_id, active)
            return None
        paused = session.scalar(select(DagModel.is_paused).where(DagModel.dag_id == dag_id))
    started = (now or datetime.now(UTC)).replace(second=0, microsecond=0)
    run_id = f"{RUN_ID_PREFIX}{started.isoformat()}"
    try:
        # The CLI trigger type: the run comes from the `airflow scheduler` command starting.
        # A run note is 3.2's; before, the run id alone says where the run came from.
        note: dict[str, Any] = (
            {"note": "queued by the exactly-once plugin when the scheduler started"} if AIRFLOW_V_3_2_PLUS else {}
        )
        trigger_dag(dag_id, run_id=run_id, triggered_by=DagRunTriggeredByType.CLI, **note)
    except DagNotFound:
        log.warning(
            "Recovery DAG %r is not parsed yet (add dags/exactly_once_recovery.py to a DAG bundle): no run queued; "
            "its schedule starts it once the DAG processor has parsed it",
            dag_id,
        )
        return None
    except DagRunAlreadyExists:
        log.info("Recovery run %r of %r exists already (another scheduler started this minute)", run_id, dag_id)
        return None
    if paused:
        log.warning("Recovery DAG %r is paused: its run %r waits until it is unpaused", dag_id, run_id)
    log.info("Queued recovery run %r of %r at scheduler start", run_id, dag_id)
    return run_id


class RecoveryOnSchedulerStart:
    """The plugin's listener object (pluggy calls its ``hookimpl`` methods)."""

    @hookimpl
    def on_starting(self, component: Any) -> None:
        try:
            if not is_scheduler(component):
                return
            from airflow.configuration import conf

            from airflow_provider_exactly_once.defaults import CONFIG_SECTION

            section = CONFIG_SECTION
            if not conf.getboolean(section, "trigger_recovery_on_scheduler_start", fallback=True):
                log.info("[%s] trigger_recovery_on_scheduler_start is off: no recovery run queued", section)
                return
            dag_id = conf.get(section, "recovery_dag_id", fallback="exactly_once_recovery")
            trigger_recovery(dag_id)
        except Exception:
            # The scheduler must start whatever happens here; the schedule still runs recovery.
            log.exception("Could not queue the exactly-once recovery DAG at scheduler start; continuing")
